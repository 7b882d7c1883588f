"""Calls forwarded to the other servers of a tier: one grpc.aio channel per peer address, and on it
one Mux stream, kept for as long as the server runs (`Peers.close` at its stop).

A call that reaches a server which does not serve its space (`SpaceBackend.locate` names another
address) is made again, as the same method with the same request bytes, on the server that does:
`Peers.unary` and `Peers.stream` (Contents, Notify). The forwarded call presents the tier's secret
in the `outrig-peer` metadata (`PEER_KEY`), which tells the owner that the forwarding server has
checked the caller's credentials and grants already (docs/security.md, "Forwarded calls"), and that
the call is not to be forwarded again. Replies cross as the local method would return them: the
encoded bytes for a method whose reply carries entries (the owner built them around the stored
payloads), else the reply message. A forwarded call ends as the owner ended it (its status,
message, reason and ErrorInfo metadata: the servicer's `Failure.forwarded`, or `PeerError` for an
operation of a peer stream), and is cancelled when the caller's is: a unary operation is awaited
by the task that serves the caller's call or Mux operation, which gRPC or the Mux stream cancels;
a stream is cancelled by the servicer when the caller's ends first.

A unary operation goes over the peer's Mux stream (`PeerStream`), as an SDK's do over theirs
(docs/architecture.md, "The Mux stream"): an operation there costs both servers far less than a
unary call. The stream is opened with `outrig-peer` in its metadata, so at the owner every
operation on it counts as forwarded (the servicer's `admit` reads the secret of a Mux operation
from its stream's metadata). An operation goes as a unary call of its own instead when its request
is over the stream's limit (MAX_STREAM_REQUEST, as in the SDK), when as many operations as the
owner allows on a stream (`outrig-max-stream-ops`) are in flight, or when the owner has no Mux
method. A caller's deadline bounds its operation (then cancelled at the owner: a cancel op, as
when the caller's call is cancelled, and DEADLINE_EXCEEDED). A stream that breaks (the owner
stopped, the connection dropped) fails its operations in flight with UNAVAILABLE, which the SDK
retries with their request ids, and the next operation opens a new one.

The channels speak TLS when the server does (security.settings.peer_credentials), else plaintext.
"""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import grpc.aio

from outrig._mux_wire import limit_of
from outrig._protocol import (
    DEFAULT_LIMIT,
    MAX_STREAM_REQUEST,
    METHODS,
    MUX_METHOD,
    Method,
    encode_cancel,
    encode_op,
)
from outrig.aio._mux import send_queued
from outrig.service.config import ServerConfig
from outrig.service.protocol import wire
from outrig.service.security.settings import peer_credentials
from outrig.service.transport import handlers
from outrig.v1 import space_pb2 as pb

#: The metadata key of a forwarded call: the tier's secret (`SpaceBackend.peer_secret`).
PEER_KEY = "outrig-peer"

_RESULTS = pb.MuxReply.DESCRIPTOR.fields_by_name["results"].number
_RESULT_ID = pb.MuxResult.DESCRIPTOR.fields_by_name["id"].number
_ERROR = pb.MuxResult.DESCRIPTOR.fields_by_name["error"].number
_CODES = {code.value[0]: code for code in grpc.StatusCode}
#: Whether each method's local reply is the encoded bytes (its reply message carries entries).
_ENCODED = {name: handlers.answers_encoded(method) for name, method in METHODS.items()}


def request_bytes(request: Any) -> bytes:
    """A decoded request as the bytes to forward: a `handlers.Received`'s own (as they arrived),
    else the message serialized."""
    if isinstance(request, handlers.Received):
        return request.encoded()
    encoded: bytes = request.SerializeToString()
    return encoded


class PeerError(Exception):
    """How an operation forwarded over a peer stream failed: the owner's MuxError as it is (status,
    message, reason, ErrorInfo metadata), or UNAVAILABLE when the stream broke first."""

    def __init__(
        self, code: grpc.StatusCode, message: str, reason: int = 0, metadata: dict[str, str] | None = None
    ) -> None:
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message
        self.reason = reason
        self.metadata = metadata or {}

    @classmethod
    def of(cls, error: pb.MuxError) -> PeerError:
        return cls(
            _CODES.get(error.code, grpc.StatusCode.UNKNOWN), error.message, error.reason, dict(error.metadata)
        )


def parse_reply(raw: bytes) -> list[tuple[int, int, memoryview]]:
    """(id, MuxResult field, that field's bytes) for each result of an encoded MuxReply (field 0
    for a result that carries none); ValueError if malformed (`wire.fields`)."""
    results: list[tuple[int, int, memoryview]] = []
    for number, result in wire.fields(memoryview(raw)):
        if number != _RESULTS:
            continue
        if not isinstance(result, memoryview):
            raise ValueError("results: not a message")
        op_id, field, value = 0, 0, memoryview(b"")
        for part, content in wire.fields(result):
            if part == _RESULT_ID:
                if not isinstance(content, int):
                    raise ValueError("id: not a varint")
                op_id = content
            elif isinstance(content, memoryview):  # a oneof: the last one wins, as in protobuf
                field, value = part, content
        results.append((op_id, field, value))
    return results


class PeerStream:
    """One Mux stream to a peer, opened with the tier's secret: callers queue their operations, one
    sender task writes everything queued meanwhile as one message, one reader task hands each
    caller the bytes of its result (the twin of the SDK's outrig.aio._mux, on raw bytes both ways:
    the owner's encoded replies are passed on as they came)."""

    def __init__(self, channel: grpc.aio.Channel, address: str, secret: str) -> None:
        self.address = address
        open_stream: Any = channel.stream_stream(
            MUX_METHOD, request_serializer=None, response_deserializer=None
        )
        self._call = open_stream(metadata=((PEER_KEY, secret),))
        self._outbox: list[bytes] = []
        self._queued = asyncio.Event()
        self._waiting: dict[int, asyncio.Future[tuple[int, memoryview]]] = {}
        self._next_id = 0
        self._limit = DEFAULT_LIMIT
        self._ready = asyncio.Event()  # the owner's limit is known, or the stream has ended
        self.ended = False
        self.unsupported = False  # the owner has no Mux method: unary calls to it
        self._why = ""
        self._tasks = (asyncio.ensure_future(self._send()), asyncio.ensure_future(self._read()))

    @property
    def in_flight(self) -> int:
        """Operations sent or queued whose result has not come (a cancelled one's included)."""
        return len(self._waiting)

    async def call(self, field: int, data: bytes) -> tuple[int, memoryview] | None:
        """The MuxResult field and bytes of one operation; None when it is to go as a unary call
        (as many as the owner allows are in flight, or the owner has no Mux method); PeerError
        UNAVAILABLE if the stream breaks first."""
        if not self._ready.is_set():
            await self._ready.wait()
        if self.ended:
            if self.unsupported:
                return None
            raise self._broken()
        if len(self._waiting) >= self._limit:
            return None
        self._next_id += 1
        op_id = self._next_id
        future: asyncio.Future[tuple[int, memoryview]] = asyncio.get_running_loop().create_future()
        self._waiting[op_id] = future
        self._queue(encode_op(op_id, field, data))
        try:
            return await future
        except asyncio.CancelledError:
            if future.cancelled() and not self.ended:  # the caller gave up, not the stream
                self._queue(encode_cancel(op_id))  # its result, when it comes, frees its room
            raise

    def _queue(self, op: bytes) -> None:
        self._outbox.append(op)
        self._queued.set()

    def _broken(self) -> PeerError:
        return PeerError(
            grpc.StatusCode.UNAVAILABLE, f"forwarded to {self.address}: the peer stream ended ({self._why})"
        )

    async def _send(self) -> None:
        await send_queued(self._call, self._outbox, self._queued)

    async def _read(self) -> None:
        why = "the owner ended it"
        try:
            self._limit = limit_of(await self._call.initial_metadata())
            self._ready.set()
            while True:
                raw = await self._call.read()
                if raw is grpc.aio.EOF:
                    code = await self._call.code()
                    if code != grpc.StatusCode.OK:
                        why = f"{code.name}: {await self._call.details()}"
                    break
                assert isinstance(raw, bytes)  # no deserializer: the MuxReply's bytes
                for op_id, field, value in parse_reply(raw):
                    future = self._waiting.pop(op_id, None)
                    if future is not None and not future.done():
                        future.set_result((field, value))
        except asyncio.CancelledError:
            why = "this server is stopping"
        except grpc.RpcError as err:
            code = err.code()
            self.unsupported = code == grpc.StatusCode.UNIMPLEMENTED
            why = f"{code.name}: {err.details()}"
        except ValueError as err:  # bytes that are no MuxReply
            why = f"a malformed MuxReply ({err})"
            self._call.cancel()
        self._end(why)

    def _end(self, why: str) -> None:
        self.ended = True
        self._why = why
        waiting, self._waiting = self._waiting, {}
        self._ready.set()
        self._tasks[0].cancel()
        for future in waiting.values():
            if not future.done():
                future.set_exception(self._broken())

    def close(self) -> None:
        self._call.cancel()
        for task in self._tasks:
            task.cancel()


class Peers:
    """The channels to this server's peers, and a Mux stream on each, made on first use."""

    def __init__(self, config: ServerConfig) -> None:
        self._credentials = peer_credentials(config)
        limit = config.max_message_bytes
        self._options = [
            ("grpc.max_receive_message_length", limit),
            ("grpc.max_send_message_length", limit),
            # A peer that restarts is called again soon after, not after gRPC's back-off of up to
            # 120 s (the SDK's channels reconnect alike: outrig._base.channel_options).
            ("grpc.initial_reconnect_backoff_ms", 100),
            ("grpc.min_reconnect_backoff_ms", 100),
            ("grpc.max_reconnect_backoff_ms", 1000),
        ]
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._callables: dict[tuple[str, str], Any] = {}
        self._streams: dict[tuple[str, str], PeerStream] = {}
        self._unary_only: set[str] = set()  # peers without a Mux method
        self._closed = False

    def channel(self, address: str) -> grpc.aio.Channel:
        """The channel to `address` ("host:port"), made on first use."""
        channel = self._channels.get(address)
        if channel is None:
            if self._closed:
                raise RuntimeError("peers: closed (the server is stopping)")
            if self._credentials is None:
                channel = grpc.aio.insecure_channel(address, options=self._options)
            else:
                channel = grpc.aio.secure_channel(address, self._credentials, options=self._options)
            self._channels[address] = channel
        return channel

    def peer_stream(self, address: str, secret: str) -> PeerStream:
        """The Mux stream to `address` presenting `secret`: a new one if there was none or it ended."""
        key = (address, secret)
        stream = self._streams.get(key)
        if stream is None or stream.ended:
            stream = PeerStream(self.channel(address), address, secret)
            self._streams[key] = stream
        return stream

    def streams(self) -> list[PeerStream]:
        """The peer streams open now (for tests and figures)."""
        return [stream for stream in self._streams.values() if not stream.ended]

    def _callable(self, address: str, method: Method) -> Any:
        key = (address, method.name)
        found = self._callables.get(key)
        if found is None:
            channel = self.channel(address)
            # Requests go as bytes; an encoded reply stays bytes, any other is parsed.
            reply = None if handlers.answers_encoded(method) else method.reply.FromString
            make = channel.unary_stream if method.streaming else channel.unary_unary
            found = make(method.path, request_serializer=None, response_deserializer=reply)
            self._callables[key] = found
        return found

    async def unary(
        self, address: str, method: Method, request: Any, secret: str, timeout: float | None
    ) -> Any:
        """Forward a unary operation to `address`, over its peer stream if it may go there, else as
        a unary call: its reply (bytes or message), or PeerError or grpc.aio.AioRpcError as the
        owner ended it. Cancelling the awaiting task cancels the operation; `timeout` (seconds, the
        caller's time remaining) ends it with DEADLINE_EXCEEDED."""
        data = request_bytes(request)
        if (
            method.op_field is not None
            and len(data) <= MAX_STREAM_REQUEST
            and address not in self._unary_only
        ):
            loop = asyncio.get_running_loop()
            deadline = None if timeout is None else loop.time() + timeout
            stream = self.peer_stream(address, secret)
            try:
                async with asyncio.timeout_at(deadline):
                    outcome = await stream.call(method.op_field, data)
            except TimeoutError:
                raise PeerError(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded") from None
            if outcome is not None:
                return _reply(method, *outcome)
            if stream.unsupported:
                self._unary_only.add(address)
            if deadline is not None:
                timeout = max(0.0, deadline - loop.time())
        call = self._callable(address, method)
        return await call(data, metadata=((PEER_KEY, secret),), timeout=timeout)

    def stream(self, address: str, method: Method, request: Any, secret: str, timeout: float | None) -> Any:
        """Forward a server-streaming call to `address`: the call, to iterate for its replies (its
        error, grpc.aio.AioRpcError, as the owner ended it), and to cancel when the caller's ends
        first (the servicer's `streaming` wrapper does, in a `finally`)."""
        return self._callable(address, method)(
            request_bytes(request), metadata=((PEER_KEY, secret),), timeout=timeout
        )

    async def close(self) -> None:
        """Close every peer stream and channel (at the server's stop): operations still on them end
        UNAVAILABLE, calls CANCELLED."""
        self._closed = True
        streams, self._streams = list(self._streams.values()), {}
        for stream in streams:
            stream.close()
        channels, self._channels = list(self._channels.values()), {}
        self._callables.clear()
        for channel in channels:
            await channel.close()


def _reply(method: Method, field: int, value: memoryview) -> Any:
    """A peer stream's result as the local method would return it: the encoded bytes for a reply
    that carries entries, else the message; its error as a PeerError."""
    if field == _ERROR:
        raise PeerError.of(pb.MuxError.FromString(bytes(value)))
    if field != method.result_field:
        raise PeerError(
            grpc.StatusCode.UNAVAILABLE, f"the peer answered {method.name} with MuxResult field {field}"
        )
    data = bytes(value)
    if _ENCODED[method.name]:
        return data
    return method.reply.FromString(data)
