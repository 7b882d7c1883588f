"""How far outrig's server is from the least a space must do: server CPU per write+take pair over
the Mux stream, outrig against the no-op server and against bench/minimal_server.py, in one run.

    python bench/floor.py [--rounds N] [--seconds S] [--warmup S] [--shapes 10_shared,1] [--quick]

Targets, each its own process started once for the run: the no-op server (bench/noop_server.py:
canned replies, the floor of any Python gRPC service), the minimal server in memory and with its
log (bench/minimal_server.py: a hash index of written entries, takes that find and unfile them,
and with ``--data-dir`` one fdatasync of an append-only log per event-loop turn), and this
checkout's ``outrig serve``, in memory and durable (``--durability always``). The client shapes
are bench/mux.py's (``10_shared``: 10 asyncio tasks on one connection; ``1``: one blocking
Space), each round running every shape against every target in an order rotated per round.

Prints, per shape and target, the median pairs/s and server CPU per pair (all threads, at the
window's edges), each over the no-op server's, and what is outrig's own: outrig's CPU per pair
less the minimal server's of the same kind (memory or durable), over the no-op's. Issue 21's
targets are in the no-op's units (1.8x in memory, 3x durable, 10 tasks on one connection): the
minimal server's factor is what no space written in Python on grpc.aio goes below, so the room
a target leaves for outrig's features is the target less that factor. Prints the core count
and the load average at the start and the end; asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

from before_after import client_shapes, shape_name
from measure import tune_client
from mux import Probe, Shape
from run import _load, progress
from servers import (
    MAX_MESSAGE_BYTES,
    ServerProcess,
    _start_python_server,
    redis_available,
    start_durable_outrig,
    start_noop,
    start_outrig,
    start_redis,
    stop_all,
)
from workloads import Plan, redis_pair

_HERE = Path(__file__).resolve().parent
TARGETS = ("noop", "minimal_memory", "minimal_durable", "outrig_memory", "outrig_durable")
REDIS = ("redis_memory", "redis_aof")  # LPUSH + BRPOP through redis-py, when redis-server is installed


def start_minimal(workdir: Path, durable: bool) -> ServerProcess:
    """bench/minimal_server.py, with a fresh data dir in workdir when `durable`."""
    name = "minimal-durable" if durable else "minimal-memory"
    flags: list[str] = []
    if durable:
        data = workdir / f"{name}-data"
        shutil.rmtree(data, ignore_errors=True)
        data.mkdir()
        flags = ["--data-dir", str(data)]
    command = [
        sys.executable, str(_HERE / "minimal_server.py"), "--listen", "127.0.0.1:0",
        "--max-message-bytes", str(MAX_MESSAGE_BYTES), *flags,
    ]  # fmt: skip
    return _start_python_server(name, command, r"minimal listening on (\S+)", workdir)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    parser.add_argument("--seconds", type=float, default=3.0, help="measured seconds per run (default 3)")
    parser.add_argument("--warmup", type=float, default=1.0, help="warm-up seconds per run (default 1)")
    parser.add_argument("--shapes", default="10_shared,1", help="client shapes (bench/mux.py's)")
    parser.add_argument(
        "--workloads", help="bench/run.py's workloads (take_many, notify, pair) instead of the Mux shapes"
    )
    parser.add_argument("--quick", action="store_true", help="1 round of 1 s runs")
    args = parser.parse_args()
    rounds, seconds, warmup = (1, 1.0, 0.5) if args.quick else (args.rounds, args.seconds, args.warmup)
    shapes = client_shapes(args.shapes, args.workloads)
    client = tune_client()
    print(f"server CPU per pair against the floors: {os.cpu_count()} cores, Python {sys.version.split()[0]}")
    print(f"client process: {client}")
    print(f"{rounds} rounds x 1 run of {seconds:g} s (after {warmup:g} s warm-up) per shape and target")
    print(f"load average before: {_load()}", flush=True)

    workdir = Path(tempfile.mkdtemp(prefix="outrig-floor-"))
    servers: dict[str, ServerProcess] = {}
    results: dict[tuple[str, str], list[tuple[float, float]]] = {}  # (target, shape) -> (rate, cpu)
    try:
        servers["noop"] = start_noop(workdir)
        servers["minimal_memory"] = start_minimal(workdir, durable=False)
        servers["minimal_durable"] = start_minimal(workdir, durable=True)
        servers["outrig_memory"] = start_outrig(workdir, name="outrig-memory")
        servers["outrig_durable"] = start_durable_outrig(workdir, name="outrig-durable")
        if redis_available() and not args.workloads:
            servers["redis_memory"] = start_redis(workdir)
            servers["redis_aof"] = start_redis(workdir, aof_always=True)
        names = list(servers)
        with asyncio.Runner() as runner:
            plan = Plan(seconds, warmup, runner, mux=True)
            for index in range(rounds):
                for shape in shapes:
                    shift = index % len(names)
                    for name in names[shift:] + names[:shift]:
                        server = servers[name]
                        if not isinstance(shape, Shape):
                            workload, clients = shape
                            sample = workload.run(server, clients, plan)
                        elif name in REDIS:  # its 10 clients are 10 connections
                            sample = redis_pair(server, shape.clients, plan)
                        else:
                            probe = Probe(server, plan, None)
                            sample = probe.result(shape.run(server, plan, True, probe)).sample
                        label = shape_name(shape)
                        results.setdefault((name, label), []).append((sample.rate, sample.server_cpu))
                        progress(
                            f"round {index + 1}/{rounds} {label:<12} {name:<16} {sample.rate:>9,.1f} "
                            f"/s {sample.server_cpu * 1e6:>9,.1f} us each"
                        )
    finally:
        stop_all(servers.values(), workdir)
    print(f"load average after: {_load()}")
    print()
    unit = "unit" if args.workloads else "pair"
    print(
        f"| shape | target | {unit}s/s | vs Redis (same kind) | vs no-op | server us/{unit} (min - max) |"
        " vs no-op | outrig's own over the minimal's, vs no-op |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for shape in shapes:
        cpu = {name: statistics.median(c for _, c in results[(name, shape_name(shape))]) for name in names}
        rates = {name: statistics.median(r for r, _ in results[(name, shape_name(shape))]) for name in names}
        for name in names:
            runs = results[(name, shape_name(shape))]
            low, high = min(c for _, c in runs), max(c for _, c in runs)
            kind = name.partition("_")[2]
            own = ""
            if name.startswith("outrig"):
                own = f"{(cpu[name] - cpu[f'minimal_{kind}']) / cpu['noop']:.2f}"
            redis = {"memory": "redis_memory", "durable": "redis_aof"}.get(kind)
            versus = f"{rates[name] / rates[redis]:.2f}" if redis in rates and name not in REDIS else ""
            spread = f"{cpu[name] * 1e6:,.1f} ({low * 1e6:,.0f} - {high * 1e6:,.0f})"
            print(
                f"| {shape_name(shape)} | {name} | {rates[name]:,.0f} | {versus} | "
                f"{rates[name] / rates['noop']:.2f} | {spread} | {cpu[name] / cpu['noop']:.2f} | {own} |"
            )


if __name__ == "__main__":
    main()
