"""How many Mux messages a write+take pair costs, outrig against the no-op server, the same client.

    python bench/mux_messages.py [--seconds S] [--rounds N] [--baseline-python PATH]

10 asyncio tasks on one AsyncSpace do write+take pairs (bench/workloads.py's `pair_async`) for
S seconds against each target: the no-op gRPC server (bench/noop_server.py), this checkout's
in-memory `outrig serve`, and, with ``--baseline-python``, another checkout's. The client's Mux
stream is wrapped (its gRPC call, nothing in the SDK) to count what goes over it: MuxRequests
written and the ops they carry, MuxReplies read, the results they carry and their bytes. Prints,
per target (medians over the rounds), pairs/s, server CPU per pair, and per operation: requests,
replies, ops per request, results per reply, bytes per reply. Asserts nothing.

The point (issue 21): a server that answers each operation in a message of its own pays gRPC's
per-message cost (its Cython and C core on the event loop) once per operation, one that answers
the results of a MuxRequest together pays it once per message.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from entries import Small
from hotspots import _FRAME, _IDLE, _name, _py_spy, category
from measure import gather_counts, tune_client
from mux import TASKS
from run import _load
from servers import ServerProcess, start_noop, start_outrig, stop_all
from workloads import OWN_CONNECTION, pair_async

import outrig


@dataclass
class Counts:
    requests: int = 0
    ops: int = 0
    replies: int = 0
    results: int = 0
    reply_bytes: int = 0


class _CountedCall:
    """A Mux call whose writes and reads are counted (the rest passes through)."""

    def __init__(self, call: Any, counts: Counts) -> None:
        self._call = call
        self._counts = counts

    def __getattr__(self, name: str) -> Any:
        return getattr(self._call, name)

    def __await__(self) -> Any:
        return self._call.__await__()

    async def write(self, data: bytes) -> None:
        self._counts.requests += 1
        self._counts.ops += _ops_in(data)
        await self._call.write(data)

    async def read(self) -> Any:
        reply = await self._call.read()
        if hasattr(reply, "results"):
            self._counts.replies += 1
            self._counts.results += len(reply.results)
            self._counts.reply_bytes += reply.ByteSize()
        return reply


def _ops_in(data: bytes) -> int:
    from outrig.v1 import space_pb2 as pb

    return len(pb.MuxRequest.FromString(data).ops)


async def _run(server: ServerProcess, seconds: float, warmup: float) -> tuple[float, float, Counts]:
    counts = Counts()
    space = outrig.aio.connect(server.address, space="bench", options=OWN_CONNECTION)
    mux = space._connection.home.mux
    opener = mux._open_stream
    mux._open_stream = lambda **kw: _CountedCall(opener(**kw), counts)
    try:
        await space.count(Small())
        clients = [pair_async(space, n) for n in range(TASKS)]
        stop = time.perf_counter() + warmup
        await gather_counts([_loop(c.step, stop) for c in clients])
        for field in vars(counts):
            setattr(counts, field, 0)
        cpu, began = server.cpu_seconds(), time.perf_counter()
        stop = began + seconds
        pairs = await gather_counts([_loop(c.step, stop) for c in clients])
        elapsed, used = time.perf_counter() - began, server.cpu_seconds() - cpu
    finally:
        await space.close()
    return pairs / elapsed, used / pairs, counts


async def _loop(step: Any, stop: float) -> int:
    done = 0
    while time.perf_counter() < stop:
        done += await step()
    return done


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--baseline-python", help="another checkout's interpreter: its server too")
    parser.add_argument("--profile", type=float, help="then sample each server with py-spy for S seconds")
    args = parser.parse_args()
    print(f"Mux messages per pair: {os.cpu_count()} cores, Python {sys.version.split()[0]}, {tune_client()}")
    print(f"load average before: {_load()}", flush=True)
    workdir = Path(tempfile.mkdtemp(prefix="outrig-mux-messages-"))
    servers: dict[str, ServerProcess] = {"noop": start_noop(workdir)}
    if args.baseline_python:
        servers["before"] = start_outrig(workdir, name="before", python=args.baseline_python)
    servers["outrig"] = start_outrig(workdir, name="outrig")
    rows: dict[str, list[tuple[float, float, Counts]]] = {name: [] for name in servers}
    profiles: dict[str, tuple[Counter[str], Counter[str], int]] = {}
    try:
        with asyncio.Runner() as runner:
            for index in range(args.rounds):
                names = list(servers)
                shift = index % len(names)
                for name in names[shift:] + names[:shift]:
                    rows[name].append(runner.run(_run(servers[name], args.seconds, args.warmup)))
            if args.profile:
                for name, server in servers.items():
                    profiles[name] = _profile(server, args.profile, workdir, runner)
    finally:
        stop_all(servers.values(), workdir)
    print(f"load average after: {_load()}")
    print(
        "| target | pairs/s | server us/pair | requests/op | replies/op | ops/request | results/reply "
        "| bytes/reply |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for name, runs in rows.items():
        rate = statistics.median(r for r, _, _ in runs)
        cpu = statistics.median(u for _, u, _ in runs)
        requests = statistics.median(c.requests / c.ops for _, _, c in runs)
        replies = statistics.median(c.replies / c.ops for _, _, c in runs)
        per_request = statistics.median(c.ops / c.requests for _, _, c in runs)
        per_reply = statistics.median(c.results / c.replies for _, _, c in runs)
        size = statistics.median(c.reply_bytes / c.replies for _, _, c in runs)
        print(
            f"| {name} | {rate:,.0f} | {cpu * 1e6:,.1f} | {requests:.3f} | {replies:.3f} "
            f"| {per_request:.2f} | {per_reply:.2f} | {size:,.0f} |"
        )
    if profiles:
        _report_profiles(profiles)


def _profile(
    server: ServerProcess, seconds: float, workdir: Path, runner: asyncio.Runner
) -> tuple[Counter[str], Counter[str], int]:
    """py-spy --native on `server` while the pairs run: the event loop's busy samples by owner of
    the innermost frame, and grpc's own by the Python frame (outside grpc) that called it."""
    raw = workdir / f"{server.name}.raw"
    command = [_py_spy(), "record", "-p", str(server.pid), "-d", str(int(seconds)), "-f", "raw"]
    spy = subprocess.Popen(
        [*command, "-o", str(raw), "--threads", "--native"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    rate, _, _ = runner.run(_run(server, seconds + 1.0, 0.0))  # the whole sampled window
    spy.wait()
    owners: Counter[str] = Counter()
    callers: Counter[str] = Counter()
    for line in raw.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        frames = stack.split(";")
        if not frames[0].startswith(f"thread ({server.pid})"):
            continue
        parsed = [match for frame in frames[1:] if (match := _FRAME.match(frame))]
        if parsed and parsed[-1]["function"] in _IDLE:
            continue
        owned = [frame for frame in parsed if category(frame) != "cpython"]
        owner = category(owned[-1]) if owned else "cpython"
        owners[owner] += int(count_text)
        owners["(busy)"] += int(count_text)
        if owner == "grpc":
            outside = [frame for frame in owned if category(frame) != "grpc"]
            callers[_name(outside[-1]) if outside else "(none)"] += int(count_text)
    return owners, callers, max(1, round(rate * int(seconds)))


def _report_profiles(profiles: dict[str, tuple[Counter[str], Counter[str], int]]) -> None:
    per_sample = 1e6 / 100  # py-spy samples at 100 Hz: 10,000 us a sample
    print()
    print("event loop busy time per pair by owner of the innermost frame (us; py-spy --native)")
    names = list(profiles)
    owners = sorted({key for counted, _, _ in profiles.values() for key in counted})
    print("| owner | " + " | ".join(names) + " |")
    print("|---|" + "---|" * len(names))
    for owner in owners:
        cells = [f"{counted[owner] * per_sample / pairs:,.1f}" for counted, _, pairs in profiles.values()]
        print(f"| {owner} | " + " | ".join(cells) + " |")
    for name, (_, callers, pairs) in profiles.items():
        print()
        print(f"{name}: grpc's Cython and C core by its Python caller (us per pair)")
        for caller, count in callers.most_common(8):
            print(f"  {count * per_sample / pairs:7.1f}  {caller}")


if __name__ == "__main__":
    main()
