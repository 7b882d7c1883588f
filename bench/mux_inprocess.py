"""outrig's own server CPU per write+take pair on the Mux stream, without gRPC, in this process.

    python bench/mux_inprocess.py [--pairs N] [--rounds R] [--tasks T] [--profile]

An in-memory server is built as `outrig serve --in-memory` builds it (`OutrigServer`, not started),
and its Mux method (`MuxService.handle`) serves one stream whose messages are made here: T writes
of bench/run.py's small pair entry in one MuxRequest, then, once their results are written, T takes
with a timeout (the SDK's requests, with request ids, encoded by the SDK), as T asyncio tasks on one
connection send them. The stream's context is a stand-in whose `write` only counts the results, so
what is measured is outrig's Python from the request's bytes to the reply's: the transport
(service/transport/mux.py), the servicer, the backend and the engine. Prints the CPU time per pair
(median of R rounds of N pairs); ``--profile`` prints cProfile's top functions of one more round.
Asserts nothing; for figures through gRPC use bench/before_after.py.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import os
import pstats
import statistics
import sys
import time
from collections.abc import AsyncIterator
from typing import Any

from entries import Small
from workloads import _pair_entry

import outrig
from outrig._mux_wire import OP_FIELDS
from outrig._protocol import encode_op, request_message
from outrig.service import process
from outrig.service.config import ServerConfig
from outrig.service.transport.server import OutrigServer
from outrig.v1 import space_pb2 as pb

SPACE = "bench"


class _Context:
    """What a Mux stream's handler uses of its gRPC context, with `write` counting results."""

    def __init__(self) -> None:
        self.results = 0
        self.written = asyncio.Event()

    async def send_initial_metadata(self, metadata: Any) -> None:
        return None

    async def write(self, message: bytes) -> None:
        if _CHECK:
            self.results += len(pb.MuxReply.FromString(message).results)
        self.written.set()

    async def abort(self, code: Any, details: str = "", trailing: Any = ()) -> None:
        raise RuntimeError(f"aborted: {code} {details}")

    def invocation_metadata(self) -> tuple[()]:
        return ()

    def peer(self) -> str:
        return "ipv4:127.0.0.1:1"

    def time_remaining(self) -> None:
        return None


_CHECK = False  # decode each reply (only to check the harness)


def _messages(tasks: int, pairs: int, take_timeout: float = 10.0) -> list[tuple[bytes, bytes]]:
    """(the writes' MuxRequest, the takes' MuxRequest) for each round of `tasks` pairs."""
    space = outrig.connect("127.0.0.1:1", space=SPACE)  # only its request builders: never called
    write_field, take_field = OP_FIELDS["Write"], OP_FIELDS["Take"]
    rounds = []
    op_id = 0
    for _ in range(pairs // tasks):
        writes, takes = [], []
        for number in range(tasks):
            op_id += 1
            request = space._write_request(_pair_entry(number), 300.0).SerializeToString()
            writes.append(encode_op(op_id, write_field, request))
        for number in range(tasks):
            op_id += 1
            request = space._take_request(Small(client=number), take_timeout).SerializeToString()
            takes.append(encode_op(op_id, take_field, request))
        rounds.append((request_message(writes), request_message(takes)))
    space.close()
    return rounds


async def _serve(rounds: list[tuple[bytes, bytes]], tasks: int) -> float:
    server = OutrigServer(ServerConfig(in_memory=True, listen="127.0.0.1:0", log_level="WARNING"))
    context = _Context()
    process.tune_collector()  # as `outrig serve` does (service/transport/server.py's serve)
    gc.collect()
    gc.freeze()

    async def requests() -> AsyncIterator[bytes]:
        for writes, takes in rounds:
            for message in (writes, takes):
                context.written.clear()
                yield message
                while not context.written.is_set():
                    await context.written.wait()

    stream = asyncio.ensure_future(server._mux.handle(requests(), context))  # type: ignore[arg-type]
    began = time.process_time()
    await stream
    return time.process_time() - began


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pairs", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tasks", type=int, default=10)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--take-timeout", type=float, default=10.0, help="the takes' timeout (default 10 s)")
    args = parser.parse_args()
    load = " ".join(f"{figure:.2f}" for figure in os.getloadavg())
    print(
        f"in-process Mux pairs: {os.cpu_count()} cores, Python {sys.version.split()[0]}, load average {load}"
    )
    times = []
    for _ in range(args.rounds):
        rounds = _messages(args.tasks, args.pairs, args.take_timeout)
        times.append(asyncio.run(_serve(rounds, args.tasks)) / args.pairs)
    print(
        f"us per pair: median {statistics.median(times) * 1e6:.1f} "
        f"(min {min(times) * 1e6:.1f}, max {max(times) * 1e6:.1f}) over {args.rounds} rounds of {args.pairs}"
    )
    if args.profile:
        rounds = _messages(args.tasks, args.pairs)
        profiler = cProfile.Profile()
        profiler.enable()
        asyncio.run(_serve(rounds, args.tasks))
        profiler.disable()
        pstats.Stats(profiler).sort_stats("tottime").print_stats(30)


if __name__ == "__main__":
    main()
