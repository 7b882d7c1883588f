"""The blocking SDK's cost per write+take pair, this checkout's client against another's, in one run.

    python bench/sync_client.py --baseline-python ../base/.venv/bin/python [--rounds N] [--seconds S]
                                [--shapes sync1,threads10] [--servers memory,durable]

Clients (each a process of its own, bench/pair_profile.py's client, run by the given interpreter, so
that it imports that checkout's SDK): ``base, stream`` and ``base, unary`` (the other checkout, its
default and ``mux=False``), and ``new`` (this checkout's default), in client shapes ``sync1`` (one
blocking `outrig.Space`) and ``threads10`` (10 threads on one `Space`). Servers: one `outrig serve
--in-memory` and one durable (``--durability always``) of this checkout, started once for the run.
Each round runs every client against every server in every shape, in an order rotated per round;
a run starts its client process, lets it warm up, then measures a window of S seconds (default 4):
pairs/s, the client process's CPU per pair (and its kernel part) and the server's, from /proc.
Prints the core count and the load average at the start and the end, medians over the rounds (with
min-max of pairs/s), and the ratios new / base. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from pair_profile import Client, _cpu_seconds
from run import _load
from servers import ServerProcess, start_durable_outrig, start_outrig, stop_all

_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Variant:
    name: str
    python: str
    mux: bool


@dataclass(frozen=True)
class Run:
    rate: float
    client_us: float
    client_kernel_us: float
    server_us: float


def _kernel_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return int(fields[12]) / _TICKS


def measure(server: ServerProcess, variant: Variant, shape: str, seconds: float) -> Run:
    client = Client(server.address, shape, variant.mux, variant.python)
    try:
        pid = client.process.pid
        time.sleep(0.5)
        first, began = client.pairs(), time.monotonic()
        server_0, client_0, kernel_0 = server.cpu_seconds(), _cpu_seconds(pid), _kernel_seconds(pid)
        time.sleep(seconds)
        pairs = client.pairs() - first
        elapsed = time.monotonic() - began
        server_1, client_1, kernel_1 = server.cpu_seconds(), _cpu_seconds(pid), _kernel_seconds(pid)
    finally:
        client.stop()
    per = 1e6 / max(1, pairs)
    return Run(
        pairs / elapsed, (client_1 - client_0) * per, (kernel_1 - kernel_0) * per, (server_1 - server_0) * per
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--baseline-python", required=True, help="the other checkout's interpreter")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    parser.add_argument("--seconds", type=float, default=4.0, help="measured seconds per run (default 4)")
    parser.add_argument("--shapes", default="sync1,threads10", help="sync1, threads10 (comma-separated)")
    parser.add_argument("--servers", default="memory,durable", help="memory, durable (comma-separated)")
    args = parser.parse_args()
    variants = (
        Variant("base, stream", args.baseline_python, True),
        Variant("base, unary", args.baseline_python, False),
        Variant("new", sys.executable, True),
    )
    shapes, kinds = args.shapes.split(","), args.servers.split(",")
    print(f"sync SDK per pair: {os.cpu_count()} cores, Python {sys.version.split()[0]}")
    print(f"{args.rounds} rounds x 1 run of {args.seconds:g} s per client, shape and server, interleaved")
    print(f"load average before: {_load()}", flush=True)
    workdir = Path(tempfile.mkdtemp(prefix="outrig-sync-client-"))
    servers: dict[str, ServerProcess] = {}
    results: dict[tuple[str, str, str], list[Run]] = {}
    try:
        if "memory" in kinds:
            servers["memory"] = start_outrig(workdir)
        if "durable" in kinds:
            servers["durable"] = start_durable_outrig(workdir)
        for round_number in range(args.rounds):
            for kind, server in servers.items():
                for shape in shapes:
                    shift = round_number % len(variants)
                    for variant in variants[shift:] + variants[:shift]:
                        run = measure(server, variant, shape, args.seconds)
                        results.setdefault((kind, shape, variant.name), []).append(run)
                        print(
                            f"round {round_number + 1}/{args.rounds} {kind:<8} {shape:<9} {variant.name:<13}"
                            f" {run.rate:>7,.0f} pairs/s, client {run.client_us:>6,.0f} us"
                            f" (kernel {run.client_kernel_us:>4,.0f}), server {run.server_us:>6,.0f} us",
                            file=sys.stderr,
                            flush=True,
                        )
    finally:
        stop_all(servers.values(), workdir)
    print(f"load average after: {_load()}")
    print()
    print("| server | shape | client | pairs/s (min-max) | client us/pair (kernel) | server us/pair |")
    print("|---|---|---|---|---|---|")
    for kind in servers:
        for shape in shapes:
            for variant in variants:
                runs = results[(kind, shape, variant.name)]
                rates = [r.rate for r in runs]
                print(
                    f"| {kind} | {shape} | {variant.name} | {statistics.median(rates):,.0f} "
                    f"({min(rates):,.0f}-{max(rates):,.0f}) | "
                    f"{statistics.median(r.client_us for r in runs):,.0f} "
                    f"({statistics.median(r.client_kernel_us for r in runs):,.0f}) | "
                    f"{statistics.median(r.server_us for r in runs):,.0f} |"
                )
    print()
    for kind in servers:
        for shape in shapes:
            new = results[(kind, shape, "new")]
            for base_name in ("base, stream", "base, unary"):
                base = results[(kind, shape, base_name)]
                ratios = [
                    statistics.median(getattr(r, what) for r in new)
                    / statistics.median(getattr(r, what) for r in base)
                    for what in ("rate", "client_us", "server_us")
                ]
                print(
                    f"{kind} {shape}: new / {base_name}: pairs/s {ratios[0]:.2f}, "
                    f"client CPU {ratios[1]:.2f}, server CPU {ratios[2]:.2f}"
                )


if __name__ == "__main__":
    main()
