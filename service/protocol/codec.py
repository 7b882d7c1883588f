"""Protobuf <-> engine objects, validating as it goes.

Everything a client sends passes through here before the engine sees it, and every problem is an
InvalidArgumentError whose message names the field at fault (`entries[3].fields['n']`). A name or
key the client chose is quoted through `excerpt`, at most a short prefix of it, so that no message
grows with the request. Values are turned into `FieldValue`s without decoding arrays: a typed
array stays the bytes it arrived as.
"""

from __future__ import annotations

import math
import re
import struct
from collections.abc import Mapping, Sequence

from google.protobuf import unknown_fields
from google.protobuf.message import DecodeError

from outrig.service.config import SPACE_NAME, Limits
from outrig.service.engine.leases import check_lease_duration
from outrig.service.engine.model import LeaseGrant, NewEntry, Template, Templates, make_template
from outrig.service.engine.values import NULL, FieldValue
from outrig.service.exceptions import InvalidArgumentError, excerpt
from outrig.service.protocol import matching, views, wire
from outrig.v1 import space_pb2 as pb

# A partition of a partitioned space (engine/partitions.py): the transport checks the space is.
_PARTITION_NAME = re.compile(SPACE_NAME.pattern + r"~(?:0|[1-9][0-9]{0,3})")
_DTYPES = {
    pb.DTYPE_INT8: ("int8", 1),
    pb.DTYPE_INT16: ("int16", 2),
    pb.DTYPE_INT32: ("int32", 4),
    pb.DTYPE_INT64: ("int64", 8),
    pb.DTYPE_UINT8: ("uint8", 1),
    pb.DTYPE_FLOAT32: ("float32", 4),
    pb.DTYPE_FLOAT64: ("float64", 8),
}
_pack_double = struct.Struct("<d").pack


def space_name(name: str, limits: Limits) -> str:
    if not name:
        raise InvalidArgumentError("space: must not be empty")
    if len(name) > limits.max_name_length or not (
        (_PARTITION_NAME if "~" in name else SPACE_NAME).fullmatch(name)
    ):
        raise InvalidArgumentError(
            f"space: {excerpt(name)} is not a valid space name (letters, digits, '.', '_', '-', "
            f"starting with a letter or digit, at most {limits.max_name_length} characters)"
        )
    return name


def _name(value: str, where: str, limits: Limits) -> str:
    if not value:
        raise InvalidArgumentError(f"{where}: must not be empty")
    if len(value) > limits.max_name_length:
        raise InvalidArgumentError(
            f"{where}: {len(value)} characters exceeds the limit max_name_length={limits.max_name_length}"
        )
    return value


def _array(array: pb.TypedArray, where: str, view: memoryview | None = None) -> FieldValue:
    dtype = _DTYPES.get(array.dtype)
    if dtype is None:
        raise InvalidArgumentError(f"{where}.array_value.dtype: unknown dtype {array.dtype}")
    name, size = dtype
    data: bytes | memoryview = array.data if view is None else view
    if len(data) % size:
        raise InvalidArgumentError(
            f"{where}.array_value.data: {len(data)} bytes is not a whole number of {name} elements"
        )
    return FieldValue("array:" + name, data)


def _check_nested(value: pb.Value, where: str, depth: int, limits: Limits) -> bool:
    """Validate a list or map value recursively; True if every map in it is already sorted."""
    kind = value.WhichOneof("kind")
    if kind is None:
        raise InvalidArgumentError(f"{where}: no value set (send null_value for null)")
    if depth > limits.max_depth and kind in ("list_value", "map_value"):
        raise InvalidArgumentError(
            f"{where}: lists and maps nested deeper than the limit max_depth={limits.max_depth}"
        )
    if kind == "array_value":
        _array(value.array_value, where)
    elif kind == "list_value":
        ordered = True
        for i, element in enumerate(value.list_value.items):
            ordered = _check_nested(element, f"{where}[{i}]", depth + 1, limits) and ordered
        return ordered
    elif kind == "map_value":
        keys = [item.key for item in value.map_value.items]
        if len(set(keys)) != len(keys):
            raise InvalidArgumentError(f"{where}: map has a duplicate key")
        ordered = keys == sorted(keys)
        for item in value.map_value.items:
            ordered = (
                _check_nested(item.value, f"{where}[{excerpt(item.key)}]", depth + 1, limits) and ordered
            )
        return ordered
    return True


def _sort_maps(value: pb.Value) -> None:
    kind = value.WhichOneof("kind")
    if kind == "list_value":
        for element in value.list_value.items:
            _sort_maps(element)
    elif kind == "map_value":
        items = sorted(value.map_value.items, key=lambda item: item.key)
        copies = [pb.MapItem(key=item.key, value=item.value) for item in items]
        del value.map_value.items[:]
        value.map_value.items.extend(copies)
        for item in value.map_value.items:
            _sort_maps(item.value)


def field_value(value: pb.Value, where: str, limits: Limits) -> FieldValue:
    """The engine's view of one field value (canonical: equal values compare equal)."""
    kind = value.WhichOneof("kind")
    if kind == "int_value":
        return FieldValue("int", value.int_value)
    if kind == "string_value":
        return FieldValue("string", value.string_value)
    if kind == "double_value":
        return FieldValue("double", _pack_double(value.double_value))
    if kind == "bool_value":
        return FieldValue("bool", value.bool_value)
    if kind == "null_value":
        return NULL
    if kind == "bytes_value":
        return FieldValue("bytes", value.bytes_value)
    if kind == "array_value":
        return _array(value.array_value, where)
    if kind is None:
        raise InvalidArgumentError(f"{where}: no value set (send null_value for null)")
    if not _check_nested(value, where, 1, limits):
        value = pb.Value(**{kind: getattr(value, kind)})
        _sort_maps(value)
    return FieldValue(kind.removesuffix("_value"), value.SerializeToString(deterministic=True))


# The kinds of value whose engine form is the value itself, by their oneof name.
_PLAIN = {"int_value": "int", "string_value": "string", "bool_value": "bool", "bytes_value": "bytes"}


def _fields(
    fields: Mapping[str, pb.Value], where: str, limits: Limits, arrays: Mapping[str, memoryview] | None = None
) -> dict[str, FieldValue]:
    """The entry's or template's values; `arrays` are views to use for typed arrays' data.

    A field's path (`where['name']`) is only put together for an error or for values that may need
    it: an entry of small fields costs no string formatting (write_many of 100 builds this 100 times).
    """
    if len(fields) > limits.max_fields:
        raise InvalidArgumentError(
            f"{where}: {len(fields)} fields exceeds the limit max_fields={limits.max_fields}"
        )
    result = {}
    longest = limits.max_name_length
    for name in fields:
        value = fields[name]
        if not name or len(name) > longest:
            _name(name, f"{where}[{excerpt(name)}]", limits)  # raises, naming the field
        kind = value.WhichOneof("kind")
        plain = _PLAIN.get(kind)  # None when no value is set
        if plain is not None:
            result[name] = FieldValue(plain, getattr(value, kind))
        elif arrays and kind == "array_value" and (view := arrays.get(name)) is not None:
            result[name] = _array(value.array_value, f"{where}[{excerpt(name)}]", view)
        else:
            result[name] = field_value(value, f"{where}[{excerpt(name)}]", limits)
    return result


def new_entry(
    entry: pb.Entry, where: str, limits: Limits, encoding: bytes | memoryview | None = None
) -> NewEntry:
    """The engine's view of an entry to write; `encoding` is its bytes as received, if known."""
    type_name = entry.type_name
    longest = limits.max_name_length
    if not type_name or len(type_name) > longest:
        _name(type_name, f"{where}.type_name", limits)  # raises
    supertypes = tuple(entry.supertypes)
    for i, supertype in enumerate(supertypes):
        if not supertype or len(supertype) > longest:
            _name(supertype, f"{where}.supertypes[{i}]", limits)  # raises
    if type_name in supertypes or len(set(supertypes)) != len(supertypes):
        seen = {type_name}
        for i, supertype in enumerate(supertypes):
            if supertype in seen:
                raise InvalidArgumentError(
                    f"{where}.supertypes[{i}]: {excerpt(supertype)} is the type or an earlier supertype"
                )
            seen.add(supertype)
    # The payload is the entry's encoding, framed: what replies and the store carry (see wire.py).
    if encoding is None:
        encoding = entry.SerializeToString()
    payload = wire.frame(encoding)
    # A large entry's arrays are taken as views into the payload: read through the decoded
    # message they would be one more copy (3.6 MB for an HD frame, held as long as the entry).
    # Such an entry arrives decoded without its arrays' data (wire.without_array_data).
    arrays = None
    if len(encoding) > wire.VIEW_ARRAYS_ABOVE:
        try:
            arrays = wire.array_views(wire.unframed(payload))
        except ValueError as err:  # the request's bytes were checked as they arrived: a safety net
            raise InvalidArgumentError(f"{where}: not a valid outrig.v1.Entry ({err})") from None
    fields = _fields(entry.fields, f"{where}.fields", limits, arrays)
    return NewEntry(type_name, supertypes, fields, payload, len(encoding))


def new_entries(
    entries: Sequence[pb.Entry],
    limits: Limits,
    encodings: Sequence[bytes | memoryview] | None = None,
    *,
    one_pass: bool = False,
) -> list[NewEntry]:
    """The entries of a write_many; `encodings` are their bytes as received, if known. With
    `one_pass` (the server's write_many), small entries' encodings are read in one pass
    (`_viewed_entries`) rather than entry by entry."""
    if not entries:
        raise InvalidArgumentError("entries: must not be empty")
    if len(entries) > limits.max_batch:
        raise InvalidArgumentError(
            f"entries: {len(entries)} entries exceeds the limit max_batch={limits.max_batch}"
        )
    if encodings is None or len(encodings) != len(entries):
        return [new_entry(entry, f"entries[{i}]", limits) for i, entry in enumerate(entries)]
    if one_pass:
        viewed = _viewed_entries(encodings, limits)
        if viewed is not None:
            return viewed
    return [
        new_entry(entry, f"entries[{i}]", limits, encoding)
        for i, (entry, encoding) in enumerate(zip(entries, encodings, strict=True))
    ]


def _viewed_entries(encodings: Sequence[bytes | memoryview], limits: Limits) -> list[NewEntry] | None:
    """`new_entries` of a write_many's small entries, read in one pass (`views.batch_view`):
    each distinct field (its name and value as encoded) decoded once for the whole batch, and
    the same `FieldValue` shared by the entries that have it. None when any entry needs
    `new_entry` (a large one, whose arrays are views; anything to refuse, so that the refusal
    names its entry and field; a name sent twice, which the map decodes as its last; a type
    name sent twice, or a separator's empty name or field sent by the entry itself)."""
    if max(map(len, encodings)) > wire.VIEW_ARRAYS_ABOVE:  # at C speed, not a generator
        return None
    try:
        batch = views.batch_view(encodings)
    except DecodeError:  # checked as it arrived: a safety net
        return None
    count = len(encodings)
    # Each entry's type name after its separator's "": every other one from the first is "" only
    # if each entry sent exactly one (see views.BATCH_SEPARATOR).
    names = list(batch.type_name)
    if len(names) != 2 * count or any(names[0::2]):
        return None
    type_names = names[1::2]
    supertypes: list[tuple[str, ...]] | None = None  # None: no entry has any
    if len(batch.supertypes) != count:
        supertypes = _grouped(list(batch.supertypes), count)
        if supertypes is None:
            return None
    items = list(batch.fields)
    distinct = dict.fromkeys(items)
    del distinct[b""]  # the separators
    known = _viewed_fields(list(distinct), limits)
    longest, most = limits.max_name_length, limits.max_fields
    # each lineage's tuple, shared by its entries (None: refused)
    lineages: dict[tuple[str, tuple[str, ...]], tuple[str, ...] | None] = {}
    result: list[dict[str, FieldValue]] = []  # each entry's fields
    append = result.append
    fields: dict[str, FieldValue] = {}
    sent = 0  # fields the entry sent
    index = -1  # the entry whose fields `fields` holds
    for item in items:
        if item:
            found = known[item]
            if found is None:
                return None
            fields[found[0]] = found[1]
            sent += 1
            continue
        # A separator: the entry before it is complete.
        if index >= 0:
            if sent > most or len(fields) != sent:  # too many fields, or a name sent twice
                return None
            append(fields)
        index += 1
        fields, sent = {}, 0
    if index != count - 1 or sent > most or len(fields) != sent:  # an entry sent an empty field
        return None
    append(fields)
    made: list[NewEntry] = []
    for i, (type_name, encoding) in enumerate(zip(type_names, encodings, strict=True)):
        lineage_of = () if supertypes is None else supertypes[i]
        shape = (type_name, lineage_of)
        lineage = lineages.get(shape, _UNSEEN)
        if lineage is _UNSEEN:
            lineage = lineages[shape] = (
                (type_name, *lineage_of) if _valid_lineage(type_name, lineage_of, longest) else None
            )
        if lineage is None:
            return None
        made.append(NewEntry(type_name, lineage_of, result[i], wire.frame(encoding), len(encoding), lineage))
    return made


_UNSEEN: tuple[str, ...] = ()
"""`_viewed_entries`' lineages: one not met yet (a lineage has its type at least)."""


def _grouped(names: list[str], count: int) -> list[tuple[str, ...]] | None:
    """A `BatchView`'s supertypes by entry (each group after its separator's ""); None if an entry
    sent an empty supertype itself (there are then more groups than entries)."""
    groups: list[tuple[str, ...]] = []
    start = 1
    for end in range(1, len(names) + 1):
        if end == len(names) or not names[end]:
            groups.append(tuple(names[start:end]))
            start = end + 1
    if len(groups) != count or (names and names[0]):
        return None
    return groups


def _viewed_fields(items: list[bytes], limits: Limits) -> dict[bytes, tuple[str, FieldValue] | None]:
    """`_viewed_field` of each of a batch's distinct fields (encoded map items), the plain ones
    read at once: the items as one `views.items_view` (each one's key and Value), and their
    Values of plain kinds as one `views.values_view`, so that a batch's ints, say, come as one
    list rather than as a message object, a Value and a `WhichOneof` each.

    Each item has exactly one key and one Value only if the lists alternate with the
    separators' empty ones (an item that sends none or two puts them out of step, as for
    `views.batch_view`'s type names); each of those Values opened by a plain kind's tag has at
    least that one value, and exactly one if the kinds' lists hold as many values as there are
    such Values and nothing else was in them (a second value, or a field of another kind, which
    a Value would keep as its last). Otherwise, and for the other kinds, one at a time."""
    try:
        flat = views.items_view(items)
        names, values = list(flat.key), list(flat.value)
        count = len(items)
        if (
            len(names) != 2 * count
            or len(values) != 2 * count
            or any(names[0::2])
            or any(values[0::2])
            or not all(values[1::2])
        ):
            return {item: _viewed_field(item, limits) for item in items}
        names, values = names[1::2], values[1::2]
        openings = views.PLAIN_TAGS
        plain = [value for value in values if value[0] in openings]
        decoded = views.values_view(plain)
        lists = {kind: list(getattr(decoded, kind)) for kind in views.PLAIN_KINDS}
    except DecodeError:  # checked as it arrived: a safety net
        return {item: _viewed_field(item, limits) for item in items}
    if sum(map(len, lists.values())) != len(plain) or unknown_fields.UnknownFieldSet(decoded):
        return {item: _viewed_field(item, limits) for item in items}
    streams = {kind: iter(found) for kind, found in lists.items()}
    longest = limits.max_name_length
    result: dict[bytes, tuple[str, FieldValue] | None] = {}
    for item, name, value in zip(items, names, values, strict=True):
        kind = openings.get(value[0])
        if kind is None:  # not a plain kind: as its own message
            result[item] = _viewed_field(item, limits)
        elif not name or len(name) > longest:
            result[item] = None
        else:
            result[item] = name, FieldValue(_PLAIN[kind], next(streams[kind]))
    return result


def _valid_lineage(type_name: str, supertypes: tuple[str, ...], longest: int) -> bool:
    """Whether `new_entry` takes this type and these supertypes without a refusal."""
    names = (type_name, *supertypes)
    return all(name and len(name) <= longest for name in names) and len(set(names)) == len(names)


def _viewed_field(item: bytes, limits: Limits) -> tuple[str, FieldValue] | None:
    """An entry's field from its encoded map item: its name and value, as `_fields` makes them;
    None if `_fields` would refuse it."""
    message = views.map_item(item)
    name = message.key
    if not name or len(name) > limits.max_name_length:
        return None
    value = message.value
    kind = value.WhichOneof("kind")
    plain = _PLAIN.get(kind)  # None when no value is set
    if plain is not None:
        return name, FieldValue(plain, getattr(value, kind))
    try:
        return name, field_value(value, "", limits)
    except InvalidArgumentError:
        return None


def templates(
    messages: Sequence[pb.Template], limits: Limits, order: Sequence[pb.OrderKey] = ()
) -> tuple[Template, ...]:
    """A request's templates, and the order it asks for (`order`: its order_by), as the engine's
    `Templates`."""
    if not messages:
        raise InvalidArgumentError("templates: at least one template is required")
    if len(messages) > limits.max_templates:
        raise InvalidArgumentError(
            f"templates: {len(messages)} templates exceeds the limit max_templates={limits.max_templates}"
        )
    result = []
    for i, message in enumerate(messages):
        where = f"templates[{i}]"
        type_name = _name(message.type_name, f"{where}.type_name", limits)
        fields = _fields(message.fields, f"{where}.fields", limits)
        found = (
            matching.matchers(message.matchers, f"{where}.matchers", limits, fields)
            if message.matchers
            else None
        )
        result.append(make_template(type_name, fields, found))
    if order or any(template.matchers for template in result):
        return Templates(result, matching.order_by(order, limits))
    return tuple(result)


def lease_duration(
    request: pb.WriteRequest | pb.WriteManyRequest | pb.NotifyRequest | pb.LeaseRenewal | pb.BeginRequest,
    field: str = "lease",
) -> float | None:
    """Requested seconds; math.inf for FOREVER; None for the space's default (Lease.ANY)."""
    if not request.HasField(field):
        return None
    duration: pb.LeaseDuration = getattr(request, field)
    which = duration.WhichOneof("duration")
    if which is None:
        return None
    if which == "forever":
        if not duration.forever:
            raise InvalidArgumentError(f"{field}.forever: must be true when set")
        return math.inf
    seconds = duration.seconds
    if not math.isfinite(seconds) or seconds <= 0:
        raise InvalidArgumentError(f"{field}.seconds: must be finite and > 0, got {seconds}")
    check_lease_duration(seconds, field)
    return seconds


def timeout(request: pb.MatchRequest, limits: Limits) -> float | None:
    """Seconds to wait; None waits without limit."""
    if not request.HasField("timeout"):
        return None
    seconds = request.timeout
    if not math.isfinite(seconds) or seconds < 0:
        raise InvalidArgumentError(f"timeout: must be finite and >= 0, got {seconds}")
    if seconds > limits.max_timeout:
        raise InvalidArgumentError(
            f"timeout: {seconds} s exceeds the limit max_timeout={limits.max_timeout} s "
            "(omit it to wait forever)"
        )
    return seconds


def max_entries(request: pb.MatchRequest, limits: Limits) -> int:
    count = request.max_entries
    if count < 1:
        raise InvalidArgumentError("max_entries: must be at least 1")
    if count > limits.max_batch:
        raise InvalidArgumentError(f"max_entries: {count} exceeds the limit max_batch={limits.max_batch}")
    return count


MAX_REQUEST_ID = 128


def request_id(
    request: pb.WriteRequest
    | pb.WriteManyRequest
    | pb.MatchRequest
    | pb.AckRequest
    | pb.NackRequest
    | pb.ExtendRequest,
) -> str:
    """The request's idempotency key ("" when it has none)."""
    key = request.request_id
    if len(key) > MAX_REQUEST_ID:
        raise InvalidArgumentError(f"request_id: {len(key)} characters exceeds the limit of {MAX_REQUEST_ID}")
    if "\x00" in key:
        raise InvalidArgumentError("request_id: must not contain NUL characters")
    return key


def lease_message(grant: LeaseGrant) -> pb.Lease:
    lease = pb.Lease()
    fill_lease(lease, grant)
    return lease


def fill_lease(lease: pb.Lease, grant: LeaseGrant) -> None:
    """Set a reply's (empty) Lease from `grant`, in place: a reply made with a Lease message as
    an argument copies it (three times the cost, for a write's one lease)."""
    lease.id = grant.id
    lease.expires_at = grant.expires_at or 0.0
    if grant.granted is not None:
        lease.granted_seconds = grant.granted


def write_many_reply(grants: Sequence[LeaseGrant]) -> pb.WriteManyReply:
    """The reply of a write_many: each grant's lease filled in the reply's own list (`add`,
    `fill_lease`), not made apart and copied in: 80 against 130 us for 100 leases."""
    reply = pb.WriteManyReply()
    add = reply.leases.add
    for grant in grants:
        fill_lease(add(), grant)
    return reply


# ---------------------------------------------------------------- the store's encodings
#
# The store keeps entries as their payload, the protobuf encoding of the Entry, and
# registrations' templates as an encoded NotifyRequest. Limits are not applied when loading: a
# stored entry was valid when it was written, and lowering a limit must not make a data dir
# unreadable.

_NO_LIMITS = Limits(
    max_fields=1 << 30, max_depth=1 << 30, max_name_length=1 << 30, max_templates=1 << 30, max_batch=1 << 30
)
_DTYPE_BY_NAME = {name: number for number, (name, _) in _DTYPES.items()}
_unpack_double = struct.Struct("<d").unpack


def entry_bytes(payload: object) -> memoryview:
    """What the store keeps of a payload: the Entry's encoding (a view, no copy)."""
    assert isinstance(payload, bytes)
    return wire.unframed(payload)


def payload_of(entry: pb.Entry) -> bytes:
    """The payload the server keeps for an entry (tests build entries this way)."""
    return wire.frame(entry.SerializeToString())


def stored_entry(data: bytes) -> NewEntry:
    """An entry read back from the store: decoded for its values (made canonical), without the
    request checks it passed when written (names, limits), which cost most of a restart. The
    payload is the stored bytes, framed; the decoded message is dropped."""
    entry = pb.Entry.FromString(data)
    fields = {name: field_value(value, "stored entry", _NO_LIMITS) for name, value in entry.fields.items()}
    return NewEntry(entry.type_name, tuple(entry.supertypes), fields, wire.frame(data), len(data))


def value_message(value: FieldValue) -> pb.Value:
    """The protobuf form of an engine value (the inverse of `field_value`)."""
    kind, data = value.kind, value.data
    if kind == "int":
        return pb.Value(int_value=data)  # type: ignore[arg-type]
    if kind == "string":
        return pb.Value(string_value=data)  # type: ignore[arg-type]
    if kind == "double":
        return pb.Value(double_value=_unpack_double(data)[0])  # type: ignore[arg-type]
    if kind == "bool":
        return pb.Value(bool_value=data)  # type: ignore[arg-type]
    if kind == "bytes":
        return pb.Value(bytes_value=data)  # type: ignore[arg-type]
    if kind == "null":
        return pb.Value(null_value=pb.Null())
    if kind.startswith("array:"):
        return pb.Value(array_value=pb.TypedArray(dtype=_DTYPE_BY_NAME[kind[6:]], data=data))  # type: ignore[arg-type]
    return pb.Value.FromString(data)  # type: ignore[arg-type]  # lists and maps: their canonical encoding


def templates_bytes(templates: Sequence[Template]) -> bytes:
    """Templates encoded for the store, as the templates of a NotifyRequest."""
    request = pb.NotifyRequest()
    for template in templates:
        message = request.templates.add(type_name=template.type_name)
        for name, value in template.fields:
            message.fields[name].CopyFrom(value_message(value))
        for name, matcher in template.matchers:
            message.matchers[name].CopyFrom(matching.matcher_message(matcher))
    return request.SerializeToString()


def stored_templates(data: bytes) -> tuple[Template, ...]:
    """Templates read back from the store."""
    return templates(pb.NotifyRequest.FromString(data).templates, _NO_LIMITS)


def name(value: str, where: str, limits: Limits) -> str:
    """A type or field name, checked: not empty, at most max_name_length characters."""
    return _name(value, where, limits)
