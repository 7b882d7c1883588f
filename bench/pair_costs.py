"""Where the server CPU of a write+take pair goes: gRPC, outrig's handler wrapper, the operations.

    python bench/pair_costs.py [--rounds R] [--pairs N]

One blocking client (tuned as in bench/run.py) does write+take pairs of bench/run.py's small entry
against three servers, in R interleaved rounds of N pairs (after one unrecorded round), and prints
the medians of each server's CPU per pair and of pairs per second:

- ``noop``: bench/noop_server.py, the floor for a Python gRPC service;
- ``canned``: `outrig serve` whose Write and Take answer a canned reply of the same size from
  inside outrig's own handler wrapper (request decoding and the open guard run, the operation
  does not; metrics are off, as in bench/run.py). canned minus noop is what outrig's wrapper and
  transport cost;
- ``outrig``: `outrig serve`, in memory as in bench/run.py, with the handlers timed. outrig minus
  canned is what the operations cost; the thread CPU measured inside the Write and Take handlers
  says how it splits between the two.

Last, the same two handler calls in a tight loop in this process, without gRPC (``in process``),
for how much running among gRPC's calls slows the same code down. The last line is a summary:
``pair costs: noop=US canned=US outrig=US write=US take=US in_process=US`` (server CPU per pair,
handler thread CPU per call, us).

This script is also the canned and timed servers: ``--serve MODE ARGS...`` runs `outrig serve
ARGS` with the handlers replaced or timed (SIGUSR1 prints the handler times on stderr).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, cast

import grpc
from entries import Small, canned_small
from measure import tune_client
from servers import ServerProcess, start_noop, start_outrig
from workloads import OWN_CONNECTION

import outrig
from outrig._codec import encode_entry_into, encode_template_into
from outrig.service.backends.embedded.backend import EmbeddedBackend
from outrig.service.config import ServerConfig
from outrig.service.engine.model import LeaseGrant
from outrig.service.protocol import codec
from outrig.service.transport import servicer
from outrig.service.transport.handlers import Context, Received
from outrig.v1 import space_pb2 as pb

SPACE = "bench"
LEASE = 60.0
WAIT = 5.0
Handler = Callable[[Any, Any, Any], Awaitable[Any]]


def _entry() -> Small:
    return Small(key=1, client=0, group="pair", note="n" * 20)


def _template() -> Small:
    return Small(client=0)


# ---------------------------------------------------------------- the servers this script runs


def _replace(handlers: dict[str, Handler]) -> None:
    for name, handler in handlers.items():
        setattr(servicer.SpaceServicer, name, handler)


def _canned() -> None:
    write_reply = pb.WriteReply(lease=codec.lease_message(LeaseGrant(1, time.time() + LEASE, LEASE)))
    take_reply = pb.MatchReply(entries=[canned_small()]).SerializeToString()

    async def write(self: Any, received: Any, context: Any) -> pb.WriteReply:
        return write_reply

    async def take(self: Any, request: Any, context: Any) -> bytes:
        return take_reply

    write.__name__, take.__name__ = "Write", "Take"  # the wrapper looks the method up by name
    _replace({"Write": servicer.unary(write), "Take": servicer.unary(take)})


def _timed() -> None:
    spent = {"Write": [0, 0], "Take": [0, 0]}

    def timed(name: str, handler: Handler) -> Handler:
        async def run(self: Any, request: Any, context: Any) -> Any:
            began = time.thread_time_ns()
            try:
                return await handler(self, request, context)
            finally:
                tally = spent[name]
                tally[0] += time.thread_time_ns() - began
                tally[1] += 1

        return run

    _replace({name: timed(name, getattr(servicer.SpaceServicer, name)) for name in spent})

    def report(*_: object) -> None:
        figures = " ".join(f"{name}={ns / max(calls, 1) / 1000:.1f}" for name, (ns, calls) in spent.items())
        print(f"handler us per call: {figures}", file=sys.stderr, flush=True)
        for tally in spent.values():
            tally[0] = tally[1] = 0

    signal.signal(signal.SIGUSR1, report)


def _serve(mode: str, arguments: list[str]) -> int:
    {"canned": _canned, "timed": _timed}[mode]()
    from outrig.service.cli import main

    return main(arguments)


def _start(mode: str, workdir: Path) -> ServerProcess:
    if mode == "noop":
        return start_noop(workdir)
    return start_outrig(workdir, mode, program=(__file__, "--serve", mode))


def _handler_times(server: ServerProcess) -> tuple[float, float]:
    """Ask the timed server for its handler times since the last ask (us per Write, per Take)."""
    log = server.log
    before = log.stat().st_size
    os.kill(server.pid, signal.SIGUSR1)
    for _ in range(100):
        time.sleep(0.05)
        with log.open() as text:
            text.seek(before)
            for line in text:
                if line.startswith("handler us per call:"):
                    fields = dict(item.split("=") for item in line.split(":", 1)[1].split())
                    return float(fields["Write"]), float(fields["Take"])
    raise RuntimeError(f"the timed server did not report: {log}")


# ---------------------------------------------------------------- measuring


def _pairs(space: outrig.Space, count: int) -> None:
    entry, template = _entry(), _template()
    for _ in range(count):
        space.write(entry, lease=LEASE)
        if space.take(template, timeout=WAIT) is None:
            raise RuntimeError("a take of the entry just written found nothing")


async def _in_process(count: int) -> float:
    """us per pair of the Write and Take handlers called directly, in this process."""
    config = ServerConfig()
    backend = EmbeddedBackend(config)
    await backend.start()
    space = servicer.SpaceServicer(backend, config.limits)
    writes = []
    for number in range(count):
        request = pb.WriteRequest(space=SPACE, request_id=f"pair-{number}")
        encode_entry_into(request.entry, _entry())
        request.lease.seconds = LEASE
        writes.append(request.SerializeToString())
    take = pb.MatchRequest(space=SPACE, timeout=WAIT)
    encode_template_into(take.templates.add(), _template())
    take_bytes = take.SerializeToString()
    # No call carries them: nothing reads the context (the guard is open and the calls succeed).
    no_call = cast("Context", None)
    try:
        began = time.perf_counter()
        for number, raw in enumerate(writes):
            await space.Write(Received(pb.WriteRequest.FromString(raw), raw), no_call)
            take_request = pb.MatchRequest.FromString(take_bytes)
            take_request.request_id = f"take-{number}"
            if not await space.Take(take_request, no_call):
                raise RuntimeError("in process: a take found nothing")
        return (time.perf_counter() - began) / count * 1e6
    finally:
        await backend.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="measured rounds (default 5)")
    parser.add_argument("--pairs", type=int, default=3000, help="pairs per run (default 3000)")
    parser.add_argument("--serve", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.serve:
        return _serve(options.serve[0], options.serve[1:])
    if options.rounds < 1 or options.pairs < 1:
        parser.error("--rounds and --pairs must be at least 1")
    allocator = tune_client()
    print(
        f"pair costs: {os.cpu_count()} cores, Python {platform.python_version()}, grpcio {grpc.__version__}; "
        f"{options.rounds} rounds of {options.pairs} pairs after one unrecorded round, 1 blocking client "
        f"({allocator})"
    )
    modes = ("noop", "canned", "outrig")
    workdir = Path(tempfile.mkdtemp(prefix="outrig-pair-costs-"))
    started = {mode: _start("timed" if mode == "outrig" else mode, workdir) for mode in modes}
    cpu: dict[str, list[float]] = {mode: [] for mode in modes}
    rate: dict[str, list[float]] = {mode: [] for mode in modes}
    handlers: list[tuple[float, float]] = []
    try:
        spaces = {
            mode: outrig.connect(server.address, space=SPACE, options=OWN_CONNECTION, mux=False)
            for mode, server in started.items()
        }
        for round_number in range(options.rounds + 1):
            for mode in modes:
                server = started[mode]
                cpu_before, began = server.cpu_seconds(), time.perf_counter()
                _pairs(spaces[mode], options.pairs)
                seconds, cpu_after = time.perf_counter() - began, server.cpu_seconds()
                if mode == "outrig":
                    times = _handler_times(server)
                    if round_number:
                        handlers.append(times)
                if round_number:
                    cpu[mode].append((cpu_after - cpu_before) / options.pairs * 1e6)
                    rate[mode].append(options.pairs / seconds)
        for space in spaces.values():
            space.close()
    finally:
        for server in started.values():
            server.stop()
    in_process = statistics.median(asyncio.run(_in_process(options.pairs)) for _ in range(3))
    print("| server | server CPU per pair (us), median | min - max | pairs/s, median |")
    print("|---|---|---|---|")
    for mode in modes:
        print(
            f"| {mode} | {statistics.median(cpu[mode]):,.0f} | {min(cpu[mode]):,.0f} - {max(cpu[mode]):,.0f} "
            f"| {statistics.median(rate[mode]):,.0f} |"
        )
    write = statistics.median(w for w, _ in handlers)
    take = statistics.median(t for _, t in handlers)
    print(f"outrig's handlers, thread CPU per call (medians): Write {write:.0f} us, Take {take:.0f} us")
    print(f"the same handlers in a tight loop in this process, without gRPC: {in_process:.0f} us per pair")
    medians = {mode: statistics.median(cpu[mode]) for mode in modes}
    print(
        f"pair costs: noop={medians['noop']:.0f} canned={medians['canned']:.0f} "
        f"outrig={medians['outrig']:.0f} write={write:.0f} take={take:.0f} in_process={in_process:.0f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
