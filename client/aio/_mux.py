"""The asyncio client's Mux stream: the twin of `outrig._mux`, on the caller's event loop.

`AsyncMux.call(name, request)` stands for the unary call `name`. Callers queue their ops; one
sender task writes everything queued meanwhile as one message, and one reader task resolves each
caller's future as its result arrives, in whatever order the server completes operations. A
caller cancelled while it waits (``asyncio.wait_for``, say) tells the server to abandon its
operation. Beyond the server's limit of operations in flight, an operation goes as a unary call
(see `outrig._mux`). A stream that breaks fails its operations in flight with `UnavailableError`, which the
space's retry sends again on a new stream, with the same request id.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from typing import Any

import grpc
import grpc.aio
from google.protobuf.message import Message

from outrig._base import rpc_errors
from outrig._exceptions import UnavailableError, UnimplementedError
from outrig._mux_wire import (
    OP_FIELDS,
    batch_length,
    callables,
    closed,
    limit_of,
    outcome,
    stream_error,
    unsupported,
)
from outrig._protocol import DEFAULT_LIMIT, MAX_STREAM_REQUEST, encode_cancel, encode_op, request_message
from outrig.v1 import space_pb2 as pb

__all__ = ["AsyncMux"]


class _Stream:
    """One Mux call on the running loop: a sender task and a reader task."""

    def __init__(self, open_stream: Any, metadata: Sequence[tuple[str, str]]) -> None:
        self._call = open_stream(metadata=metadata or None)
        self._outbox: list[bytes] = []
        self._queued = asyncio.Event()
        self._waiting: dict[int, asyncio.Future[pb.MuxResult]] = {}
        self._next_id = 0
        self._limit = DEFAULT_LIMIT
        self._ready = asyncio.Event()  # the server's limit is known, or the stream has ended
        self.ended = False
        self.unsupported = False
        self._end_error: BaseException = UnavailableError("the stream ended")
        self._tasks = (asyncio.ensure_future(self._send()), asyncio.ensure_future(self._read()))

    async def call(self, field: int, data: bytes) -> Any:
        """The reply of one op; None at once when the server's limit is in flight."""
        if not self._ready.is_set():
            await self._ready.wait()
        if self.ended:
            raise stream_error(self._end_error)
        if len(self._waiting) >= self._limit:
            return None
        self._next_id += 1
        op_id = self._next_id
        future: asyncio.Future[pb.MuxResult] = asyncio.get_running_loop().create_future()
        self._waiting[op_id] = future
        self._outbox.append(encode_op(op_id, field, data))  # _queue, inline
        self._queued.set()
        try:
            result = await future
        except asyncio.CancelledError:
            if future.cancelled() and not self.ended:  # the caller gave up, not the stream
                self._queue(encode_cancel(op_id))  # its result, when it comes, frees its room
            raise
        return outcome(result)

    def _queue(self, op: bytes) -> None:
        self._outbox.append(op)
        self._queued.set()

    async def _send(self) -> None:
        await send_queued(self._call, self._outbox, self._queued)

    async def _read(self) -> None:
        error: BaseException
        try:
            self._limit = limit_of(await self._call.initial_metadata())
            self._ready.set()
            while True:
                reply = await self._call.read()
                if reply is grpc.aio.EOF:
                    break
                for result in reply.results:
                    future = self._waiting.pop(result.id, None)
                    if future is not None and not future.done():
                        future.set_result(result)
            error = UnavailableError("the server ended the stream")
            with contextlib.suppress(grpc.RpcError):
                await self._call  # the stream's status, if it was an error
        except asyncio.CancelledError:
            error = UnavailableError("the connection was closed")
        except grpc.RpcError as err:
            error = err
        self._end(error)

    def _end(self, error: BaseException) -> None:
        self.ended = True
        self.unsupported = unsupported(error)
        self._end_error = error
        waiting, self._waiting = self._waiting, {}
        self._ready.set()
        self._tasks[0].cancel()
        for future in waiting.values():
            if not future.done():
                future.set_exception(stream_error(error))

    def close(self) -> None:
        self._call.cancel()
        for task in self._tasks:
            task.cancel()


class AsyncMux:
    """The Mux stream of one asyncio connection (see the module's docstring)."""

    def __init__(self, channel: grpc.aio.Channel, metadata: Sequence[tuple[str, str]]) -> None:
        self._metadata = tuple(metadata)
        self._open_stream, self._unary = callables(channel)
        self._stream: _Stream | None = None
        self._supported = True
        self._closed = False

    async def call(self, name: str, request: Message) -> Any:
        """The reply of the unary call `name` for `request`, over the stream if it may."""
        data = request.SerializeToString()
        if len(data) <= MAX_STREAM_REQUEST and self._supported:
            stream = self._stream  # the usual case without a call; else as _current decides
            if stream is None or stream.ended or self._closed:
                stream = self._current()
            try:
                reply = await stream.call(OP_FIELDS[name], data)
                if reply is not None:
                    return reply
                # None: as many as the server allows are in flight (blocked takes, say): go unary
            except UnimplementedError:
                if not stream.unsupported:
                    raise
                self._supported = False  # a server without Mux: unary calls from now on
        with rpc_errors:
            return await self._unary[name](data, metadata=self._metadata or None)

    def _current(self) -> _Stream:
        if self._closed:
            raise closed()
        if self._stream is None or self._stream.ended:
            self._stream = _Stream(self._open_stream, self._metadata)
        return self._stream

    def close(self) -> None:
        self._closed = True
        if self._stream is not None:
            self._stream.close()

    def __del__(self) -> None:
        # A space dropped without close(): its stream's tasks hold the stream, not this object.
        stream = self._stream
        if stream is not None and not stream.ended:
            with contextlib.suppress(Exception):
                stream.close()


async def send_queued(call: Any, outbox: list[bytes], queued: asyncio.Event) -> None:
    """Write the operations queued in `outbox` to the Mux `call`, as many to a message as may go
    together (`batch_length`), waiting on `queued` while there are none, until the call fails: a
    failed write shows as the call's end, which its reader reports. (The server's peer streams
    send with it too: service/transport/peers.py.)"""
    with contextlib.suppress(grpc.RpcError, asyncio.InvalidStateError):
        while True:
            if not outbox:
                queued.clear()
                await queued.wait()
            count = batch_length(outbox)
            ops = outbox[:count]
            del outbox[:count]
            await call.write(request_message(ops))
