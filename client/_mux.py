"""The blocking client's Mux stream: every operation of a connection over one gRPC stream.

`Mux.call(name, request)` stands for the unary call `name`: the request goes out as a MuxOp
on the connection's stream (opened on first use, and again after it breaks), and the calling
thread waits for its result, in whatever order the server completes operations. Threads that
call at once share the stream; what they send while the stream's sender is busy goes out
together in one message.

The callers read the replies themselves, one at a time (leader and followers): the caller that
finds no one reading reads the stream's replies, hands each result to its caller, and stops once
its own has come, passing the reading on to a caller still waiting. gRPC's sync API sends a
stream's messages from a thread of its own, which cannot be helped; a reader thread of our own
was a second hand-off per operation, and a lone caller paid for both: about 1,000 us of client
CPU per write+take pair against 650 us over unary calls, a third of it the kernel waking threads
(docs/performance.md, "The sync SDK: callers read their own replies").

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
    """Where one operation's result arrives. Its caller waits on the lock (interruptibly) until
    the reader hands it a result or an error, or hands it the reading (`_Stream._signal`)."""

    __slots__ = ("error", "lock", "result", "signalled")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.lock.acquire()
        self.result: pb.MuxResult | None = None
        self.error: OutrigError | None = None
        self.signalled = False  # the lock is released and its caller has not yet seen why

    @property
    def done(self) -> bool:
        return self.result is not None or self.error is not None


class _Stream:
    """One Mux call: a queue of ops for gRPC's sending thread; its replies read by its callers."""

    def __init__(self, open_stream: Any, metadata: Sequence[tuple[str, str]]) -> None:
        # SimpleQueue is C code; gevent's monkey-patching replaces it with its own (loadtest/).
        self._outbox: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        self._lock = threading.Lock()  # guards all below, and every slot's result, error, signalled
        self._waiting: dict[int, _Slot] = {}  # ops in flight, whether or not their callers still wait
        self._followers: dict[int, _Slot] = {}  # callers waiting while another reads
        self._reading = False
        self._next_id = 0
        self._limit = DEFAULT_LIMIT
        self._limit_lock = threading.Lock()
        self._limit_known = False  # the server's limit, from the initial metadata
        self.ended = False
        self.unsupported = False
        self._end_error: BaseException = UnavailableError("the stream ended")
        self._call = open_stream(self._requests(), metadata=metadata or None)

    def done(self) -> bool:
        """Whether the call has ended (`ended`: and a reader has seen it end)."""
        return self.ended or bool(self._call.done())

    def call(self, field: int, data: bytes) -> Any:
        """The reply of one op; None at once when the server's limit is in flight."""
        if not self._limit_known:
            self._learn_limit()
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
            self._wait(op_id, slot)
        except BaseException:
            if not slot.done:
                self._outbox.put(encode_cancel(op_id))  # its result, when it comes, frees its room
            raise
        if slot.error is not None:
            raise slot.error
        assert slot.result is not None
        return outcome(slot.result)

    def _learn_limit(self) -> None:
        with self._limit_lock:
            if not self._limit_known:
                # Empty if the call failed: its first read then says why.
                self._limit = limit_of(self._call.initial_metadata())
                self._limit_known = True

    def _wait(self, op_id: int, slot: _Slot) -> None:
        """Until `slot` is done: as the reader if no one reads, else as a follower."""
        while True:
            with self._lock:
                if slot.done:
                    return
                leading = not self._reading
                if leading:
                    self._reading = True
                else:
                    self._followers[op_id] = slot
            if leading:
                try:
                    self._read_until(slot)
                finally:
                    with self._lock:
                        self._reading = False
                        self._pass_reading()
                return
            try:
                slot.lock.acquire()  # a result, an error, or the reading handed to this caller
            except BaseException:
                with self._lock:
                    del self._followers[op_id]
                    self._pass_reading()  # in case it was handed the reading: another reads
                raise
            with self._lock:
                slot.signalled = False
                del self._followers[op_id]

    def _read_until(self, slot: _Slot) -> None:
        """Read replies and hand their results over until `slot` is done or the stream ends."""
        error: BaseException
        try:
            while not slot.done:
                reply = next(self._call)
                with self._lock:
                    for result in reply.results:
                        waiting = self._waiting.pop(result.id, None)
                        if waiting is not None:
                            waiting.result = result
                            self._signal(waiting)
            return
        except StopIteration:
            error = UnavailableError("the server ended the stream")
        except Exception as err:
            error = err
        self._end(error)

    def _signal(self, slot: _Slot) -> None:
        """Wake `slot`'s caller, if it is not awake already (with the lock held)."""
        if not slot.signalled:
            slot.signalled = True
            slot.lock.release()

    def _pass_reading(self) -> None:
        """With the lock held: if no one reads, wake a follower to read."""
        if self._reading:
            return
        for follower in self._followers.values():
            if not follower.done:
                self._signal(follower)
                return

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
            count = batch_length(pending)
            yield request_message(pending[:count])
            del pending[:count]

    def _end(self, error: BaseException) -> None:
        with self._lock:
            self.ended = True
            self.unsupported = unsupported(error)
            self._end_error = error
            waiting, self._waiting = self._waiting, {}
            for slot in waiting.values():
                slot.error = stream_error(error)
                self._signal(slot)

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
            if self._stream is None or self._stream.done():
                self._stream = _Stream(self._open_stream, self._metadata)
            return self._stream

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if self._stream is not None:
                self._stream.close()

    def __del__(self) -> None:
        # A space dropped without close(): gRPC's sending thread holds the stream, not this
        # object, so end the stream here, or the thread and the channel would outlive it.
        stream = self._stream
        if stream is not None and not stream.ended:
            with contextlib.suppress(Exception):
                stream.close()
