"""The blocking client's Mux stream: every operation of a connection over one gRPC stream.

`Mux.call(name, request)` stands for the unary call `name`: the request goes out as a MuxOp
on the connection's stream (opened on first use, and again after it breaks), and the calling
thread waits for its result, which a reader thread hands over as it arrives, in whatever order
the server completes operations. Threads that call at once share the stream; what they send
while the stream's sender is busy goes out together in one message.

A stream that breaks fails its operations in flight with `UnavailableError`, which the space's
retry (`Space._call`) sends again on a new stream, with the same request id. A thread that stops
waiting (KeyboardInterrupt, say) tells the server to abandon its operation. At most the server's
limit of operations (`outrig-max-stream-ops`) are in flight: an operation beyond it goes as a
unary call instead of waiting for room, so a stream full of blocked takes cannot hold up the
writes that would end them. Requests over `MAX_STREAM_REQUEST` go as unary calls too, and so
does everything on a server that has no Mux method.
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import grpc
from google.protobuf.message import Message

from outrig._base import rpc_errors
from outrig._exceptions import OutrigError, UnavailableError, UnimplementedError
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

__all__ = ["Mux"]


class _Slot:
    """Where one operation's result arrives; its caller waits on the lock (interruptibly). The
    reader sets `result` and releases the lock itself (a call fewer per result); `fail` ends it
    with an error."""

    __slots__ = ("error", "lock", "result")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.lock.acquire()
        self.result: pb.MuxResult | None = None
        self.error: OutrigError | None = None

    def fail(self, error: OutrigError) -> None:
        self.error = error
        self.lock.release()


class _Stream:
    """One Mux call: a queue of ops for gRPC's sending thread, a reader thread for the results."""

    def __init__(self, open_stream: Any, metadata: Sequence[tuple[str, str]]) -> None:
        # SimpleQueue is C code; gevent's monkey-patching replaces it with its own (loadtest/).
        self._outbox: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._waiting: dict[int, _Slot] = {}
        self._next_id = 0
        self._limit = DEFAULT_LIMIT
        self._ready = threading.Event()  # the server's limit is known, or the stream has ended
        self._known = False  # _ready is set: read without Event.wait's condition, once it is
        self.ended = False
        self.unsupported = False
        self._end_error: BaseException = UnavailableError("the stream ended")
        self._call = open_stream(self._requests(), metadata=metadata or None)
        threading.Thread(target=self._read, name="outrig-mux-reader", daemon=True).start()

    def call(self, field: int, data: bytes) -> Any:
        """The reply of one op; None at once when the server's limit is in flight."""
        if not self._known:
            self._ready.wait()
        slot = _Slot()
        with self._lock:
            if self.ended:
                raise stream_error(self._end_error)
            if len(self._waiting) >= self._limit:
                return None
            self._next_id += 1
            op_id = self._next_id
            self._waiting[op_id] = slot
        self._outbox.put(encode_op(op_id, field, data))
        try:
            slot.lock.acquire()
        except BaseException:
            if slot.result is None and slot.error is None:
                self._outbox.put(encode_cancel(op_id))  # its result, when it comes, frees its room
            raise
        if slot.error is not None:
            raise slot.error
        assert slot.result is not None
        return outcome(slot.result)

    def _requests(self) -> Iterator[bytes]:
        """What gRPC's sending thread sends: the ops queued meanwhile, in one message as far as
        `batch_length` lets them (the rest go in the next)."""
        outbox = self._outbox
        pending: list[bytes] = []
        ending = False
        while pending or not ending:
            if not pending:
                op = outbox.get()
                if op is None:
                    return
                pending.append(op)
            while not ending and not outbox.empty():
                op = outbox.get_nowait()
                if op is None:
                    ending = True
                else:
                    pending.append(op)
            count = 1 if len(pending) == 1 else batch_length(pending)  # one op: a blocking caller's
            yield request_message(pending[:count])
            del pending[:count]

    def _read(self) -> None:
        error: BaseException
        try:
            self._limit = limit_of(self._call.initial_metadata())
            self._ready.set()
            self._known = True
            for reply in self._call:
                for result in reply.results:
                    with self._lock:
                        slot = self._waiting.pop(result.id, None)
                    if slot is not None:
                        slot.result = result  # _Slot.set, inline: a call fewer per result
                        slot.lock.release()
            error = UnavailableError("the server ended the stream")
        except BaseException as err:
            error = err
        self._end(error)

    def _end(self, error: BaseException) -> None:
        with self._lock:
            self.ended = True
            self.unsupported = unsupported(error)
            self._end_error = error
            waiting, self._waiting = self._waiting, {}
        self._ready.set()
        self._known = True
        for slot in waiting.values():
            slot.fail(stream_error(error))

    def close(self) -> None:
        self._outbox.put(None)
        self._call.cancel()


class Mux:
    """The Mux stream of one connection (see the module's docstring)."""

    def __init__(self, channel: grpc.Channel, metadata: Sequence[tuple[str, str]]) -> None:
        self._metadata = tuple(metadata)
        self._open_stream, self._unary = callables(channel)
        self._lock = threading.Lock()
        self._stream: _Stream | None = None
        self._supported = True
        self._closed = False

    def call(self, name: str, request: Message) -> Any:
        """The reply of the unary call `name` for `request`, over the stream if it may."""
        data = request.SerializeToString()
        if len(data) <= MAX_STREAM_REQUEST and self._supported:
            stream = self._stream  # the usual case without _current's lock; else as it decides
            if stream is None or stream.ended or self._closed:
                stream = self._current()
            try:
                reply = stream.call(OP_FIELDS[name], data)
                if reply is not None:
                    return reply
                # None: as many as the server allows are in flight (blocked takes, say): go unary
            except UnimplementedError:
                if not stream.unsupported:
                    raise
                self._supported = False  # a server without Mux: unary calls from now on
        with rpc_errors:
            return self._unary[name](data, metadata=self._metadata or None)

    def _current(self) -> _Stream:
        with self._lock:
            if self._closed:
                raise closed()
            if self._stream is None or self._stream.ended:
                self._stream = _Stream(self._open_stream, self._metadata)
            return self._stream

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if self._stream is not None:
                self._stream.close()

    def __del__(self) -> None:
        # A space dropped without close(): its stream's reader thread holds the stream, not this
        # object, so end the stream here, or the thread and the channel would outlive it.
        stream = self._stream
        if stream is not None and not stream.ended:
            with contextlib.suppress(Exception):
                stream.close()
