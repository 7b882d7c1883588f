"""What each RPC asks to do: an `Access` (action, space, types), read from names only.

`ACCESS` has one function per method of outrig.v1.Space, made from the method's
`(outrig.v1.access)` option in the proto (outrig._protocol.METHODS): the action it names, and
one rule per kind of resource (`Access.Resource`). The servicer refuses to define a method the
table lacks, so a new RPC cannot skip the check. A function reads the request's space name and
its entries' or templates' type names, which protobuf has already decoded; it never looks at field
values, so the cost of working out the resource does not depend on the payload.

The rules: ENTRIES, a write, names the entry's type and each of its supertypes (an entry is
visible as each of them, so writing it needs `write` on all); TEMPLATES, a read, take, count,
contents or notify, names each template's type (a grant on a type covers the subtypes a template
of it matches: see docs/security.md); SPACE names the space itself (type None): renew and cancel
name leases, not types, as do Begin, Commit (both `renew`: a transaction is a lease of the space)
and Abort (`cancel`), and Locate (`read`). Resuming a notify registration names the registration,
so it too is checked against the space itself. TIER, ListSpaces (`admin`), is about every space of
the tier: it is checked as `outrig://*`, which only a grant whose space part is `*` covers (no
space is named `*`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

from outrig._protocol import METHODS, Method
from outrig.service.config import Limits
from outrig.service.engine.partitions import split_name
from outrig.service.exceptions import InvalidArgumentError
from outrig.service.protocol import codec
from outrig.v1 import space_pb2 as pb


class Access(NamedTuple):
    """An RPC's request for `action` on outrig://space/type for each of `types` (None: the space).
    A NamedTuple: built on every call, and a frozen dataclass's __init__ costs several times more."""

    action: str
    space: str
    types: tuple[str | None, ...]


_SPACE_ITSELF: tuple[str | None, ...] = (None,)


def _space_of(request: Any, limits: Limits) -> str:
    """The space a request's grants are checked on: a partition's ("jobs~3") is its space's."""
    return split_name(codec.space_name(request.space, limits))[0]


def _distinct(names: Iterable[str]) -> tuple[str | None, ...]:
    found = tuple(dict.fromkeys(names))
    return found or _SPACE_ITSELF


def _lineage(entry: pb.Entry, where: str, limits: Limits) -> list[str]:
    names = [entry.type_name, *entry.supertypes]
    for i, name in enumerate(names):
        if not name or len(name) > limits.max_name_length:  # the message is only built for an error
            codec.name(name, f"{where}.type_name" if i == 0 else f"{where}.supertypes[{i - 1}]", limits)
    return names


def _entry_types(entries: Iterable[pb.Entry], where: str, limits: Limits) -> tuple[str | None, ...]:
    names: list[str] = []
    for i, entry in enumerate(entries):
        names.extend(_lineage(entry, f"{where}[{i}]", limits))
    return _distinct(names)


def _template_types(templates: Iterable[pb.Template], where: str, limits: Limits) -> tuple[str | None, ...]:
    names = [template.type_name for template in templates]
    for i, name in enumerate(names):
        if not name or len(name) > limits.max_name_length:
            codec.name(name, f"{where}[{i}].type_name", limits)
    return _distinct(names)


AccessOf = Callable[[Any, Limits], Access]


def _field_of(method: Method, message: Any) -> Any:
    """The field of `method`'s request whose type is `message` (a generated message class)."""
    for field in method.request.DESCRIPTOR.fields:
        if field.message_type is message.DESCRIPTOR:
            return field
    raise AssertionError(
        f"{method.name}: its request has no field of type {message.DESCRIPTOR.full_name}, which "
        "its (outrig.v1.access) resource names"
    )


def _entries(method: Method) -> AccessOf:
    """ENTRIES: the types of the entry (or each of the entries) the request carries. Such a
    request arrives as a `handlers.Received` (service/transport/handlers.py)."""
    action, field = method.action, _field_of(method, pb.Entry)
    name = field.name

    if not field.is_repeated:

        def one(received: Any, limits: Limits) -> Access:
            request = received.message
            space = _space_of(request, limits)
            if not request.HasField(name):
                return Access(action, space, _SPACE_ITSELF)
            return Access(action, space, _distinct(_lineage(getattr(request, name), name, limits)))

        return one

    def many(received: Any, limits: Limits) -> Access:
        request = received.message
        entries = getattr(request, name)
        if len(entries) > limits.max_batch:
            raise InvalidArgumentError(
                f"{name}: {len(entries)} entries exceeds the limit max_batch={limits.max_batch}"
            )
        return Access(action, _space_of(request, limits), _entry_types(entries, name, limits))

    return many


def _templates(method: Method) -> AccessOf:
    """TEMPLATES: the type of each of the request's templates; the space itself for a request
    that resumes a registration by its id (NotifyRequest.resume)."""
    action, name = method.action, _field_of(method, pb.Template).name
    resumes = "resume" in method.request.DESCRIPTOR.fields_by_name

    def access(request: Any, limits: Limits) -> Access:
        if resumes and request.HasField("resume"):
            return Access(action, _space_of(request, limits), _SPACE_ITSELF)
        templates = getattr(request, name)
        if len(templates) > limits.max_templates:
            raise InvalidArgumentError(
                f"{name}: {len(templates)} templates exceeds the limit max_templates={limits.max_templates}"
            )
        space = _space_of(request, limits)
        return Access(action, space, _template_types(templates, name, limits))

    return access


def _space(method: Method) -> AccessOf:
    """SPACE: the space itself."""
    action = method.action

    def access(request: Any, limits: Limits) -> Access:
        return Access(action, _space_of(request, limits), _SPACE_ITSELF)

    return access


#: The space part of the resource of a call about every space of the tier (TIER).
EVERY_SPACE = "*"


def _tier(method: Method) -> AccessOf:
    """TIER: every space of the tier, `outrig://*` (the request names none)."""
    every = Access(method.action, EVERY_SPACE, _SPACE_ITSELF)

    def access(request: Any, limits: Limits) -> Access:
        return every

    return access


_RULES: dict[int, Callable[[Method], AccessOf]] = {
    pb.Access.ENTRIES: _entries,
    pb.Access.TEMPLATES: _templates,
    pb.Access.SPACE: _space,
    pb.Access.TIER: _tier,
}


def _access(method: Method) -> AccessOf:
    rule = _RULES.get(method.resource)
    if rule is None:
        raise AssertionError(
            f"{method.name}: its (outrig.v1.access) resource is "
            f"{pb.Access.Resource.Name(method.resource)}, which no rule here reads"
        )
    return rule(method)


#: How each method's `Access` is worked out from its request, by method name.
ACCESS: dict[str, AccessOf] = {method.name: _access(method) for method in METHODS.values()}
