"""Replies that carry entries, encoded straight from the stored payloads.

The server keeps each entry as its payload: the bytes of its `outrig.v1.Entry` encoding, framed
as field 1 of a MatchReply (a tag and a length in front, see `frame`). A small entry costs about
90 bytes that way, against about 1.2 KB as a protobuf object. MatchReply and ContentsReply are
`repeated Entry entries = 1`, so a reply carrying one entry *is* its payload (no copy at all, which
matters for a 3.6 MB entry) and a reply carrying several is their concatenation. An event
(NotifyReply `sequence = 2, entry = 3`) takes one copy. None of it does protobuf work.

The other way, a write keeps each entry as the bytes it arrived as: Write and WriteMany are
decoded into a `Received` (the message and its bytes), and `entry_encodings` finds each entry's
bytes in the request by reading its top-level tags, without decoding or re-encoding an entry
(re-encoding a 3.6 MB entry measured 5 ms inside the server); framing it is the one copy.

`add_to_server` registers the servicer like the generated `add_SpaceServicer_to_server`, except
that the methods answering with such bytes get a serializer that passes them through, the
writes get a `Received`, and bytes that are no valid request are not an exception: gRPC answers
a deserializer that raises with UNKNOWN (and logs its traceback, for every such call), so each
method's deserializer (`decoding`, `receiving`, the Mux stream's too) returns an `Undecodable`
instead, which the servicer refuses INVALID_ARGUMENT before anything looks at the request.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

import grpc
from google.protobuf.message import DecodeError

from outrig.v1 import space_pb2 as pb

SERVICE = "outrig.v1.Space"

_ENTRIES = b"\x0a"  # field 1, length-delimited: MatchReply.entries, ContentsReply.entries
_SEQUENCE = b"\x10"  # field 2, varint: NotifyReply.sequence
_EVENT_ENTRY = b"\x1a"  # field 3, length-delimited: NotifyReply.entry


def varint(value: int) -> bytes:
    if value < 0x80:
        return bytes((value,))
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def frame(entry: bytes | memoryview) -> bytes:
    """An entry's payload: its encoding framed as a MatchReply's field 1 (one copy)."""
    return b"".join((_ENTRIES, varint(len(entry)), entry))


def unframed(payload: bytes) -> memoryview:
    """The entry's encoding inside a payload (no copy)."""
    start = 1
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
    entry = unframed(payload)
    return b"".join((_SEQUENCE, varint(sequence), _EVENT_ENTRY, varint(len(entry)), entry))


M = TypeVar("M")

_ENTRY_FIELD = 2  # WriteRequest.entry, WriteManyRequest.entries


class Received(Generic[M]):
    """A request message and the bytes it was decoded from (and, found once, its entries' bytes:
    `entry_encodings`)."""

    __slots__ = ("_entries", "message", "raw")

    def __init__(self, message: M, raw: bytes, entries: list[memoryview] | None = None) -> None:
        self.message = message
        self.raw = raw
        self._entries = entries

    @property
    def entries(self) -> list[memoryview]:
        if self._entries is None:
            self._entries = entry_encodings(self.raw)
        return self._entries


class Undecodable:
    """What a deserializer returns for bytes that are no valid request of its type, in place of the
    message: the type's full name, and why (protobuf's words, or the server's own reading of a
    write's tags). `too_deep` when it is nesting past protobuf's parse limit."""

    __slots__ = ("message_type", "reason", "too_deep")

    def __init__(self, message_type: str, reason: str, *, too_deep: bool = False) -> None:
        self.message_type = message_type
        self.reason = reason
        self.too_deep = too_deep


# "Error parsing message with type 'outrig.v1.WriteRequest': Wire format was corrupt": the
# type is said by the refusal already.
_PARSE_ERROR = re.compile(r"Error parsing message(?: with type '[^']*')?:?\s*")
# How protobuf's parsers say a message nests past their limit: upb's "Exceeded
# upb_DecodeOptions_MaxDepth", the pure-Python one's "too many levels of nesting".
_TOO_DEEP = re.compile(r"MaxDepth|nesting|recursion", re.IGNORECASE)


def undecodable(message_type: Any, err: Exception) -> Undecodable:
    """The `Undecodable` for a decode failure of `message_type` (a generated message class)."""
    reason = _PARSE_ERROR.sub("", str(err), count=1).strip() or type(err).__name__
    return Undecodable(message_type.DESCRIPTOR.full_name, reason, too_deep=bool(_TOO_DEEP.search(reason)))


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
    field 2 (no copy)."""
    return [
        value
        for number, value in fields(memoryview(raw))
        if number == _ENTRY_FIELD and isinstance(value, memoryview)
    ]


# Entry.fields = 3 (map entries: key = 1, value = 2); Value.array_value = 7; TypedArray.data = 2.
_ENTRY_FIELDS, _MAP_KEY, _MAP_VALUE, _ARRAY_VALUE, _ARRAY_DATA = 3, 1, 2, 7, 2
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


def without_array_data(raw: bytes, *, one_entry: bool, entries: Sequence[memoryview] | None = None) -> bytes:
    """A Write (`one_entry`) or WriteMany request's bytes to decode: each entry larger than
    VIEW_ARRAYS_ABOVE without its typed arrays' data, which the server reads through views of
    `raw` instead (`array_views`). Decoding them would copy every array (3.6 MB for an HD
    frame) only to throw the copy away. `raw` itself when nothing is left out, or when a Write
    has its entry field more than once (the decoder merges those, and the server then encodes
    the merged entry from the decoded message, which needs the data). `entries`: the request's
    `entry_encodings`, if already found. ValueError if `raw` is not protobuf's."""
    if one_entry and len(entry_encodings(raw) if entries is None else entries) != 1:
        return raw
    decoded = _without(memoryview(raw), (_ENTRY_FIELD, *_ARRAY_DATA_PATH), above=VIEW_ARRAYS_ABOVE)
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


def _passthrough(reply: bytes) -> bytes:
    return reply


def _serialize(message: Any) -> bytes:
    return message.SerializeToString()  # type: ignore[no-any-return]


# method: (kind, request type, answers with encoded bytes)
_METHODS: dict[str, tuple[str, Any, bool]] = {
    "Write": ("unary", pb.WriteRequest, False),  # requests arrive as Received (see _RECEIVED)
    "WriteMany": ("unary", pb.WriteManyRequest, False),
    "Read": ("unary", pb.MatchRequest, True),
    "Take": ("unary", pb.MatchRequest, True),
    "ReadMany": ("unary", pb.MatchRequest, True),
    "TakeMany": ("unary", pb.MatchRequest, True),
    "Contents": ("stream", pb.ContentsRequest, True),
    "Count": ("unary", pb.CountRequest, False),
    "Notify": ("stream", pb.NotifyRequest, True),
    "RenewLeases": ("unary", pb.RenewLeasesRequest, False),
    "CancelLeases": ("unary", pb.CancelLeasesRequest, False),
    "Begin": ("unary", pb.BeginRequest, False),
    "Commit": ("unary", pb.EndRequest, False),
    "Abort": ("unary", pb.EndRequest, False),
}


_RECEIVED = frozenset({"Write", "WriteMany"})


def decoding(message_type: Any) -> Callable[[bytes], Any]:
    """The deserializer of a request type: the message, or an `Undecodable`."""
    parse = message_type.FromString

    def deserialize(raw: bytes) -> Any:
        try:
            return parse(raw)
        except DecodeError as err:
            return undecodable(message_type, err)

    return deserialize


def receiving(message_type: Any) -> Callable[[bytes], Received[Any] | Undecodable]:
    """The deserializer of a write (WriteRequest, WriteManyRequest): a `Received`, or an
    `Undecodable`. The request's tags are read first (`entry_encodings`), which also checks them
    as the server will read them again: protobuf accepts, as unknown fields, groups that outrig's
    protocol has none of."""
    one_entry = message_type is pb.WriteRequest
    parse = message_type.FromString

    def deserialize(raw: bytes) -> Received[Any] | Undecodable:
        try:
            entries = entry_encodings(raw)
            decoded = (
                raw
                if len(raw) <= VIEW_ARRAYS_ABOVE
                else without_array_data(raw, one_entry=one_entry, entries=entries)
            )
            return Received(parse(decoded), raw, entries)
        except (DecodeError, ValueError) as err:
            return undecodable(message_type, err)

    return deserialize


def add_to_server(
    servicer: object, server: grpc.aio.Server, mux: Callable[[Any, grpc.aio.ServicerContext], Any]
) -> None:
    """Register `servicer`'s methods for outrig.v1.Space on `server`, and `mux` as its Mux method
    (service/transport/mux.py), whose messages it reads and writes as bytes."""
    handlers = {
        "Mux": grpc.stream_stream_rpc_method_handler(
            mux, request_deserializer=_passthrough, response_serializer=_passthrough
        )
    }
    for name, (kind, request, encoded) in _METHODS.items():
        make: Callable[..., grpc.RpcMethodHandler] = (
            grpc.unary_unary_rpc_method_handler if kind == "unary" else grpc.unary_stream_rpc_method_handler
        )
        handlers[name] = make(
            getattr(servicer, name),
            request_deserializer=receiving(request) if name in _RECEIVED else decoding(request),
            response_serializer=_passthrough if encoded else _serialize,
        )
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    server.add_registered_method_handlers(SERVICE, handlers)
