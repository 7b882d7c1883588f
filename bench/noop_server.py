"""A no-op `outrig.v1.Space` server: the floor for any Python gRPC service, for bench/run.py.

    python bench/noop_server.py [--listen HOST:PORT] [--max-message-bytes N]

It serves the very service outrig serves, through the same generated code
(`add_SpaceServicer_to_server`) on a `grpc.aio` server with the same options, so the same SDK
client code runs against both. Every call is answered at once with a canned reply the size of
outrig's (see bench/entries.py): Read and Take a prebuilt MatchReply with one small entry, or the
HD array entry when the template's type is bench.Frame; ReadMany and TakeMany as many small
entries as asked for; Write a WriteReply with a lease; WriteMany one lease per entry; Count 0;
renewals and cancellations succeed; Begin a transaction's lease, Commit and Abort an EndReply.
Nothing is stored, matched or checked.

Mux, the stream the SDK sends its calls over by default, is served as outrig serves it
(service/transport/mux.py), so that bench/run.py measures the same client path against both: the limit of
operations in flight goes out in the initial metadata (`outrig-max-stream-ops: 1024`); each
MuxOp of a MuxRequest gets the canned reply its unary method gives, in a MuxResult (operations
beyond the limit RESOURCE_EXHAUSTED, as in outrig); one writer task sends every result that is
ready in one MuxReply (up to outrig's 3 MiB), and the stream reads no further messages while
1024 results are unsent. The canned replies are serialized once (renewals and cancellations on
each call) and results framed around their bytes by outrig's own functions (`Result`,
`error_result`, `batch_size`, `reply_message` of service/transport/mux.py), as outrig frames them around
stored payloads: the only registration that differs from the generated code is Mux's, whose
replies go out as bytes. Every operation completes as it is read, so a `cancel` op finds its
operation done and is ignored, unless both came in the same MuxRequest (the operation has then
not run yet in outrig either): its result is then an error, CANCELLED.

Notify answers with the registration's lease, then streams one canned event for each Write the
server receives (a unary Write or a Mux write op, from any client), numbered per stream. As in
outrig, a stream's queue holds at most 10,000 undelivered events and drops beyond that (a gap in
the sequence).

Prints ``noop listening on HOST:PORT`` on stdout once it serves, and stops on SIGTERM or SIGINT.
"""

# The gRPC method names are fixed by the proto.
# ruff: noqa: N802

from __future__ import annotations

import argparse
import asyncio
import signal
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

import grpc
from entries import canned_batch, canned_frame, canned_small

from outrig._protocol import DEFAULT_LIMIT, LIMIT_KEY, OPS_BY_FIELD
from outrig.service.transport.mux import Result, batch_size, error_result, reply_message
from outrig.v1 import space_pb2 as pb
from outrig.v1 import space_pb2_grpc

NOTIFY_QUEUE = 10_000  # outrig's default limits.notify_queue
MAX_STREAM_OPS = DEFAULT_LIMIT  # outrig's default limits.max_stream_ops
PENDING_REQUESTS = 100_000  # gRPC's queue of calls not yet picked up: outrig's, for its default max_waiters
_LEASE_SECONDS = 60.0

# The MuxResult field that carries the reply of each kind of MuxOp (by the MuxOp field's name).
_REPLY_FIELDS: dict[str, int] = {
    pb.MuxOp.DESCRIPTOR.fields_by_number[field].name: method.result_field
    for field, method in OPS_BY_FIELD.items()
    if method.result_field is not None
}

Reply = tuple[int, bytes]  # a MuxResult's reply: its field, and its bytes


def _lease(lease_id: int) -> pb.Lease:
    # The expiry is fixed when the server starts: canned, but as large on the wire as a real one.
    return pb.Lease(id=lease_id, expires_at=time.time() + 3600.0, granted_seconds=_LEASE_SECONDS)


def _reply(kind: str, body: bytes) -> Reply:
    return _REPLY_FIELDS[kind], body


class _Stream:
    """One Mux call's results: ready to send, and in flight (read, not yet handed to gRPC)."""

    def __init__(self, context: Any) -> None:
        self._context = context
        self.ready: list[Result] = []
        self.in_flight = 0
        self._results = asyncio.Event()  # the writer has something to send
        self._progress = asyncio.Event()  # the writer sent something

    def add(self, results: list[Result]) -> None:
        for result in results:
            self.in_flight += 1
            if self.in_flight > MAX_STREAM_OPS:
                result = error_result(
                    result.op_id,
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"ops: more than max_stream_ops={MAX_STREAM_OPS} operations in flight on this stream",
                )
            self.ready.append(result)
        self._results.set()

    async def wait_progress(self) -> None:
        self._progress.clear()
        await self._progress.wait()

    async def write(self) -> None:
        """Send every result that is ready in one MuxReply (as outrig batches them), as they come."""
        while True:
            if not self.ready:
                self._results.clear()
                await self._results.wait()
            count = batch_size(self.ready)
            batch, self.ready = self.ready[:count], self.ready[count:]
            await self._context.write(reply_message(batch))
            self.in_flight -= count
            self._progress.set()


class NoopSpace(space_pb2_grpc.SpaceServicer):
    """outrig.v1.Space answering every call with a canned reply."""

    def __init__(self) -> None:
        self._small = pb.MatchReply(entries=[canned_small()])
        self._frame = pb.MatchReply(entries=[canned_frame()])
        self._batches: dict[int, pb.MatchReply] = {}
        self._event_entry = canned_small()
        self._write = pb.WriteReply(lease=_lease(1_000_001))
        self._write_many: dict[int, pb.WriteManyReply] = {}
        self._count = pb.CountReply(count=0)
        self._registration = _lease(1_000_002)
        self._begin = pb.BeginReply(transaction=_lease(1_000_003))
        self._end = pb.EndReply()
        self._listeners: set[asyncio.Queue[None]] = set()
        # The Mux replies of the canned messages, serialized once.
        self._mux_small = _reply("read", self._small.SerializeToString())
        self._mux_frame = _reply("read", self._frame.SerializeToString())
        self._mux_batches: dict[int, Reply] = {}
        self._mux_write_many: dict[int, Reply] = {}
        self._mux_fixed = {
            "write": _reply("write", self._write.SerializeToString()),
            "count": _reply("count", self._count.SerializeToString()),
            "begin": _reply("begin", self._begin.SerializeToString()),
            "commit": _reply("commit", self._end.SerializeToString()),
            "abort": _reply("abort", self._end.SerializeToString()),
        }

    def _one(self, request: pb.MatchRequest) -> pb.MatchReply:
        if request.templates and request.templates[0].type_name == "bench.Frame":
            return self._frame
        return self._small

    def _many(self, request: pb.MatchRequest) -> pb.MatchReply:
        count = max(1, request.max_entries)
        reply = self._batches.get(count)
        if reply is None:
            reply = self._batches[count] = pb.MatchReply(entries=canned_batch(count))
        return reply

    def _written(self) -> None:
        for queue in self._listeners:
            if queue.qsize() < NOTIFY_QUEUE:
                queue.put_nowait(None)

    def _written_many(self, count: int) -> pb.WriteManyReply:
        reply = self._write_many.get(count)
        if reply is None:
            reply = self._write_many[count] = pb.WriteManyReply(
                leases=[_lease(2_000_000 + i) for i in range(count)]
            )
        return reply

    @staticmethod
    def _renewed(request: pb.RenewLeasesRequest) -> pb.RenewLeasesReply:
        return pb.RenewLeasesReply(
            results=[pb.LeaseResult(id=item.id, lease=_lease(item.id)) for item in request.renewals]
        )

    @staticmethod
    def _cancelled(request: pb.CancelLeasesRequest) -> pb.CancelLeasesReply:
        return pb.CancelLeasesReply(results=[pb.LeaseResult(id=lease_id) for lease_id in request.ids])

    async def Read(self, request: pb.MatchRequest, context: Any) -> pb.MatchReply:
        return self._one(request)

    async def Take(self, request: pb.MatchRequest, context: Any) -> pb.MatchReply:
        return self._one(request)

    async def ReadMany(self, request: pb.MatchRequest, context: Any) -> pb.MatchReply:
        return self._many(request)

    async def TakeMany(self, request: pb.MatchRequest, context: Any) -> pb.MatchReply:
        return self._many(request)

    async def Write(self, request: pb.WriteRequest, context: Any) -> pb.WriteReply:
        self._written()
        return self._write

    async def WriteMany(self, request: pb.WriteManyRequest, context: Any) -> pb.WriteManyReply:
        return self._written_many(len(request.entries))

    async def Count(self, request: pb.CountRequest, context: Any) -> pb.CountReply:
        return self._count

    async def Contents(self, request: pb.ContentsRequest, context: Any) -> AsyncIterator[pb.ContentsReply]:
        yield pb.ContentsReply()

    async def RenewLeases(self, request: pb.RenewLeasesRequest, context: Any) -> pb.RenewLeasesReply:
        return self._renewed(request)

    async def CancelLeases(self, request: pb.CancelLeasesRequest, context: Any) -> pb.CancelLeasesReply:
        return self._cancelled(request)

    async def Begin(self, request: pb.BeginRequest, context: Any) -> pb.BeginReply:
        return self._begin

    async def Commit(self, request: pb.EndRequest, context: Any) -> pb.EndReply:
        return self._end

    async def Abort(self, request: pb.EndRequest, context: Any) -> pb.EndReply:
        return self._end

    async def Notify(self, request: pb.NotifyRequest, context: Any) -> AsyncIterator[pb.NotifyReply]:
        queue: asyncio.Queue[None] = asyncio.Queue()
        self._listeners.add(queue)
        try:
            yield pb.NotifyReply(registration=self._registration)
            sequence = 0
            while True:
                await queue.get()
                sequence += 1
                yield pb.NotifyReply(sequence=sequence, entry=self._event_entry)
        finally:
            self._listeners.discard(queue)

    # Registered by add_to_server, not as generated: it writes the framed bytes of each MuxReply.
    async def Mux(self, requests: AsyncIterator[pb.MuxRequest], context: Any) -> None:  # type: ignore[override]
        await context.send_initial_metadata(((LIMIT_KEY, str(MAX_STREAM_OPS)),))
        stream = _Stream(context)
        writer = asyncio.ensure_future(stream.write())
        try:
            async for request in requests:
                stream.add(self._mux_results(request))
                while stream.in_flight >= MAX_STREAM_OPS:
                    await stream.wait_progress()
            while stream.in_flight:  # the client is done sending: send what it is owed
                await stream.wait_progress()
        finally:
            writer.cancel()

    def _mux_results(self, request: pb.MuxRequest) -> list[Result]:
        """The result of each MuxOp of a MuxRequest, but for its cancel ops."""
        results: list[Result] = []
        for op in request.ops:
            kind = op.WhichOneof("op")
            if kind == "cancel":
                for index in range(len(results) - 1, -1, -1):
                    if results[index].op_id == op.id:
                        results[index] = error_result(
                            op.id, grpc.StatusCode.CANCELLED, "cancelled by the client"
                        )
                        break
                continue
            if kind is None:
                results.append(error_result(op.id, grpc.StatusCode.INVALID_ARGUMENT, "op: is required"))
                continue
            results.append(Result(op.id, *self._mux_reply(op, kind)))
        return results

    def _mux_reply(self, op: pb.MuxOp, kind: str) -> Reply:
        fixed = self._mux_fixed.get(kind)
        if fixed is not None:
            if kind == "write":
                self._written()
            return fixed
        if kind == "read" or kind == "take":
            return self._mux_frame if self._one(getattr(op, kind)) is self._frame else self._mux_small
        if kind == "read_many" or kind == "take_many":
            count = max(1, getattr(op, kind).max_entries)
            reply = self._mux_batches.get(count)
            if reply is None:
                reply = self._mux_batches[count] = _reply(
                    kind, self._many(getattr(op, kind)).SerializeToString()
                )
            return reply
        if kind == "write_many":
            count = len(op.write_many.entries)
            reply = self._mux_write_many.get(count)
            if reply is None:
                reply = self._mux_write_many[count] = _reply(
                    kind, self._written_many(count).SerializeToString()
                )
            return reply
        if kind == "renew_leases":
            return _reply(kind, self._renewed(op.renew_leases).SerializeToString())
        return _reply(kind, self._cancelled(op.cancel_leases).SerializeToString())


def add_to_server(servicer: NoopSpace, server: grpc.aio.Server) -> None:
    """Register `servicer` through the generated `add_SpaceServicer_to_server`, but for Mux, whose
    replies go out as the bytes the servicer frames (as outrig's do)."""
    generated = _Handlers()
    space_pb2_grpc.add_SpaceServicer_to_server(servicer, generated)  # type: ignore[arg-type]  # a stand-in
    handlers = dict(generated.handlers)
    handlers["Mux"] = grpc.stream_stream_rpc_method_handler(
        servicer.Mux, request_deserializer=pb.MuxRequest.FromString, response_serializer=None
    )
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(generated.service, handlers),))
    server.add_registered_method_handlers(generated.service, handlers)


class _Handlers:
    """Stands in for a server to collect the method handlers the generated code registers."""

    def __init__(self) -> None:
        self.service = ""
        self.handlers: dict[str, grpc.RpcMethodHandler[Any, Any]] = {}

    def add_generic_rpc_handlers(self, handlers: Sequence[grpc.GenericRpcHandler]) -> None:
        pass  # the same handlers as the registered ones

    def add_registered_method_handlers(
        self, service: str, handlers: dict[str, grpc.RpcMethodHandler[Any, Any]]
    ) -> None:
        self.service = service
        self.handlers = handlers


async def serve(
    listen: str, max_message_bytes: int, servicer: NoopSpace | None = None, name: str = "noop"
) -> None:
    """Serve `servicer` (default a NoopSpace) until SIGTERM or SIGINT, printing ``NAME listening
    on HOST:PORT`` once it serves (bench/minimal_server.py serves its own through this)."""
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.max_send_message_length", max_message_bytes),
            ("grpc.so_reuseport", 0),
            ("grpc.server.max_pending_requests", PENDING_REQUESTS),
            ("grpc.server.max_pending_requests_hard_limit", 2 * PENDING_REQUESTS),
        ]
    )
    add_to_server(servicer if servicer is not None else NoopSpace(), server)
    host = listen.rpartition(":")[0]
    port = server.add_insecure_port(listen)
    await server.start()
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stopping.set)
    print(f"{name} listening on {host}:{port}", flush=True)
    await stopping.wait()
    await server.stop(0)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--listen", default="127.0.0.1:0", metavar="HOST:PORT")
    parser.add_argument("--max-message-bytes", type=int, default=64 * 1024 * 1024, metavar="N")
    args = parser.parse_args()
    asyncio.run(serve(args.listen, args.max_message_bytes))


if __name__ == "__main__":
    main()
