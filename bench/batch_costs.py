"""Server CPU of the batch paths, in one process, without gRPC: write_many(100) then
take_many(100), and read_many(100), through `SpaceServicer.perform` on an in-memory backend, as
the Mux stream runs them (the request's bytes decoded by the method's deserializer, the reply
serialized as the stream would send it).

    python bench/batch_costs.py [--rounds N] [--batches N] [--batch N]
    python bench/batch_costs.py --instructions N1,N2 [--python PATH ...]

Prints the median and the least microseconds per batch of each stage (the least is what a quiet
core gives; on a loaded machine the median is mostly the load), per entry too:
deserializing the write, WriteMany, serializing its reply, TakeMany (its reply is bytes already),
ReadMany. It is the handler's own CPU, the part of bench/run.py's server CPU per batch pair that
is outrig's (the rest is gRPC's and the kernel's), and it moves far less on a loaded machine.

``--instructions N1,N2`` counts instead of timing: each interpreter (default this one; another
checkout's `.venv/bin/python` runs this script against that checkout's code) runs one round of
N1 and of N2 batches under ``valgrind --tool=callgrind`` (PYTHONHASHSEED=0), and the difference
of the totals over N2 - N1 is the instructions (Ir) per batch round, start-up cancelled out. It
counts three shapes: the whole round, the batch pair alone (write_many + take_many, each
WriteMany's entries taken by the next TakeMany, so the space stays the same) and ReadMany alone
(10 x N1 and 10 x N2 reads of the 100 kept entries). Needs valgrind; a few minutes per interpreter.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from callgrind import counted
from entries import BATCH, NOTE, Small

from outrig._codec import encode_entry_into, encode_template_into
from outrig._protocol import METHODS
from outrig.service.backends import backend_for
from outrig.service.config import ServerConfig
from outrig.service.process import tune_collector
from outrig.service.transport import handlers
from outrig.service.transport.servicer import Failure, SpaceServicer
from outrig.v1 import space_pb2 as pb


class _Context:
    """What `perform` asks of a call's context on a lone, open server."""

    def invocation_metadata(self) -> tuple[()]:
        return ()

    def peer(self) -> str:
        return "bench"

    def time_remaining(self) -> None:
        return None


def _write_request(batch: int) -> bytes:
    request = pb.WriteManyRequest(space="bench")
    request.lease.seconds = 300.0
    for i in range(batch):
        encode_entry_into(request.entries.add(), Small(key=1_000_000 + i, client=0, group="batch", note=NOTE))
    return request.SerializeToString()


def _match_request(batch: int, group: str) -> bytes:
    request = pb.MatchRequest(space="bench", max_entries=batch, timeout=0.0)
    encode_template_into(request.templates.add(), Small(client=0, group=group))
    return request.SerializeToString()


async def _run(rounds: int, batches: int, batch: int, shape: str = "round") -> dict[str, list[float]]:
    config = ServerConfig()
    backend = backend_for(config)
    await backend.start()
    servicer = SpaceServicer(backend, config.limits)
    context: Any = _Context()
    methods = {
        name: getattr(SpaceServicer, name).__wrapped__ for name in ("WriteMany", "TakeMany", "ReadMany")
    }
    decode = {name: handlers.request_deserializer(METHODS[name]) for name in methods}
    write, take = _write_request(batch), _match_request(batch, "batch")
    read = _match_request(batch, "kept")
    kept = pb.WriteManyRequest.FromString(write)
    for entry in kept.entries:
        entry.fields["group"].string_value = "kept"
    kept.lease.Clear()
    kept.lease.forever = True
    outcome = await servicer.perform(
        "WriteMany", methods["WriteMany"], decode["WriteMany"](kept.SerializeToString()), context
    )
    assert not isinstance(outcome, Failure), outcome
    stages: dict[str, list[float]] = {
        stage: [] for stage in ("decode write", "WriteMany", "reply", "TakeMany", "ReadMany")
    }
    clock = time.perf_counter
    for _ in range(rounds * batches):
        t0 = t1 = t2 = t3 = t4 = clock()
        if shape != "read":
            received = decode["WriteMany"](write)
            t1 = clock()
            reply = await servicer.perform("WriteMany", methods["WriteMany"], received, context)
            t2 = clock()
            assert not isinstance(reply, Failure), reply
            if not isinstance(reply, bytes):
                reply = reply.SerializeToString()
            t3 = clock()
            taken = await servicer.perform("TakeMany", methods["TakeMany"], decode["TakeMany"](take), context)
            t4 = clock()
            assert isinstance(taken, bytes), taken
        if shape != "pair":
            found = await servicer.perform("ReadMany", methods["ReadMany"], decode["ReadMany"](read), context)
            assert isinstance(found, bytes), found
        t5 = clock()
        for stage, seconds in zip(stages, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4), strict=True):
            stages[stage].append(seconds * 1e6)
    await backend.close()
    return stages


SHAPES = ("round", "pair", "read")


def instructions(python: str, batches: int, shape: str) -> int:
    """callgrind's instruction count of one round of `batches` batches of `shape`, run by `python`."""
    command = [
        str(Path(python).absolute()),
        Path(__file__).name,
        "--rounds",
        "1",
        "--batches",
        str(batches),
        "--shape",
        shape,
    ]
    # run from this directory, for `entries`; the code is the interpreter's checkout's
    return counted(command, cwd=Path(__file__).resolve().parent, what=f"the {shape} round")


def count(pythons: list[str], sizes: str) -> None:
    small, large = (int(n) for n in sizes.split(","))
    print(
        f"instructions per batch of 100 (callgrind, {small} / {large} batches),"
        f" Python {sys.version.split()[0]}"
    )
    print("| interpreter | round | pair (write_many + take_many) | read_many |")
    print("|---|---|---|---|")
    for python in pythons:
        figures = []
        for shape in SHAPES:
            # reads are cheap: ten times as many, so that start-up's spread (about 1.5 M) is
            # small against the difference
            scale = 10 if shape == "read" else 1
            low, high = instructions(python, small * scale, shape), instructions(python, large * scale, shape)
            figures.append(f"{(high - low) / ((large - small) * scale):,.0f}")
        print(f"| {python} | {' | '.join(figures)} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batches", type=int, default=300, help="batches per round")
    parser.add_argument("--batch", type=int, default=BATCH, help="entries per batch")
    parser.add_argument("--shape", choices=SHAPES, default="round", help="what a batch round runs")
    parser.add_argument("--instructions", metavar="N1,N2", help="count instructions (callgrind) instead")
    parser.add_argument("--python", action="append", help="with --instructions: an interpreter (repeatable)")
    args = parser.parse_args()
    if args.instructions:
        count(args.python or [sys.executable], args.instructions)
        return
    tune_collector()  # as `outrig serve` has it
    print(f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}")
    stages = asyncio.run(_run(args.rounds, args.batches, args.batch, args.shape))
    print(f"load average after {os.getloadavg()[0]:.2f}")
    print("| stage | us per batch, median | least | least per entry |")
    print("|---|---|---|---|")
    total = least = 0.0
    for stage, values in stages.items():
        median, low = statistics.median(values), min(values)
        total += median
        least += low
        print(f"| {stage} | {median:,.1f} | {low:,.1f} | {low / args.batch:.2f} |")
    print(f"| all | {total:,.1f} | {least:,.1f} | {least / args.batch:.2f} |")


if __name__ == "__main__":
    main()
