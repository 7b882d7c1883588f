"""Partitioned spaces in the transport: where a call of one goes (docs/scaling.md).

A space declared partitioned (config: `partition_by`, `partitions`) is served as P spaces named
"space~k" (engine/partitions.py), each placed, owned and recorded as any space is, so that a call
naming a partition is served (or forwarded to its owner) exactly as an unpartitioned space's call.
`Router.route` runs after the guard, before the servicer asks where a call is served:

- a call that concerns one partition is renamed to it, in place (`rename`): a write by its entry's
  routing value, a template with the routing field set (or a set of values all in one partition),
  anything under a transaction (which works in the partition of its id), a renewal, cancel, commit
  or abort by the partition in its ids, an Ack, Nack or Extend by its receipt's; a call that
  names a partition itself (the SDK names the one it routed to, a peer its share of a fan-out) is
  checked and served as named;
- a call that concerns several is a `FanOut`, which transport/fanout.py runs.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from outrig._protocol import METHODS, tag, varint
from outrig._routing import value_partition
from outrig.service.config import ServerConfig
from outrig.service.engine.partitions import (
    SEPARATOR,
    Partitioning,
    partition_name,
    partition_of,
    partition_of_id,
    split_name,
)
from outrig.service.exceptions import (
    CrossPartitionError,
    DeliveryExpiredError,
    InvalidArgumentError,
    LeaseNotFoundError,
    RoutingValueError,
    TransactionNotFoundError,
    excerpt,
)
from outrig.service.protocol import codec, deliveries
from outrig.service.transport import handlers
from outrig.v1 import space_pb2 as pb

_MATCH = frozenset({"Read", "Take", "ReadMany", "TakeMany"})
_TEMPLATED = _MATCH | {"Count", "Contents", "Notify"}
_BY_IDS = frozenset({"RenewLeases", "CancelLeases"})
_BY_TRANSACTION = frozenset({"Commit", "Abort"})
_BY_LEASE_ID = frozenset({"CancelRegistration", "AbortTransaction"})
#: Settled by a delivery's receipt, an id of the partition that delivered it.
_BY_RECEIPT = frozenset({"Ack", "Nack", "Extend"})
_EVERY_PARTITION = frozenset({"DescribeSpace", "Browse", "Purge"})
#: The kinds of value a routing field may hold in an entry (the SDK can hash these itself).
_ROUTABLE = frozenset({"bool_value", "int_value", "double_value", "string_value", "bytes_value"})
#: Methods a partitioned space's own name cannot be given to: they act on one space's placement.
_ONE_SPACE = frozenset({"MoveSpace"})


@dataclass(frozen=True, slots=True)
class FanOut:
    """A call of the partitioned `space` that goes to the partitions `partitions`."""

    space: str
    partitioning: Partitioning
    partitions: tuple[int, ...]


#: The tag of every request's `space` (renamed requests get a second one appended: `rename`).
_SPACE = tag(pb.WriteRequest.DESCRIPTOR.fields_by_name["space"])
if any(
    (field := method.request.DESCRIPTOR.fields_by_name.get("space")) is not None and tag(field) != _SPACE
    for method in METHODS.values()
):
    raise AssertionError("a request's space is not the field every other request's is")


def _space_field(name: str) -> bytes:
    """Field 1 (every request's `space`) holding `name`, encoded: appended to a request's bytes
    it wins over the first (protobuf keeps the last value of a singular field)."""
    data = name.encode()
    return _SPACE + varint(len(data)) + data


def rename(request: Any, space: str) -> None:
    """Make `request` name `space` (a partition), in place; a `Received` keeps its bytes valid."""
    if isinstance(request, handlers.Received):
        request.message.space = space
        request.suffix = _space_field(space)  # what a forwarded copy appends to its bytes
    else:
        request.space = space


def copy_for(request: Any, space: str, **changes: Any) -> Any:
    """A copy of a (plain) request naming `space`, with `changes` to its fields."""
    message = type(request)()
    message.CopyFrom(request)
    message.space = space
    for name, value in changes.items():
        if value is None:
            message.ClearField(name)
        else:
            setattr(message, name, value)
    return message


def _settles_elsewhere(name: str, message: Any, k: int) -> bool:
    """A take of one partition that settles deliveries of another: the fan-out acks those."""
    if name not in ("Take", "TakeMany") or not message.settle:
        return False
    return any(partition_of_id(receipt) != k for receipt in message.settle)


class Router:
    """Where a call of a partitioned space goes (module docstring)."""

    def __init__(self, config: ServerConfig) -> None:
        self._config = config
        self._limits = config.limits
        self._partitionings = {name: config.partitioning(name) for name in config.spaces}
        #: Whether any space is configured (`[spaces.NAME]`): if none is, `route` serves every
        #: call as it names its space (None), and need not be asked.
        self.partitioned = bool(self._partitionings)
        #: Each partition's name a call has named (the SDK names the one it routed to): its
        #: space, its number and its space's partitioning, found once. Only the names of
        #: configured partitions, as `partition_name` spells them, are kept: at most their number.
        self._named: dict[str, tuple[str, int, Partitioning]] = {}

    def partitioning(self, space: str) -> Partitioning | None:
        return self._partitionings.get(space)

    def route(self, name: str, request: Any) -> FanOut | None:
        """None: the call is served as the one space it now names (renamed to its partition if it
        concerns one); else the partitions it goes to. Bad input raises, naming the field."""
        message = request.message if isinstance(request, handlers.Received) else request
        space = getattr(message, "space", "")
        if not space:
            return None
        partitionings = self._partitionings
        if not partitionings:
            return None  # no space is partitioned: every call as it is
        partitioning: Partitioning | None
        named = self._named.get(space)
        if named is None and SEPARATOR in space:
            named = self._partition_named(space)
        if named is not None:  # a call that names a partition: checked, served as named
            base, k, partitioning = named
            if name == "Write":  # the hot path: a write the SDK routed
                if message.HasField("entry"):
                    entry = message.entry
                    value = entry.fields.get(partitioning.field)
                    if value is None or value_partition(value, partitioning.count) != k:
                        self._check_named(entry, "entry", base, partitioning, k)
            elif name == "WriteMany":
                for where, entry in _entries(message):
                    self._check_named(entry, where, base, partitioning, k)
            return None
        partitioning = partitionings.get(space)
        base = space
        if partitioning is None:
            return None
        if name in _ONE_SPACE:
            raise InvalidArgumentError(
                f"space: {base!r} is partitioned: name one of its partitions ({partition_name(base, 0)}, ...)"
            )
        partitions = self._partitions(name, message, base, partitioning)
        if (
            len(partitions) == 1
            and name not in _EVERY_PARTITION
            and not _settles_elsewhere(name, message, partitions[0])
        ):
            rename(request, partition_name(base, partitions[0]))
            return None
        return FanOut(base, partitioning, partitions)

    def _partition_named(self, space: str) -> tuple[str, int, Partitioning] | None:
        """The space, number and partitioning of the partition `space` names (kept in
        `_named`); None if it names none (a name with '~' but no number: the name check refuses
        it). InvalidArgumentError if it names a partition its space does not have."""
        base, k = split_name(space)
        if k is None:
            return None
        partitioning = self._partitionings.get(base)
        if partitioning is None or k >= partitioning.count:
            have = "is not partitioned" if partitioning is None else f"has {partitioning.count} partitions"
            raise InvalidArgumentError(
                f"space: {excerpt(space)} names partition {k} of {base!r}, which {have}"
            )
        named = (base, k, partitioning)
        if space == partition_name(base, k):  # not "jobs~01": the name check refuses that one
            self._named[space] = named
        return named

    def _partitions(self, name: str, message: Any, space: str, partitioning: Partitioning) -> tuple[int, ...]:
        if name == "Write" and not message.transaction and message.HasField("entry"):  # the hot path
            return (self._entry_partition(message.entry, "entry", space, partitioning),)
        every = tuple(range(partitioning.count))
        if name in ("Write", "WriteMany"):
            ks = {
                self._entry_partition(entry, where, space, partitioning) for where, entry in _entries(message)
            }
            if message.transaction:
                own = self._transaction_partition(message.transaction, space, partitioning)
                if ks - {own}:
                    raise CrossPartitionError(
                        f"transaction {message.transaction} works in partition {own} of {space!r} "
                        f"(by {partitioning.field!r}); this write has entries of another"
                    )
                return (own,)
            return tuple(sorted(ks)) or every
        if name in _TEMPLATED:
            if name == "Notify" and message.HasField("resume"):
                return (self._lease_partition(message.resume, "resume", space, partitioning),)
            templates = message.templates
            pinned = (
                _pinned(templates[0], partitioning, "templates[0]", self._limits)
                if len(templates) == 1
                else template_partitions(templates, partitioning, self._limits)
            )
            if message.transaction:
                own = self._transaction_partition(message.transaction, space, partitioning)
                if pinned is not None and pinned - {own}:
                    raise CrossPartitionError(
                        f"transaction {message.transaction} works in partition {own} of {space!r} "
                        f"(by {partitioning.field!r}); a template's {partitioning.field!r} is in another"
                    )
                return (own,)
            return every if pinned is None else tuple(sorted(pinned)) or (0,)
        if name in _BY_IDS:
            ids = message.ids if name == "CancelLeases" else [renewal.id for renewal in message.renewals]
            return tuple(sorted({partition_of_id(i) for i in ids})) or (0,)
        if name in _BY_TRANSACTION:
            return (self._transaction_partition(message.transaction, space, partitioning),)
        if name in _BY_LEASE_ID:
            return (self._lease_partition(message.id, "id", space, partitioning),)
        if name == "Ack" and message.receipts:  # a batch: by its receipts' partitions
            ks = {
                partition_of_id(receipt) for receipt in deliveries.ack_receipts(message, self._limits) or ()
            }
            if max(ks) >= partitioning.count:
                bad = next(r for r in message.receipts if partition_of_id(r) >= partitioning.count)
                raise DeliveryExpiredError(f"receipts: {bad} is no delivery of {space!r}")
            return tuple(sorted(ks))
        if name in _BY_RECEIPT:
            k = partition_of_id(deliveries.receipt(message))
            if k >= partitioning.count:
                raise DeliveryExpiredError(f"receipt: {message.receipt} is no delivery of {space!r}")
            return (k,)
        if name == "Begin":
            if not message.HasField("route"):
                raise CrossPartitionError(
                    f"route: space {space!r} is partitioned by {partitioning.field!r}: a transaction works "
                    f"in one partition, named by a value of {partitioning.field!r} (BeginRequest.route; "
                    "Space.transaction(route=...))"
                )
            kind = message.route.WhichOneof("kind")
            if kind not in _ROUTABLE:
                raise InvalidArgumentError(
                    f"route: a value of {partitioning.field!r} (a bool, int, double, string or bytes), "
                    f"not {'nothing' if kind is None else kind.removesuffix('_value')}"
                )
            value = codec.field_value(message.route, "route", self._limits)
            return (partition_of(value, partitioning.count),)
        if name == "Locate" and message.HasField("partition"):
            if message.partition >= partitioning.count:
                raise InvalidArgumentError(
                    f"partition: {message.partition} is not below {space!r}'s {partitioning.count} partitions"
                )
            return (message.partition,)
        return every

    def _entry_partition(self, entry: pb.Entry, where: str, space: str, partitioning: Partitioning) -> int:
        field = partitioning.field
        fields = entry.fields
        value = fields.get(field)
        k = None if value is None else value_partition(value, partitioning.count)
        if k is not None:
            return k
        kind = None if value is None else value.WhichOneof("kind")
        at = f"{where}.fields[{field!r}]"
        if kind in (None, "null_value"):
            raise RoutingValueError(
                f"{at}: space {space!r} is partitioned by {field!r}: every entry written to it "
                "holds a value there"
            )
        raise RoutingValueError(
            f"{at}: a routing value of space {space!r} is a bool, int, double, string or bytes, "
            f"not {str(kind).removesuffix('_value')}"
        )

    def _check_named(
        self, entry: pb.Entry, where: str, space: str, partitioning: Partitioning, k: int
    ) -> None:
        """Refuse an entry written to partition `k` of `space` that routes to another (or
        nowhere), naming where it is."""
        if self._entry_partition(entry, where, space, partitioning) != k:
            raise InvalidArgumentError(f"{where}: routes to another partition of {space!r} than {k}")

    def _transaction_partition(self, transaction: int, space: str, partitioning: Partitioning) -> int:
        k = partition_of_id(transaction)
        if k >= partitioning.count:
            raise TransactionNotFoundError(f"transaction {transaction} is no transaction of {space!r}")
        return k

    @staticmethod
    def _lease_partition(lease_id: int, where: str, space: str, partitioning: Partitioning) -> int:
        k = partition_of_id(lease_id)
        if k >= partitioning.count:
            raise LeaseNotFoundError(f"{where}: {lease_id} is no lease of {space!r}")
        return k


def _entries(message: Any) -> Iterable[tuple[str, pb.Entry]]:
    if isinstance(message, pb.WriteRequest):
        if message.HasField("entry"):
            yield "entry", message.entry
        return
    for i, entry in enumerate(message.entries):
        yield f"entries[{i}]", entry


def template_partitions(
    templates: Sequence[pb.Template], partitioning: Partitioning, limits: Any
) -> set[int] | None:
    """The partitions a request's templates can match in; None: any (one of them leaves the
    routing field open)."""
    found: set[int] = set()
    for i, template in enumerate(templates):
        pinned = _pinned(template, partitioning, f"templates[{i}]", limits)
        if pinned is None:
            return None
        found |= pinned
    return found


def _pinned(template: pb.Template, partitioning: Partitioning, where: str, limits: Any) -> set[int] | None:
    field = partitioning.field
    value = template.fields.get(field)
    if value is not None:
        k = value_partition(value, partitioning.count)
        if k is not None:
            return {k}
        if value.WhichOneof("kind") not in (None, "null_value"):  # a null field is a wildcard
            return set()  # a list, a map: no entry's routing value, in any partition
    if field in template.matchers:
        return _matcher_partitions(template.matchers[field], partitioning)
    return None


def _value_partitions(values: Iterable[pb.Value], partitioning: Partitioning) -> set[int]:
    """The partitions of template values; a value no entry's routing field can hold (a list, a
    map) matches nothing, in any partition: none."""
    found = set()
    for value in values:
        k = value_partition(value, partitioning.count)
        if k is not None:
            found.add(k)
    return found


def _matcher_partitions(matcher: pb.Matcher, partitioning: Partitioning) -> set[int] | None:
    kind = matcher.WhichOneof("kind")
    if kind == "equal":
        return _value_partitions((matcher.equal,), partitioning)
    if kind == "one_of":
        return _value_partitions(matcher.one_of.values, partitioning)
    if kind == "all":
        found: set[int] | None = None
        for inner in matcher.all.matchers:
            pinned = _matcher_partitions(inner, partitioning)
            if pinned is not None:
                found = pinned if found is None else found & pinned
        return found
    return None
