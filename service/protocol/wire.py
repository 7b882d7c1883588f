"""Entries on the wire, framed by hand: replies encoded straight from the stored payloads, and the
entries of a write found in its bytes. Pure byte work: no gRPC, no protobuf decoding.

The server keeps each entry as its payload: the bytes of its `outrig.v1.Entry` encoding, framed
as field 1 of a MatchReply (a tag and a length in front, see `frame`). A small entry costs about
90 bytes that way, against about 1.2 KB as a protobuf object. MatchReply and ContentsReply are
`repeated Entry entries = 1`, so a reply carrying one entry *is* its payload (no copy at all, which
matters for a 3.6 MB entry) and a reply carrying several is their concatenation. An event
(NotifyReply `sequence = 2, entry = 3`) takes one copy. None of it does protobuf work.

The other way, a write keeps each entry as the bytes it arrived as: `entry_encodings` finds each
entry's bytes in the request by reading its top-level tags, without decoding or re-encoding an
entry (re-encoding a 3.6 MB entry measured 5 ms inside the server); framing it is the one copy.
How requests are decoded, and replies passed through, on their way in and out of gRPC is
service/transport/handlers.py.

The field numbers and tags are read from the generated descriptors (through outrig._protocol, the
protocol's vocabulary), not written here: the proto is their one source.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from google.protobuf.descriptor import FieldDescriptor as _Type

from outrig._protocol import tag, varint
from outrig.v1 import space_pb2 as pb


def _field(message: Any, name: str) -> Any:
    """The descriptor of the field `name` of a generated message class."""
    return message.DESCRIPTOR.fields_by_name[name]


_ENTRIES = tag(_field(pb.MatchReply, "entries"))  # ContentsReply.entries too: checked below
_SEQUENCE = tag(_field(pb.NotifyReply, "sequence"))
_EVENT_ENTRY = tag(_field(pb.NotifyReply, "entry"))
#: The field of a write's entries: WriteRequest.entry, WriteManyRequest.entries (checked below).
ENTRY_FIELD: int = _field(pb.WriteRequest, "entry").number

# A payload is a reply of one entry, of either kind, and a reply of several the payloads end to
# end, only while both replies carry entries in the same field; and a write's entries are found by
# one field number only while both writes carry them in the same one.
if tag(_field(pb.ContentsReply, "entries")) != _ENTRIES:
    raise AssertionError("MatchReply.entries and ContentsReply.entries: not the same field")
if _field(pb.WriteManyRequest, "entries").number != ENTRY_FIELD:
    raise AssertionError("WriteRequest.entry and WriteManyRequest.entries: not the same field")


#: The varints of one byte (0 to 127), looked up where a small length is framed on a hot path
#: (`frame`, transport/mux.py's results) rather than encoded by a call of `varint`.
ONE_BYTE_VARINTS = tuple(varint(value) for value in range(0x80))


def frame(entry: bytes | memoryview) -> bytes:
    """An entry's payload: its encoding framed as a MatchReply's entries field (one copy)."""
    length = len(entry)
    return b"".join((_ENTRIES, ONE_BYTE_VARINTS[length] if length < 0x80 else varint(length), entry))


def unframed(payload: bytes) -> memoryview:
    """The entry's encoding inside a payload (no copy)."""
    start = len(_ENTRIES)
    while payload[start] & 0x80:
        start += 1
    return memoryview(payload)[start + 1 :]


def entries_reply(payloads: Sequence[bytes]) -> bytes:
    """A MatchReply (or ContentsReply: the same layout) carrying these entries' payloads."""
    if len(payloads) == 1:
        return payloads[0]
    return b"".join(payloads)


def event_reply(sequence: int, payload: bytes) -> bytes:
    """A NotifyReply carrying one event."""
    return event_encoded(sequence, unframed(payload))


def event_encoded(sequence: int, entry: bytes | memoryview) -> bytes:
    """A NotifyReply carrying one event, from the entry's encoding."""
    return b"".join((_SEQUENCE, varint(sequence), _EVENT_ENTRY, varint(len(entry)), entry))


_SEQUENCE_NUMBER = _field(pb.NotifyReply, "sequence").number
_EVENT_NUMBER = _field(pb.NotifyReply, "entry").number


def event_of(reply: bytes) -> tuple[int, memoryview] | None:
    """An encoded NotifyReply's event: its sequence number and its entry's encoding (no copy);
    None for the stream's first message, which carries the registration."""
    sequence, entry = 0, None
    for number, value in fields(memoryview(reply)):
        if number == _SEQUENCE_NUMBER and isinstance(value, int):
            sequence = value
        elif number == _EVENT_NUMBER and isinstance(value, memoryview):
            entry = value
    return None if entry is None else (sequence, entry)


#: The longest varint protobuf writes (a 64-bit value in 7-bit groups).
_MAX_VARINT = 10


def _varint_at(data: bytes | memoryview, i: int) -> tuple[int, int]:
    """The varint starting at data[i], and the index after it. ValueError if it runs past the end
    or past 10 bytes: a longer one is no protobuf's, and read on it would make a number whose
    cost grows with the square of its length (2 MB of 0xff held the event loop for minutes)."""
    value = shift = 0
    try:
        while True:
            byte = data[i]
            i += 1
            value |= (byte & 0x7F) << shift
            if byte < 0x80:
                return value, i
            shift += 7
            if shift == 7 * _MAX_VARINT:
                raise ValueError(f"a varint longer than {_MAX_VARINT} bytes")
    except IndexError:
        raise ValueError("truncated message: a varint runs past the end") from None


def fields(message: memoryview) -> list[tuple[int, int | memoryview]]:
    """(field number, value) for each top-level field of an encoded message: a length-delimited
    value is a view of its bytes (no copy), others are ints. Only tags and lengths are read, so the
    cost grows with the number of fields, not with their size. ValueError if the bytes are not
    protobuf's (a message gRPC has not decoded for us: a Mux stream's, a write's before it is)."""
    found: list[tuple[int, int | memoryview]] = []
    i, end = 0, len(message)
    while i < end:
        key, i = _varint_at(message, i)
        kind = key & 7
        value: int | memoryview
        if kind == 2:
            length, i = _varint_at(message, i)
            value, i = message[i : i + length], i + length
        elif kind == 0:
            value, i = _varint_at(message, i)
        elif kind in (1, 5):
            width = 8 if kind == 1 else 4
            value, i = int.from_bytes(message[i : i + width], "little"), i + width
        else:  # groups (3, 4), which protobuf skips as unknown fields but outrig has none of; 6, 7
            raise ValueError(f"wire type {kind}, which no outrig message has")
        found.append((key >> 3, value))
    if i != end:  # a length or a fixed-width value ran past the end
        raise ValueError("truncated message")
    return found


def entry_encodings(raw: bytes) -> list[memoryview]:
    """The encoded entries of a Write or WriteMany request, in order: views of each top-level
    ENTRY_FIELD (no copy)."""
    return [
        value
        for number, value in fields(memoryview(raw))
        if number == ENTRY_FIELD and isinstance(value, memoryview)
    ]


#: The wire type of each protobuf field type that has one of its own (a group's has none here).
_WIRE_TYPES = {
    **dict.fromkeys((_Type.TYPE_DOUBLE, _Type.TYPE_FIXED64, _Type.TYPE_SFIXED64), 1),
    **dict.fromkeys((_Type.TYPE_FLOAT, _Type.TYPE_FIXED32, _Type.TYPE_SFIXED32), 5),
    **dict.fromkeys((_Type.TYPE_STRING, _Type.TYPE_BYTES, _Type.TYPE_MESSAGE), 2),
    **dict.fromkeys(
        (
            _Type.TYPE_INT32,
            _Type.TYPE_INT64,
            _Type.TYPE_UINT32,
            _Type.TYPE_UINT64,
            _Type.TYPE_SINT32,
            _Type.TYPE_SINT64,
            _Type.TYPE_BOOL,
            _Type.TYPE_ENUM,
        ),
        0,
    ),
}


def one_byte_tags(message: Any) -> dict[int, int]:
    """The wire type of each one-byte tag a message class's fields are sent with (field numbers
    up to 15), by the tag: the tags `known_entries` reads. A repeated number's field has both of
    its tags (packed and not), as a parser accepts either."""
    tags: dict[int, int] = {}
    for field in message.DESCRIPTOR.fields:
        kind = _WIRE_TYPES.get(field.type)
        if kind is None or field.number > 15:
            continue
        tags[field.number << 3 | kind] = kind
        if field.is_repeated and kind != 2:
            tags[field.number << 3 | 2] = 2  # packed
    return tags


def known_entries(raw: bytes, tags: dict[int, int]) -> list[bytes] | None:
    """The entries of a Write's bytes that protobuf has parsed (each ENTRY_FIELD's bytes, a copy,
    in order: what `views.entry_encodings` finds) when each top-level field's tag is one of
    `tags` (`one_byte_tags` of the request's class), which also says the message has no unknown
    field at its top level; else None (a field of another number or wire type, a tag of more
    than a byte), for the caller to find them as it would without this. Reading tags in Python
    costs a small write less than a second decode by protobuf and its check for unknown fields
    (docs/performance.md, "The request path, seventh pass")."""
    found: list[bytes] = []
    entry = ENTRY_FIELD << 3 | 2
    i, end = 0, len(raw)
    try:
        while i < end:
            key = raw[i]
            kind = tags.get(key)
            i += 1
            if kind == 2:
                length = raw[i]
                if length < 0x80:  # a small write's every length: one byte, read inline
                    i += 1
                else:
                    length, i = _varint_at(raw, i)
                if key == entry:
                    found.append(raw[i : i + length])
                i += length
            elif kind == 0:
                i = _varint_at(raw, i)[1]
            elif kind is None:
                return None
            else:
                i += 8 if kind == 1 else 4
    except (IndexError, ValueError):  # no bytes protobuf parsed: a safety net
        return None
    return found if i == end else None


# Entry.fields (a map: each item a message of key and value), Value.array_value, TypedArray.data.
_FIELDS = _field(pb.Entry, "fields")
_ENTRY_FIELDS = _FIELDS.number
_MAP_KEY = _FIELDS.message_type.fields_by_name["key"].number
_MAP_VALUE = _FIELDS.message_type.fields_by_name["value"].number
_ARRAY_VALUE = _field(pb.Value, "array_value").number
_ARRAY_DATA = _field(pb.TypedArray, "data").number
_ARRAY_DATA_PATH = (_ENTRY_FIELDS, _MAP_VALUE, _ARRAY_VALUE, _ARRAY_DATA)

#: An entry whose encoding is larger than this has its typed arrays read through views of its
#: bytes (`array_views`), and is decoded without their data (`without_array_data`).
VIEW_ARRAYS_ABOVE = 64 * 1024


def _spans(message: memoryview) -> list[tuple[int, int, int, int, int]]:
    """(field number, start, end of the tag, start of the value, end) of each top-level
    length-delimited field of an encoded message; other fields are skipped. ValueError, as
    `fields`, if the bytes are not protobuf's."""
    spans = []
    i, end = 0, len(message)
    while i < end:
        start = i
        key, i = _varint_at(message, i)
        kind = key & 7
        if kind == 2:
            tag_end = i
            length, i = _varint_at(message, i)
            spans.append((key >> 3, start, tag_end, i, i + length))
            i += length
        elif kind == 0:
            _, i = _varint_at(message, i)
        elif kind in (1, 5):
            i += 8 if kind == 1 else 4
        else:
            raise ValueError(f"wire type {kind}, which no outrig message has")
    if i != end:
        raise ValueError("truncated message")
    return spans


def _without(message: memoryview, path: tuple[int, ...], *, above: int = -1) -> bytes | None:
    """`message` without the fields at the end of `path` (a field number per level of nesting,
    through length-delimited fields), lengths rewritten on the way; None if it has none. Of the
    first level, only fields whose value is longer than `above` bytes are looked into."""
    number, rest = path[0], path[1:]
    parts: list[bytes | memoryview] = []
    done = 0
    for field, start, tag_end, value, end in _spans(message):
        if field != number or end - value <= above:
            continue
        if rest:
            inner = _without(message[value:end], rest)
            if inner is None:
                continue
            parts += (message[done:start], message[start:tag_end], varint(len(inner)), inner)
        else:
            parts.append(message[done:start])
        done = end
    if not parts:
        return None
    parts.append(message[done:])
    return b"".join(parts)


def without_array_data(
    raw: bytes, *, one_entry: bool, entries: Sequence[bytes | memoryview] | None = None
) -> bytes:
    """A Write (`one_entry`) or WriteMany request's bytes to decode: each entry larger than
    VIEW_ARRAYS_ABOVE without its typed arrays' data, which the server reads through views of
    `raw` instead (`array_views`). Decoding them would copy every array (3.6 MB for an HD
    frame) only to throw the copy away. `raw` itself when nothing is left out, or when a Write
    has its entry field more than once (the decoder merges those, and the server then encodes
    the merged entry from the decoded message, which needs the data). `entries`: the request's
    `entry_encodings`, if already found. ValueError if `raw` is not protobuf's."""
    if one_entry and len(entry_encodings(raw) if entries is None else entries) != 1:
        return raw
    decoded = _without(memoryview(raw), (ENTRY_FIELD, *_ARRAY_DATA_PATH), above=VIEW_ARRAYS_ABOVE)
    return raw if decoded is None else decoded


def array_views(entry: memoryview) -> dict[str, memoryview]:
    """The data of each typed-array field of an encoded Entry, as views into it (no copy), by
    field name. Reading only tags and lengths, its cost grows with the number of fields."""
    views: dict[str, memoryview] = {}
    for number, item in fields(entry):
        if number != _ENTRY_FIELDS or not isinstance(item, memoryview):
            continue
        name, value = "", None
        for part, content in fields(item):
            if part == _MAP_KEY and isinstance(content, memoryview):
                name = bytes(content).decode()
            elif part == _MAP_VALUE and isinstance(content, memoryview):
                value = content
        if value is None:
            continue
        for part, content in fields(value):
            if part == _ARRAY_VALUE and isinstance(content, memoryview):
                data = [d for n, d in fields(content) if n == _ARRAY_DATA and isinstance(d, memoryview)]
                views[name] = data[-1] if data else memoryview(b"")
    return views
