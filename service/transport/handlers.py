"""How outrig.v1.Space's methods meet gRPC: each method's request deserializer and reply
serializer, and their registration on a server (`add_to_server`).

The table is outrig._protocol.METHODS, read from the generated descriptors; nothing here lists
the methods. What a method's messages carry decides how they cross:
- a request that carries entries (a field of type outrig.v1.Entry: Write, WriteMany) arrives as a
  `Received`, the message and the bytes it was decoded from, so that the server keeps each entry
  as the bytes it arrived as (service/protocol/wire.py: `entry_encodings`);
- a reply that carries entries (Read, Take, ReadMany, TakeMany, Contents, Notify) leaves as the
  bytes the servicer built around the stored payloads, passed through; other replies are messages,
  serialized.
Registering is otherwise what the generated `add_SpaceServicer_to_server` does, and Mux is
registered with bytes both ways (service/transport/mux.py reads and writes its frames).

Bytes that are no valid request are not an exception: gRPC answers a deserializer that raises
with UNKNOWN (and logs its traceback, for every such call), so each method's deserializer
(`decoding`, `receiving`; the Mux stream's operations use the same ones) returns an
`Undecodable` instead, which the servicer refuses INVALID_ARGUMENT before anything looks at the
request.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, Generic, TypeVar

import grpc
from google.protobuf import unknown_fields
from google.protobuf.message import DecodeError

from outrig._protocol import METHODS, MUX_METHOD, SERVICE, Method
from outrig.service.protocol import views, wire
from outrig.v1 import space_pb2 as pb

M = TypeVar("M")

#: The context of a call that runs an operation. What its `read` and `write` carry is left open:
#: an operation runs in its own unary call's context or in the Mux stream's that carried it, and
#: reads and writes nothing through it.
Context = grpc.aio.ServicerContext[Any, Any]
#: The context of a Mux call, registered with bytes both ways (`add_to_server`).
MuxContext = grpc.aio.ServicerContext[bytes, bytes]


class Received(Generic[M]):
    """A request message and the bytes it was decoded from (and, found once, its entries' bytes:
    views of `raw`, `wire.entry_encodings`, or for a small request copies, `views.entry_encodings`)."""

    __slots__ = ("_entries", "message", "raw", "suffix")

    def __init__(self, message: M, raw: bytes, entries: Sequence[bytes | memoryview] | None = None) -> None:
        self.message = message
        self.raw = raw
        self._entries = entries
        # Fields appended when the request is sent on (a partition's name: transport/routing.py).
        self.suffix = b""

    def encoded(self) -> bytes:
        """The request's bytes as they arrived, with `suffix` after them."""
        return b"".join((self.raw, self.suffix)) if self.suffix else bytes(self.raw)

    @property
    def entries(self) -> Sequence[bytes | memoryview]:
        if self._entries is None:
            self._entries = wire.entry_encodings(self.raw)
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


class StreamContext:
    """The context a Mux stream's operations see: the stream's own gRPC context, whose metadata
    (read for every operation: a token) is read from gRPC once, when the stream starts, since a
    call's metadata cannot change; so is the peer secret it presents (`peer_secret`: None if
    none, as the servicer's `peer_secret` finds it). Everything else is the stream's context's."""

    __slots__ = ("_context", "_metadata", "peer_secret")

    def __init__(self, context: MuxContext, peer_secret: str | None) -> None:
        self._context = context
        self._metadata = context.invocation_metadata()
        self.peer_secret = peer_secret

    def invocation_metadata(self) -> Any:
        return self._metadata

    def __getattr__(self, name: str) -> Any:
        return getattr(self._context, name)


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


def decoding(message_type: Any) -> Callable[[bytes], Any]:
    """The deserializer of a request type: the message, or an `Undecodable`."""
    parse = message_type.FromString

    def deserialize(raw: bytes) -> Any:
        try:
            return parse(raw)
        except DecodeError as err:
            return undecodable(message_type, err)

    return deserialize


def _entries_field(message_type: Any) -> Any:
    """The field of a message class that carries entries (of type outrig.v1.Entry), or None."""
    for field in message_type.DESCRIPTOR.fields:
        if field.message_type is pb.Entry.DESCRIPTOR:
            return field
    return None


def receiving(message_type: Any) -> Callable[[bytes], Received[Any] | Undecodable]:
    """The deserializer of a request that carries entries (WriteRequest, WriteManyRequest): a
    `Received`, or an `Undecodable`. The request's tags are read as the server will read them
    again (`wire.entry_encodings`), which refuses what protobuf accepts as unknown fields and
    outrig's protocol has none of, groups; a small request with no unknown field needs no such
    reading (`_small`)."""
    field = _entries_field(message_type)
    if field is None or field.number != wire.ENTRY_FIELD:
        raise AssertionError(
            f"{message_type.DESCRIPTOR.full_name}: carries no entries in field {wire.ENTRY_FIELD}, "
            "the one wire.entry_encodings reads"
        )
    one_entry = not field.is_repeated
    parse = message_type.FromString
    tags = wire.one_byte_tags(message_type)

    def deserialize(raw: bytes) -> Received[Any] | Undecodable:
        try:
            if len(raw) > wire.VIEW_ARRAYS_ABOVE:
                entries = wire.entry_encodings(raw)
                decoded = wire.without_array_data(raw, one_entry=one_entry, entries=entries)
                return Received(parse(decoded), raw, entries)
            return _small(raw)
        except (DecodeError, ValueError) as err:
            return undecodable(message_type, err)

    def _small(raw: bytes) -> Received[Any]:
        """A small request: decoded, and its entries found by protobuf too (`views`: 12 against
        100 us for a write_many of 100 small entries), each as a copy of its bytes, unless it has
        fields outrig's messages do not (then `wire.entry_encodings` reads it, and refuses a
        group). What protobuf refuses is refused as `wire.entry_encodings` reads it first, as
        for a large one."""
        try:
            message = parse(raw)
        except DecodeError:
            wire.entry_encodings(raw)  # its ValueError, if it has one, names the fault
            raise
        if one_entry:  # a Write: its tags read in Python cost less than the second decode
            entries = wire.known_entries(raw, tags)
            if entries is not None:
                return Received(message, raw, entries)
        if unknown_fields.UnknownFieldSet(message):
            return Received(message, raw, wire.entry_encodings(raw))
        return Received(message, raw, views.entry_encodings(raw))

    return deserialize


def receives(method: Method) -> bool:
    """Whether `method`'s requests arrive as a `Received`: its request message carries entries."""
    return _entries_field(method.request) is not None


def answers_encoded(method: Method) -> bool:
    """Whether `method`'s replies are bytes the servicer encoded: its reply message carries
    entries."""
    return _entries_field(method.reply) is not None


def request_deserializer(method: Method) -> Callable[[bytes], Any]:
    """How `method`'s request is decoded, for a call of its own or a Mux stream's operation."""
    return receiving(method.request) if receives(method) else decoding(method.request)


def _passthrough(reply: bytes) -> bytes:
    return reply


def _serialize(message: Any) -> bytes:
    return message.SerializeToString()  # type: ignore[no-any-return]


#: The name of the Mux method in the service.
MUX = MUX_METHOD.rpartition("/")[2]


def _handler(servicer: object, method: Method) -> Callable[..., Any]:
    """The servicer's handler of `method`: an async method of its own (an async generator for a
    server-streaming one). The generated base class's stubs, which answer UNIMPLEMENTED, are no
    handler: a method the proto declares and the servicer does not serve is a bug."""
    handler = getattr(servicer, method.name, None)
    is_handler = inspect.isasyncgenfunction if method.streaming else inspect.iscoroutinefunction
    if handler is None or not is_handler(handler):
        kind = "an async generator method" if method.streaming else "an async method"
        raise AssertionError(
            f"{type(servicer).__name__} has no handler for {method.path} ({kind} {method.name})"
        )
    return handler  # type: ignore[no-any-return]


def add_to_server(
    servicer: object,
    server: grpc.aio.Server,
    mux: Callable[[AsyncIterator[bytes], MuxContext], Awaitable[None]],
) -> None:
    """Register `servicer`'s handler of each method of outrig.v1.Space on `server`, and `mux` as
    its Mux method (service/transport/mux.py), whose messages it reads and writes as bytes.
    AssertionError, naming it, if the servicer has no handler for a method."""
    handlers = {
        MUX: grpc.stream_stream_rpc_method_handler(
            mux, request_deserializer=_passthrough, response_serializer=_passthrough
        )
    }
    for method in METHODS.values():
        make: Callable[..., grpc.RpcMethodHandler[Any, Any]] = (
            grpc.unary_stream_rpc_method_handler if method.streaming else grpc.unary_unary_rpc_method_handler
        )
        handlers[method.name] = make(
            _handler(servicer, method),
            request_deserializer=request_deserializer(method),
            response_serializer=_passthrough if answers_encoded(method) else _serialize,
        )
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    server.add_registered_method_handlers(SERVICE, handlers)
