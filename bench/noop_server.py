"""A no-op `outrig.v1.Space` server: the floor for any Python gRPC service, for bench/run.py.

    python bench/noop_server.py [--listen HOST:PORT] [--max-message-bytes N]

It serves the very service outrig serves, through the same generated code
(`add_SpaceServicer_to_server`) on a `grpc.aio` server with the same options, so the same SDK
client code runs against both. Every call is answered at once with a canned reply the size of
outrig's (see bench/entries.py): Read and Take a prebuilt MatchReply with one small entry, or the
HD array entry when the template's type is bench.Frame; ReadMany and TakeMany as many small
entries as asked for; Write a WriteReply with a lease; WriteMany one lease per entry; Count 0;
renewals and cancellations succeed. Nothing is stored, matched or checked.

Notify answers with the registration's lease, then streams one canned event for each Write the
server receives (from any client), numbered per stream. As in outrig, a stream's queue holds at
most 10,000 undelivered events and drops beyond that (a gap in the sequence).

Prints ``noop listening on HOST:PORT`` on stdout once it serves, and stops on SIGTERM or SIGINT.
"""

# The gRPC method names are fixed by the proto.
# ruff: noqa: N802

from __future__ import annotations

import argparse
import asyncio
import signal
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc
from entries import canned_batch, canned_frame, canned_small

from outrig.v1 import space_pb2 as pb
from outrig.v1 import space_pb2_grpc

NOTIFY_QUEUE = 10_000  # outrig's default limits.notify_queue
_LEASE_SECONDS = 60.0


def _lease(lease_id: int) -> pb.Lease:
    # The expiry is fixed when the server starts: canned, but as large on the wire as a real one.
    return pb.Lease(id=lease_id, expires_at=time.time() + 3600.0, granted_seconds=_LEASE_SECONDS)


class NoopSpace(space_pb2_grpc.SpaceServicer):  # type: ignore[misc]
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
        self._listeners: set[asyncio.Queue[None]] = set()

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

    async def Read(self, request: pb.MatchRequest, context: Any) -> pb.MatchReply:
        return self._one(request)

    async def Take(self, request: pb.MatchRequest, context: Any) -> pb.MatchReply:
        return self._one(request)

    async def ReadMany(self, request: pb.MatchRequest, context: Any) -> pb.MatchReply:
        return self._many(request)

    async def TakeMany(self, request: pb.MatchRequest, context: Any) -> pb.MatchReply:
        return self._many(request)

    async def Write(self, request: pb.WriteRequest, context: Any) -> pb.WriteReply:
        for queue in self._listeners:
            if queue.qsize() < NOTIFY_QUEUE:
                queue.put_nowait(None)
        return self._write

    async def WriteMany(self, request: pb.WriteManyRequest, context: Any) -> pb.WriteManyReply:
        count = len(request.entries)
        reply = self._write_many.get(count)
        if reply is None:
            reply = self._write_many[count] = pb.WriteManyReply(
                leases=[_lease(2_000_000 + i) for i in range(count)]
            )
        return reply

    async def Count(self, request: pb.CountRequest, context: Any) -> pb.CountReply:
        return self._count

    async def Contents(self, request: pb.ContentsRequest, context: Any) -> AsyncIterator[pb.ContentsReply]:
        yield pb.ContentsReply()

    async def RenewLeases(self, request: pb.RenewLeasesRequest, context: Any) -> pb.RenewLeasesReply:
        return pb.RenewLeasesReply(
            results=[pb.LeaseResult(id=item.id, lease=_lease(item.id)) for item in request.renewals]
        )

    async def CancelLeases(self, request: pb.CancelLeasesRequest, context: Any) -> pb.CancelLeasesReply:
        return pb.CancelLeasesReply(results=[pb.LeaseResult(id=lease_id) for lease_id in request.ids])

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


async def serve(listen: str, max_message_bytes: int) -> None:
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.max_send_message_length", max_message_bytes),
            ("grpc.so_reuseport", 0),
        ]
    )
    space_pb2_grpc.add_SpaceServicer_to_server(NoopSpace(), server)
    host = listen.rpartition(":")[0]
    port = server.add_insecure_port(listen)
    await server.start()
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stopping.set)
    print(f"noop listening on {host}:{port}", flush=True)
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
