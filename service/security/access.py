"""What each RPC asks to do: an `Access` (action, space, types), read from names only.

The table `ACCESS` has one function per method of outrig.v1.Space; a test checks that every
method has one, so a new RPC cannot skip the check. A function reads the request's space name and
its entries' or templates' type names, which protobuf has already decoded; it never looks at field
values, so the cost of working out the resource does not depend on the payload.

Types: a write names the entry's type and each of its supertypes (an entry is visible as each of
them, so writing it needs `write` on all); a read, take, count, contents or notify names each
template's type (a grant on a type covers the subtypes a template of it matches: see
docs/security.md). Renew and cancel name leases, not types, and resuming a notify registration
names the registration: those are checked against the space itself (type None), as are Begin,
Commit (both `renew`: a transaction is a lease of the space) and Abort (`cancel`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

from outrig.service import codec
from outrig.service.config import Limits
from outrig.service.exceptions import InvalidArgumentError
from outrig.v1 import space_pb2 as pb


class Access(NamedTuple):
    """An RPC's request for `action` on outrig://space/type for each of `types` (None: the space).
    A NamedTuple: built on every call, and a frozen dataclass's __init__ costs several times more."""

    action: str
    space: str
    types: tuple[str | None, ...]


_SPACE_ITSELF: tuple[str | None, ...] = (None,)


def _distinct(names: Iterable[str]) -> tuple[str | None, ...]:
    found = tuple(dict.fromkeys(names))
    return found or _SPACE_ITSELF


def _lineage(entry: pb.Entry, where: str, limits: Limits) -> list[str]:
    names = [entry.type_name, *entry.supertypes]
    for i, name in enumerate(names):
        if not name or len(name) > limits.max_name_length:  # the message is only built for an error
            codec.name(name, f"{where}.type_name" if i == 0 else f"{where}.supertypes[{i - 1}]", limits)
    return names


def _entry_types(entries: Iterable[pb.Entry], limits: Limits) -> tuple[str | None, ...]:
    names: list[str] = []
    for i, entry in enumerate(entries):
        names.extend(_lineage(entry, f"entries[{i}]", limits))
    return _distinct(names)


def _template_types(templates: Iterable[pb.Template], limits: Limits) -> tuple[str | None, ...]:
    names = [template.type_name for template in templates]
    for i, name in enumerate(names):
        if not name or len(name) > limits.max_name_length:
            codec.name(name, f"templates[{i}].type_name", limits)
    return _distinct(names)


def _write(received: Any, limits: Limits) -> Access:
    request: pb.WriteRequest = received.message
    space = codec.space_name(request.space, limits)
    if not request.HasField("entry"):
        return Access("write", space, _SPACE_ITSELF)
    return Access("write", space, _distinct(_lineage(request.entry, "entry", limits)))


def _write_many(received: Any, limits: Limits) -> Access:
    request: pb.WriteManyRequest = received.message
    if len(request.entries) > limits.max_batch:
        raise InvalidArgumentError(
            f"entries: {len(request.entries)} entries exceeds the limit max_batch={limits.max_batch}"
        )
    return Access("write", codec.space_name(request.space, limits), _entry_types(request.entries, limits))


def _templates(action: str) -> Callable[[Any, Limits], Access]:
    def access(request: Any, limits: Limits) -> Access:
        if len(request.templates) > limits.max_templates:
            raise InvalidArgumentError(
                f"templates: {len(request.templates)} templates exceeds the limit "
                f"max_templates={limits.max_templates}"
            )
        space = codec.space_name(request.space, limits)
        return Access(action, space, _template_types(request.templates, limits))

    return access


def _notify(request: pb.NotifyRequest, limits: Limits) -> Access:
    if request.HasField("resume"):
        return Access("notify", codec.space_name(request.space, limits), _SPACE_ITSELF)
    return _templates("notify")(request, limits)


def _space_itself(action: str) -> Callable[[Any, Limits], Access]:
    def access(request: Any, limits: Limits) -> Access:
        return Access(action, codec.space_name(request.space, limits), _SPACE_ITSELF)

    return access


ACCESS: dict[str, Callable[[Any, Limits], Access]] = {
    "Write": _write,
    "WriteMany": _write_many,
    "Read": _templates("read"),
    "ReadMany": _templates("read"),
    "Take": _templates("take"),
    "TakeMany": _templates("take"),
    "Contents": _templates("read"),
    "Count": _templates("read"),
    "Notify": _notify,
    "RenewLeases": _space_itself("renew"),
    "CancelLeases": _space_itself("cancel"),
    # A transaction is a lease of the space: beginning and committing one is renewing, aborting
    # it is cancelling. Every operation under it is checked on its own.
    "Begin": _space_itself("renew"),
    "Commit": _space_itself("renew"),
    "Abort": _space_itself("cancel"),
}
