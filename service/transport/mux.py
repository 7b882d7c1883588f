"""The Mux stream: many operations in flight over one bidirectional stream (`outrig.v1.Space/Mux`).

A unary call costs a Python gRPC client and server far more than the operation it carries (see
docs/performance.md). On a Mux stream each `MuxOp` is one message's worth of bytes instead: the
request of a unary method, tagged with an id. Each runs as a task through
`SpaceServicer.perform`, the very code a unary call runs (the guard, the method, metrics), so
security, quotas, idempotent retries and durability cannot differ. Its result is queued as soon
as it completes, in any order, and one writer sends whatever results are ready in one MuxReply:
under load a message carries many (the busier the stream, the fuller the messages).

An operation whose waits bind no task on a lone server (a write, a count, a lease's renewal or
cancellation, a read or take: `runs_eagerly`) starts at once, in the reader's step, and gets a
task of its own only if it does wait after all (a durable write waits for its commit, a take that
finds nothing parks; its deadline is a timer of the loop's): most of them finish without one.
Only on a lone server (no workers, not the PostgreSQL tier): a forwarded call enters
`asyncio.timeout`, which binds the task current when it is entered, and that must be the
operation's own. The stream keeps one reference
to its loop (`loop.create_task`, `loop.create_future`): in Python 3.11 every
`asyncio.get_running_loop()` (and so `ensure_future`, `Future()`, `Event.wait`) is a getpid(2).

Flow control: an operation counts as in flight from the moment it is read until its result has
been handed to gRPC. While `Limits.max_stream_ops` are, the stream reads no further messages, so
a client that sends faster than it is answered, or reads its results too slowly, is held back by
HTTP/2 flow control instead of making the server buffer. The limit is announced in the initial
metadata (`outrig-max-stream-ops`); operations of one message beyond it fail RESOURCE_EXHAUSTED.

Requests are parsed without decoding them twice: `wire.fields` finds each operation's bytes in the
message, and only the operation's own request is decoded, by the deserializer its unary method has
(service/transport/handlers.py; writes as a `handlers.Received`): bytes that are no valid request
get the very answer of a unary call (`servicer.refusal`, through `perform`). Results are framed
around the replies' bytes, which for entries are the stored payloads (service/protocol/wire.py): no
protobuf work on the way out either.

Which operations there are, and the Mux messages' field numbers, tags, metadata key and batch
size, are outrig._protocol's, read from the proto's descriptors: the SDK frames the other side with
the same vocabulary.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
import types
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Generator, Mapping
from typing import Any, NamedTuple, cast

import grpc
from google.protobuf import descriptor_pb2
from google.protobuf.message import DecodeError

from outrig._protocol import BATCH_BYTES, LIMIT_KEY, OPS_BY_FIELD, tag, varint
from outrig.service.exceptions import InvalidArgumentError
from outrig.service.protocol import views, wire
from outrig.service.protocol.wire import ONE_BYTE_VARINTS
from outrig.service.transport import handlers
from outrig.service.transport.servicer import Failure, SpaceServicer, bounded, peer_secret
from outrig.v1 import space_pb2 as pb

log = logging.getLogger("outrig.service")

_CLOSING_WAIT = 1.0  # seconds a stream of a stopping server waits for its operations in flight

# The field numbers and tags of the Mux messages, from the descriptors (outrig._protocol frames
# the client's side with the same).
_MUX_OP = pb.MuxOp.DESCRIPTOR.fields_by_name
_MUX_RESULT = pb.MuxResult.DESCRIPTOR
_MUX_ERROR = pb.MuxError.DESCRIPTOR.fields_by_name
_OP_ID = _MUX_OP["id"].number
_CANCEL = _MUX_OP["cancel"].number
_OPS = pb.MuxRequest.DESCRIPTOR.fields_by_name["ops"].number
_RESULT_ID = tag(_MUX_RESULT.fields_by_name["id"])
#: The tag of each MuxResult field that carries a reply or an error, by its number.
_RESULT_TAGS = {field.number: tag(field) for field in _MUX_RESULT.oneofs_by_name["result"].fields}
_ERROR = _MUX_RESULT.fields_by_name["error"].number
_CODE = tag(_MUX_ERROR["code"])
_MESSAGE = tag(_MUX_ERROR["message"])
_REASON = tag(_MUX_ERROR["reason"])
_METADATA = tag(_MUX_ERROR["metadata"])
_METADATA_ENTRY = pb.MuxError.MetadataEntry.DESCRIPTOR.fields_by_name  # the map's entry message
_METADATA_KEY = tag(_METADATA_ENTRY["key"])
_METADATA_VALUE = tag(_METADATA_ENTRY["value"])
_RESULTS = tag(pb.MuxReply.DESCRIPTOR.fields_by_name["results"])


class Operation(NamedTuple):
    """What a MuxOp field stands for: its unary method, the method's request type, how its request
    is decoded from a view of its bytes (as on the unary path: the message, a
    `handlers.Received` for a write, or a `handlers.Undecodable`), and the MuxResult field of its
    reply."""

    name: str
    request: Any
    decode: Callable[[Any], Any]
    result_field: int


def _operations() -> dict[int, Operation]:
    operations: dict[int, Operation] = {}
    for field, method in OPS_BY_FIELD.items():
        # OPS_BY_FIELD lists the methods a MuxOp field carries, each with its MuxResult field.
        assert field is not None
        assert method.result_field is not None
        operations[field] = Operation(
            method.name, method.request, handlers.request_deserializer(method), method.result_field
        )
    return operations


#: The operation of each MuxOp field (outrig._protocol.OPS_BY_FIELD).
OPERATIONS = _operations()

#: Operations whose waits on a lone server bind no task: a durable store's commit, a parked read's
#: or take's delivery and its deadline (a timer of the loop's: memory/backend.py's `_find`). They
#: start at once, in the reader's step (`runs_eagerly`).
EAGER = frozenset(
    {"Write", "WriteMany", "Count", "RenewLeases", "CancelLeases", "Read", "Take", "ReadMany", "TakeMany"}
)


def runs_eagerly(name: str, request: Any) -> bool:
    """Whether the operation `name` with this (decoded) request is started at once on a lone
    server, without a task of its own until it waits (see the module's docstring): nothing it
    may wait for binds the task current when it starts. Bytes that are no valid request are
    refused at once, whatever the operation."""
    return name in EAGER or isinstance(request, handlers.Undecodable)


class Served(NamedTuple):
    """An operation as one server's streams run it, found once: its `Operation`'s parts, the
    undecorated method it runs (what the `unary` wrapper runs), and whether it starts at once
    whatever its decoded request (`runs_eagerly`, on a lone server)."""

    name: str
    request: Any
    decode: Callable[[Any], Any]
    result_field: int
    method: Any
    eager: bool


def served_operations(servicer: SpaceServicer, *, lone: bool) -> dict[int, Served]:
    """The `Served` of each MuxOp field (OPERATIONS) on `servicer`'s server."""
    return {
        field: Served(
            *operation, getattr(servicer, operation.name).operation, lone and operation.name in EAGER
        )
        for field, operation in OPERATIONS.items()
    }


@types.coroutine
def _resume(coro: Coroutine[Any, Any, Any], step: Any) -> Generator[Any, Any, Any]:
    """The rest of a coroutine whose first step already ran and yielded `step` (a future to wait
    for, or None): what a task would have run from there, given back to a task, and what the
    coroutine returns. What the task sends or throws in (the future's outcome, a cancellation)
    goes on to the coroutine."""
    while True:
        try:
            value = yield step
        except GeneratorExit:
            coro.close()
            raise
        except BaseException as thrown:  # a cancellation, or the awaited future's exception
            try:
                step = coro.throw(thrown)
            except StopIteration as done:
                return done.value
        else:
            try:
                step = coro.send(value)
            except StopIteration as done:
                return done.value


class Result:
    """One operation's result, ready to send: a MuxResult's head (its id and the tag and length of
    its reply field) and the reply's bytes, kept apart so that a large reply is copied once, into
    the message."""

    __slots__ = ("body", "head", "op_id", "size")

    def __init__(self, op_id: int, field: int, body: bytes) -> None:
        self.op_id = op_id
        length = len(body)
        self.head = head = b"".join(
            (
                _RESULT_ID,
                varint(op_id),
                _RESULT_TAGS[field],
                ONE_BYTE_VARINTS[length] if length < 0x80 else varint(length),  # most replies: a call less
            )
        )
        self.body = body
        self.size = len(head) + len(body)  # read by batch_size, the limit's check and reply_message


def error_result(
    op_id: int,
    status: grpc.StatusCode,
    message: str,
    reason: int = 0,
    metadata: Mapping[str, str] | None = None,
) -> Result:
    """A MuxResult carrying a MuxError: the status (its number), the message (`bounded`), the
    `ErrorReason` and the ErrorInfo's metadata, as the unary call would have ended."""
    text = bounded(message).encode()
    code: int = status.value[0]
    parts = [_CODE, varint(code), _MESSAGE, varint(len(text)), text]
    if reason:
        parts += (_REASON, varint(reason))
    for key, value in (metadata or {}).items():
        key_bytes, value_bytes = key.encode(), value.encode()
        entry = b"".join(
            (
                _METADATA_KEY,
                varint(len(key_bytes)),
                key_bytes,
                _METADATA_VALUE,
                varint(len(value_bytes)),
                value_bytes,
            )
        )
        parts += (_METADATA, varint(len(entry)), entry)
    return Result(op_id, _ERROR, b"".join(parts))


def batch_size(ready: list[Result]) -> int:
    """How many of the results ready, from the first, go in the next MuxReply: as many as fit in
    BATCH_BYTES (with each one's tag and length), and at least one."""
    size = 0
    for count, result in enumerate(ready):
        size += result.size + 16
        if size > BATCH_BYTES and count:
            return count
    return len(ready)


def reply_message(results: list[Result]) -> bytes:
    """A MuxReply carrying `results`: one copy of each reply's bytes."""
    parts: list[bytes] = []
    for result in results:
        size = result.size
        parts += (_RESULTS, ONE_BYTE_VARINTS[size] if size < 0x80 else varint(size), result.head, result.body)
    return b"".join(parts)


def _view_classes() -> Any:
    """The view of a MuxRequest (`parse_request`): a message class of this module's own (in a
    descriptor pool of its own: nothing is added to protobuf's default pool) with MuxRequest's
    field numbers, whose MuxOps carry their operation's request as bytes (each op field of the
    oneof a bytes field of the same number; `cancel` a uint64, read as its tag reads it)."""
    package, kind = "outrig.service.muxview", descriptor_pb2.FieldDescriptorProto
    file = descriptor_pb2.FileDescriptorProto(
        name="outrig/service/muxview.proto", package=package, syntax="proto3"
    )
    op = file.message_type.add(name="MuxOpView")
    op.oneof_decl.add(name="op")
    for field in pb.MuxOp.DESCRIPTOR.fields:
        if field.containing_oneof is None:  # the id
            op.field.add(name=field.name, number=field.number, type=field.type, label=kind.LABEL_OPTIONAL)
        else:
            # A bool (`cancel`) as a uint64 of the same wire type: a varint of 2 reads as 2, as
            # the tags read it (a bool would read it as 1, in as many bytes).
            carried = {field.TYPE_MESSAGE: kind.TYPE_BYTES, field.TYPE_BOOL: kind.TYPE_UINT64}.get(
                field.type, field.type
            )
            op.field.add(
                name=field.name, number=field.number, type=carried, label=kind.LABEL_OPTIONAL, oneof_index=0
            )
    request = file.message_type.add(name="MuxRequestView")
    request.field.add(
        name="ops",
        number=_OPS,
        type=kind.TYPE_MESSAGE,
        type_name=f".{package}.MuxOpView",
        label=kind.LABEL_REPEATED,
    )
    (view,) = views.own_messages(file, "MuxRequestView")
    return view


_RequestView = _view_classes()
#: The number of each op field of the view's oneof, by its name.
_OP_NUMBERS = {field.name: field.number for field in _RequestView.DESCRIPTOR.fields[0].message_type.fields}
#: Requests up to this size are read through the view (a copy of each op's bytes, at C speed);
#: larger ones (an HD array's write) as views of their bytes, never copied.
VIEWED_REQUESTS = 64 * 1024


def parse_request(raw: bytes) -> list[tuple[int, int, int | bytes | memoryview]]:
    """(id, op field, op value) for each MuxOp of an encoded MuxRequest; ValueError if malformed
    (`wire.fields`).
    An op without an operation field has field 0.

    A small request is decoded by protobuf as `_RequestView`, which is what reading its tags in
    Python (`_parse_fields`) gives whenever the view holds all of it: if the view, its unknown
    fields dropped, re-encodes to fewer bytes than arrived (a field of no known number, or of the
    wrong wire type; a oneof or an id sent twice; a varint longer than it needs), or protobuf
    refuses the bytes, they are read in Python after all, which answers each case as it always
    did."""
    if len(raw) > VIEWED_REQUESTS:
        return _parse_fields(raw)
    try:
        view = _RequestView.FromString(raw)
    except DecodeError:
        return _parse_fields(raw)
    view.DiscardUnknownFields()
    if view.ByteSize() != len(raw):
        return _parse_fields(raw)
    ops: list[tuple[int, int, int | bytes | memoryview]] = []
    numbers = _OP_NUMBERS
    for op in view.ops:
        which = op.WhichOneof("op")
        if which is None:
            ops.append((op.id, 0, b""))
        else:
            ops.append((op.id, numbers[which], getattr(op, which)))
    return ops


def _parse_fields(raw: bytes) -> list[tuple[int, int, int | bytes | memoryview]]:
    """`parse_request`, reading the message's tags in Python (`wire.fields`)."""
    ops: list[tuple[int, int, int | bytes | memoryview]] = []
    for number, op in wire.fields(memoryview(raw)):
        if number != _OPS:
            continue
        if not isinstance(op, memoryview):
            raise ValueError("ops: not a message")
        op_id, field, value = 0, 0, memoryview(b"")  # type: int, int, int | bytes | memoryview
        for part, content in wire.fields(op):
            if part == _OP_ID:
                if not isinstance(content, int):
                    raise ValueError("id: not a varint")
                op_id = content
            else:  # a oneof: the last one wins, as in protobuf
                field, value = part, content
        ops.append((op_id, field, value))
    return ops


class MuxService:
    """The Mux method of a server: `handle` serves one stream; `close` ends them all (at shutdown)."""

    def __init__(self, servicer: SpaceServicer, limit: int, max_bytes: int, *, lone: bool = False) -> None:
        self._servicer = servicer
        self._limit = limit
        self._max_bytes = max_bytes
        self._eager = lone  # a lone server: operations that cannot wait run without a task
        self._streams: set[MuxStream] = set()
        self._operations = served_operations(servicer, lone=lone)

    async def handle(self, requests: AsyncIterator[bytes], context: handlers.MuxContext) -> None:
        stream = MuxStream(
            self._servicer, self._operations, context, self._limit, self._max_bytes, eager=self._eager
        )
        self._streams.add(stream)
        try:
            await stream.run(requests)
        finally:
            self._streams.discard(stream)

    def figures(self) -> tuple[int, int]:
        """(open streams, their operations in flight): read by the metrics' thread at a scrape,
        so the set is copied first (in one step of C code, which the event loop cannot interrupt)."""
        streams = list(self._streams)
        return len(streams), sum(stream.in_flight for stream in streams)

    def close(self) -> None:
        """End every stream with UNAVAILABLE once its operations in flight are done (briefly)."""
        for stream in list(self._streams):
            stream.close()


class MuxStream:
    """One Mux call: reads operations, runs each as a task, sends their results as they come."""

    def __init__(
        self,
        servicer: SpaceServicer,
        operations: dict[int, Served],
        context: handlers.MuxContext,
        limit: int,
        max_bytes: int,
        *,
        eager: bool = False,
    ) -> None:
        self._servicer = servicer
        self._operations = operations
        self._context = context
        # What the operations are given as their context (a stand-in: see handlers.StreamContext).
        self._operation_context = cast(
            handlers.Context, handlers.StreamContext(context, peer_secret(context))
        )
        # Every operation of the stream let in with nothing to check per operation (`admits_all`).
        self._admitted = servicer.admits_all(self._operation_context)
        self._limit = limit
        self._max_bytes = max_bytes
        self._running: dict[int, asyncio.Task[None]] = {}
        self._ready: list[Result] = []
        self._in_flight = 0  # read and not yet handed to gRPC: running, or ready
        self._eager = eager  # start operations that cannot wait without a task (`runs_eagerly`)
        self._loop = asyncio.get_running_loop()
        self._results: asyncio.Future[None] | None = None  # the idle writer waits on it
        self._progress = asyncio.Event()  # the writer sent something
        self._closing = False
        self._handler: asyncio.Task[Any] | None = None

    async def run(self, requests: AsyncIterator[bytes]) -> None:
        self._handler = handler = asyncio.current_task()
        assert handler is not None
        await self._context.send_initial_metadata(((LIMIT_KEY, str(self._limit)),))
        writer = self._loop.create_task(self._write())
        try:
            async for raw in requests:
                self._accept(raw)
                while self._in_flight >= self._limit:
                    await self._wait_progress()
            while self._in_flight:  # the client is done sending: finish what it sent
                await self._wait_progress()
        except InvalidArgumentError as err:
            await self._context.abort(grpc.StatusCode.INVALID_ARGUMENT, bounded(str(err)))
        except asyncio.CancelledError:
            if not self._closing:
                raise
            handler.uncancel()
            await self._finish_closing()
        finally:
            for task in self._running.values():
                task.cancel()
            writer.cancel()
            if writer.done() and not writer.cancelled():
                writer.exception()  # a write that failed because the client went: nothing to report

    @property
    def in_flight(self) -> int:
        return self._in_flight

    async def _wait_progress(self) -> None:
        self._progress.clear()
        await self._progress.wait()

    def close(self) -> None:
        """The server is stopping: finish the operations in flight (briefly), then end the stream
        with UNAVAILABLE, which the client retries against the restarted server."""
        self._closing = True
        if self._handler is not None:
            self._handler.cancel()

    async def _finish_closing(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + _CLOSING_WAIT
        while self._in_flight and loop.time() < deadline:
            try:
                await asyncio.wait_for(self._wait_progress(), deadline - loop.time())
            except TimeoutError:
                break
        await self._context.abort(grpc.StatusCode.UNAVAILABLE, "the server is shutting down: retry")

    # ------------------------------------------------------------ reading

    def _accept(self, raw: bytes) -> None:
        try:
            ops = parse_request(raw)
        except ValueError as err:
            raise InvalidArgumentError(f"MuxRequest: malformed ({err})") from None
        for op_id, field, value in ops:
            if field == _CANCEL:
                task = self._running.get(op_id)
                if task is not None:
                    task.add_done_callback(functools.partial(self._cancelled, op_id))
                    task.cancel()
                continue
            self._in_flight += 1
            if self._in_flight > self._limit:
                self._finish(
                    error_result(
                        op_id,
                        grpc.StatusCode.RESOURCE_EXHAUSTED,
                        f"ops: more than max_stream_ops={self._limit} operations in flight on this stream",
                    )
                )
            elif op_id in self._running:
                self._finish(
                    error_result(
                        op_id,
                        grpc.StatusCode.INVALID_ARGUMENT,
                        f"id: {op_id} is already in flight on this stream",
                    )
                )
            else:
                self._start(op_id, field, value)

    def _start(self, op_id: int, field: int, value: int | bytes | memoryview) -> None:
        operation = self._operations.get(field)
        if operation is None:
            what = "op: is required" if field == 0 else f"op: field {field} is no operation this server knows"
            status = grpc.StatusCode.INVALID_ARGUMENT if field == 0 else grpc.StatusCode.UNIMPLEMENTED
            self._finish(error_result(op_id, status, what))
            return
        name, message_type, decode, reply_field, method, eager = operation
        # Bytes that are no valid request decode as a `handlers.Undecodable`, which `perform`
        # refuses as it does a unary call's.
        if isinstance(value, (bytes, memoryview)):
            request = decode(value)
        else:
            request = handlers.Undecodable(
                message_type.DESCRIPTOR.full_name, "a number where a message belongs"
            )
        performing = self._servicer.perform(name, method, request, self._operation_context, self._admitted)
        # `runs_eagerly`: its name's part found once (`Served.eager`), an undecodable request's here.
        if not (eager or (self._eager and isinstance(request, handlers.Undecodable))):
            self._running[op_id] = self._loop.create_task(self._answered(op_id, reply_field, performing))
            return
        # Its first step now, in a context of its own as a task's; a task only if it waits.
        context = contextvars.copy_context()
        try:
            step = context.run(performing.send, None)
        except StopIteration as done:  # done without waiting: answered here, without a coroutine
            outcome = done.value
        except Exception:  # `perform` answers every error: this is a bug, logged as a task's would be
            log.exception("Mux operation %d (%s) failed", op_id, name)
            return
        else:
            self._running[op_id] = self._loop.create_task(
                self._resumed(op_id, reply_field, performing, step), context=context
            )
            return
        try:
            self._answer(op_id, reply_field, outcome)
        except Exception:  # as above
            log.exception("Mux operation %d (%s) failed", op_id, name)

    async def _answered(self, op_id: int, reply_field: int, performing: Awaitable[Any]) -> None:
        """An operation's task: `perform` (or the rest of it), then its answer."""
        # A cancelled operation ends here with CancelledError: a cancel op's callback on the task
        # answers it (`_cancelled`); when the stream ends, nobody is owed an answer.
        outcome = await performing
        self._running.pop(op_id, None)
        self._answer(op_id, reply_field, outcome)

    async def _resumed(
        self, op_id: int, reply_field: int, performing: Coroutine[Any, Any, Any], step: Any
    ) -> None:
        """The task of an operation started at once that waits after all: the rest of `perform`
        (`_resume`), then its answer, as `_answered`."""
        outcome = await _resume(performing, step)
        self._running.pop(op_id, None)
        self._answer(op_id, reply_field, outcome)

    def _answer(self, op_id: int, reply_field: int, outcome: Any) -> None:
        """Queue an operation's result: what `perform` returned, its reply or its Failure."""
        if isinstance(outcome, Failure):
            self._finish(
                error_result(op_id, outcome.status, outcome.message, outcome.reason, outcome.metadata)
            )
            return
        result = Result(
            op_id, reply_field, outcome if isinstance(outcome, bytes) else outcome.SerializeToString()
        )
        if result.size > self._max_bytes - 16:  # with its tag and length in the MuxReply
            result = error_result(
                op_id,
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"result: {result.size} bytes exceeds the limit max_message_bytes={self._max_bytes}",
            )
        self._finish(result)

    def _cancelled(self, op_id: int, task: asyncio.Task[None]) -> None:
        if task.cancelled() and self._running.get(op_id) is task:
            del self._running[op_id]
            self._finish(error_result(op_id, grpc.StatusCode.CANCELLED, "cancelled by the client"))

    def _finish(self, result: Result) -> None:
        self._ready.append(result)
        waiting = self._results
        if waiting is not None and not waiting.done():
            waiting.set_result(None)

    # ------------------------------------------------------------ writing

    async def _write(self) -> None:
        """Send every result that is ready in one message (up to BATCH_BYTES), as they come."""
        while True:
            if not self._ready:
                self._results = self._loop.create_future()
                await self._results
            count = batch_size(self._ready)
            batch, self._ready = self._ready[:count], self._ready[count:]
            await self._context.write(reply_message(batch))
            self._in_flight -= count
            self._progress.set()
