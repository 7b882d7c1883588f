"""outrig side by side with its baselines, in one run on one machine: throughput, medians, ratios.

    python bench/run.py [--quick] [--seconds S] [--rounds N] [--runs N] [--only SECTION]
                        [--warmup-rounds N] [--workloads NAME,...] [--untuned-client]
                        [--allocator auto|tcmalloc|glibc]

Workloads, each with 1 blocking client and with 10 asyncio clients (bench/workloads.py): scalar
read, read_many of 100, write+take pair, write_many(100)+take_many(100), HD array write and read
(921,600 x int32, 3.6 MB), and notify fan-out (events delivered per second to 1 or 10
subscribers while one writer writes). Each runs against:
  - outrig: `outrig serve --in-memory`, its own process, on the allocator `outrig serve` picks
    (tcmalloc where libtcmalloc_minimal.so.4 is installed, as in the container image; --allocator
    glibc for the allocator it starts with); the header says which allocator each server runs on;
  - the no-op gRPC server (bench/noop_server.py): the same service and generated code on
    grpc.aio, answering every call at once with a canned reply the size of outrig's. It is the
    floor for any Python gRPC service, and for the HD array rows an echo of the same bytes;
  - Redis (redis-server, LPUSH + BRPOP through redis-py), for the write+take pair only.
The same client code runs against outrig and the no-op server, in this process, which gives
itself the allocator settings `outrig serve` has (measure.tune_client; --untuned-client leaves
them), so that the client's page faults do not decide the HD array rows.

Method: rounds x runs, interleaved (each round runs every workload, and each workload's targets
alternate in order), after a warm-up round of one unrecorded run per workload and target (the
servers' heaps grow to what the runs hold, as a server's does in service); every run has a
short warm-up, then a measured window. Figures are medians
with min and max. Then the scaling section (bench/scaling.py): latency with 1,000 vs 1,000,000
entries, write cost with 10,000 parked waiters, memory per entry and per waiter.

The last line is ``ratios: NAME=VALUE ...``: outrig / no-op at the same client count for each
workload (redis_pair_N: outrig's pair / Redis's). Targets are printed beside them; nothing is
asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import grpc
import numpy
import redis
from entries import BATCH, READ_KEY_BASE, SPACE, Frame, Small, hd_entry, read_entries
from google import protobuf
from measure import Sample, tune_client
from scaling import ScalingResult, run_scaling
from servers import (
    MAX_MESSAGE_BYTES,
    REDIS_MISSING,
    ServerProcess,
    redis_available,
    start_noop,
    start_outrig,
    start_redis,
)
from workloads import REDIS_PAIR, WORKLOADS, Plan, Workload, connect

import outrig
from outrig._codec import encode_template
from outrig.v1 import space_pb2 as pb
from outrig.v1.space_pb2_grpc import SpaceStub

CLIENTS = (1, 10)
SCALING_TARGET = 1.2
TAKE_TARGET = 1.3  # issue 22's, for the range and order_by takes
_STARTED = time.monotonic()


def progress(message: str) -> None:
    print(f"[{time.monotonic() - _STARTED:6.1f} s] {message}", file=sys.stderr, flush=True)


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def _source_state() -> str:
    """The commit measured, and whether the server or SDK had uncommitted changes."""
    root = Path(__file__).resolve().parent.parent
    try:
        commit = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--", "service", "client", "proto"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "source: not a git checkout"
    return f"source: commit {commit}" + (
        ", with uncommitted changes in service/ client/ proto/" if dirty else ""
    )


def _redis_server_version() -> str:
    try:
        out = subprocess.run(["redis-server", "--version"], capture_output=True, text=True).stdout
    except OSError:
        return "missing"
    return next((part[2:] for part in out.split() if part.startswith("v=")), out.strip())


def preload(server: ServerProcess, plan: Plan) -> None:
    """What outrig's reads find: the small entries and one HD array entry."""
    with connect(server, plan) as space:
        space.write_many(read_entries(), lease=outrig.FOREVER)
        space.write(hd_entry(), lease=outrig.FOREVER)


def reply_sizes(server: ServerProcess) -> list[int]:
    """Bytes of the replies to a scalar read, a read_many and an HD array read, straight off the wire."""
    options = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)]
    with grpc.insecure_channel(server.address, options=options) as channel:
        stub = SpaceStub(channel)

        def size(
            method: Callable[[pb.MatchRequest], pb.MatchReply], template: outrig.Entry, count: int
        ) -> int:
            request = pb.MatchRequest(
                space=SPACE, templates=[encode_template(template)], timeout=10.0, max_entries=count
            )
            return method(request).ByteSize()

        return [
            size(stub.Read, Small(key=READ_KEY_BASE), 0),
            size(stub.ReadMany, Small(group="read"), BATCH),
            size(stub.Read, Frame(tag="hd"), 0),
        ]


Results = dict[tuple[str, str], list[Sample]]  # (cell, target) -> samples; a cell is "read_10"


def measure_all(
    servers: dict[str, ServerProcess],
    plan: Plan,
    rounds: int,
    runs: int,
    redis_server: ServerProcess | None,
    workloads: tuple[Workload, ...],
    warmup_rounds: int,
) -> Results:
    """Run every cell `rounds` x `runs` times per target, interleaved, after `warmup_rounds`
    unrecorded rounds of one run per cell and target."""
    cells: list[tuple[Workload, int, tuple[str, ...]]] = [
        (workload, clients, ("outrig", "noop")) for workload in workloads for clients in CLIENTS
    ]
    if redis_server is not None:
        cells += [(REDIS_PAIR, clients, ("redis",)) for clients in CLIENTS]
    everything = {**servers, **({"redis": redis_server} if redis_server is not None else {})}
    results: Results = {}
    schedule = [(f"warm-up {i + 1}/{warmup_rounds}", 1, False) for i in range(warmup_rounds)]
    schedule += [(f"round {i + 1}/{rounds}", runs, True) for i in range(rounds)]
    for index, (label, round_runs, recorded) in enumerate(schedule):
        for workload, clients, targets in cells:
            cell = f"{workload.name}_{clients}"
            for run in range(round_runs):
                shift = (index + run) % len(targets)
                for target in targets[shift:] + targets[:shift]:
                    server = everything[target]
                    try:
                        sample = workload.run(server, clients, plan)
                    except Exception:
                        for process in everything.values():
                            process.check_alive()
                        raise
                    if recorded:
                        results.setdefault((cell, target), []).append(sample)
                    progress(f"{label} {cell:<14} {target:<6} {sample.rate:>10,.1f} {workload.unit}")
    return results


@dataclass(frozen=True)
class Throughput:
    results: Results
    sizes: tuple[list[int], list[int]]  # reply sizes: outrig's, the no-op server's
    redis: bool  # whether the Redis rows ran


def run_throughput(
    workdir: Path,
    plan: Plan,
    rounds: int,
    runs: int,
    workloads: tuple[Workload, ...],
    warmup_rounds: int,
    allocator: str = "auto",
) -> Throughput:
    """The throughput section: outrig, the no-op server and Redis, each started once for all rounds
    (outrig with `outrig serve --allocator ALLOCATOR`: by default tcmalloc where it is installed, as
    the container image runs it)."""
    servers: dict[str, ServerProcess] = {}
    redis_server: ServerProcess | None = None
    try:
        servers["outrig"] = start_outrig(workdir, extra_env={"OUTRIG_ALLOCATOR": allocator})
        servers["noop"] = start_noop(workdir)
        if redis_available() and any(workload.name == "pair" for workload in workloads):
            redis_server = start_redis(workdir)
        print(
            "server allocators: "
            + ", ".join(f"{name} {server.allocator()}" for name, server in servers.items())
            + f" (outrig serve --allocator {allocator})",
            flush=True,
        )
        preload(servers["outrig"], plan)
        sizes = (reply_sizes(servers["outrig"]), reply_sizes(servers["noop"]))
        results = measure_all(servers, plan, rounds, runs, redis_server, workloads, warmup_rounds)
    finally:
        for server in (*servers.values(), *([redis_server] if redis_server else [])):
            server.stop()
    return Throughput(results, sizes, redis_server is not None)


def _median(samples: list[Sample], key: Callable[[Sample], float]) -> float:
    return statistics.median(key(sample) for sample in samples)


def _rate(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:,.1f}"


def ratios_of(results: Results) -> dict[str, float]:
    ratios: dict[str, float] = {}
    for workload in WORKLOADS:
        for clients in CLIENTS:
            cell = f"{workload.name}_{clients}"
            if (cell, "outrig") not in results:
                continue
            outrig_rate = _median(results[(cell, "outrig")], lambda s: s.rate)
            ratios[cell] = outrig_rate / _median(results[(cell, "noop")], lambda s: s.rate)
    for clients in CLIENTS:
        if (f"redis_pair_{clients}", "redis") in results:
            outrig_rate = _median(results[(f"pair_{clients}", "outrig")], lambda s: s.rate)
            redis_rate = _median(results[(f"redis_pair_{clients}", "redis")], lambda s: s.rate)
            ratios[f"redis_pair_{clients}"] = outrig_rate / redis_rate
    return ratios


def print_throughput(results: Results, ratios: dict[str, float]) -> None:
    print("| workload | clients | unit | outrig | min - max | vs | baseline | min - max | ratio | target |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for workload in (*WORKLOADS, REDIS_PAIR):
        for clients in CLIENTS:
            cell = f"{workload.name}_{clients}"
            if cell not in ratios:
                continue
            baseline = "redis" if workload is REDIS_PAIR else "noop"
            mine = results[(f"pair_{clients}" if baseline == "redis" else cell, "outrig")]
            theirs = results[(cell, baseline)]
            target = f">= {workload.target}" if workload.target is not None else ""
            print(
                f"| {workload.label} | {clients} | {workload.unit} | "
                f"{_rate(_median(mine, lambda s: s.rate))} | "
                f"{_rate(min(s.rate for s in mine))} - {_rate(max(s.rate for s in mine))} | "
                f"{'Redis' if baseline == 'redis' else 'no-op gRPC'} | "
                f"{_rate(_median(theirs, lambda s: s.rate))} | "
                f"{_rate(min(s.rate for s in theirs))} - {_rate(max(s.rate for s in theirs))} | "
                f"{ratios[cell]:.2f} | {target} |"
            )


def print_cpu(results: Results) -> None:
    print("CPU time per unit of work (medians, us): the server process, all threads; the client process.")
    print()
    print("| workload | clients | outrig server | baseline server | client (outrig) | client (baseline) |")
    print("|---|---|---|---|---|---|")
    for workload in (*WORKLOADS, REDIS_PAIR):
        for clients in CLIENTS:
            cell = f"{workload.name}_{clients}"
            baseline = "redis" if workload is REDIS_PAIR else "noop"
            if (cell, baseline) not in results:
                continue
            mine = results[(f"pair_{clients}" if baseline == "redis" else cell, "outrig")]
            theirs = results[(cell, baseline)]
            label = f"{workload.label} ({'Redis' if baseline == 'redis' else 'no-op gRPC'})"
            print(
                f"| {label} | {clients} | {_median(mine, lambda s: s.server_cpu) * 1e6:,.0f} | "
                f"{_median(theirs, lambda s: s.server_cpu) * 1e6:,.0f} | "
                f"{_median(mine, lambda s: s.client_cpu) * 1e6:,.0f} | "
                f"{_median(theirs, lambda s: s.client_cpu) * 1e6:,.0f} |"
            )


def print_scaling(result: ScalingResult) -> dict[str, float]:
    def row(
        label: str, samples: dict[str, list[float]], small: str, large: str, target: float = SCALING_TARGET
    ) -> float:
        a, b = statistics.median(samples[small]), statistics.median(samples[large])
        print(
            f"| {label} | {a:,.0f} us ({min(samples[small]):,.0f} - {max(samples[small]):,.0f}) | "
            f"{b:,.0f} us ({min(samples[large]):,.0f} - {max(samples[large]):,.0f}) | {b / a:.2f} | "
            f"<= {target} |"
        )
        return b / a

    sizes = f"{result.small:,} vs {result.large:,} entries"
    print("| operation (1 blocking client, through the server) | small | large | ratio | target |")
    print("|---|---|---|---|---|")
    scaling = {
        "read": row(f"read, template with a set field ({sizes})", result.read_us, "small", "large"),
        "take": row(f"take of the oldest, wildcard template ({sizes})", result.take_us, "small", "large"),
        "range_take": row(
            f"take of the oldest in a range of 10 keys ({sizes})",
            result.range_take_us,
            "small",
            "large",
            TAKE_TARGET,
        ),
        "order_take": row(
            f"take of the highest key, order_by desc ({sizes})",
            result.order_take_us,
            "small",
            "large",
            TAKE_TARGET,
        ),
        "write_parked": row(
            f"write (0 vs {result.waiters:,} parked non-matching takes)", result.write_us, "none", "parked"
        ),
        "write_ranged": row(
            f"write (0 vs {result.waiters:,} parked non-matching range takes)",
            result.write_us,
            "none",
            "ranged",
        ),
        "write_gapped": row(
            f"write (0 vs {result.waiters:,} parked two-sided range takes, the value in a gap)",
            result.write_us,
            "none",
            "gapped",
        ),
    }
    print()
    print(
        f"server memory: {result.bytes_per_entry:,.0f} bytes per stored small entry "
        f"({result.entry_bytes} bytes encoded; resident {result.rss_large / 2**20:,.0f} MiB with "
        f"{result.large:,} entries, filled in "
        f"{result.fill_seconds:.1f} s); {result.bytes_per_waiter:,.0f} bytes per parked take"
    )
    return scaling


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--quick", action="store_true", help="a smoke run: 1 round x 1 run of 0.5 s, scaling to 100,000"
    )
    parser.add_argument("--seconds", type=float, help="measured seconds per run (default 1.5)")
    parser.add_argument("--rounds", type=int, help="interleaved rounds (default 3)")
    parser.add_argument("--runs", type=int, help="runs per target per round (default 2)")
    parser.add_argument(
        "--warmup-rounds",
        type=int,
        help="unrecorded rounds of one run per workload and target before the measured ones "
        "(default 1; 0 with --quick)",
    )
    parser.add_argument("--large", type=int, help="entries in the large space (default 1,000,000)")
    parser.add_argument("--only", choices=["throughput", "scaling"], help="run one section only")
    parser.add_argument(
        "--workloads",
        type=lambda text: text.split(","),
        default=[w.name for w in WORKLOADS],
        metavar="NAME,...",
        help="the throughput workloads to run (default: all of them: "
        + ",".join(w.name for w in WORKLOADS)
        + ")",
    )
    parser.add_argument(
        "--untuned-client",
        action="store_true",
        help="leave this (client) process's allocator as glibc and protobuf set it (see tune_client)",
    )
    parser.add_argument(
        "--retry-deadline",
        type=float,
        default=None,
        help="the SDK's retry_deadline (default: the SDK's own, so writes and takes carry request ids; "
        "0 turns retries and request ids off)",
    )
    parser.add_argument(
        "--allocator",
        choices=["auto", "tcmalloc", "glibc"],
        default="auto",
        help="outrig serve --allocator for the throughput section's server (default auto: tcmalloc "
        "where it is installed, as shipped; glibc: the allocator it starts with)",
    )
    parser.add_argument(
        "--unary",
        action="store_true",
        help="the SDK's unary calls (mux=False) instead of its default, the Mux stream",
    )
    args = parser.parse_args()
    unknown = set(args.workloads) - {w.name for w in WORKLOADS}
    if unknown:
        parser.error(f"--workloads: unknown {', '.join(sorted(unknown))}")
    workloads = tuple(w for w in WORKLOADS if w.name in args.workloads)
    client_process = "left as glibc and protobuf set it" if args.untuned_client else tune_client()
    quick = args.quick
    seconds = args.seconds or (0.5 if quick else 1.5)
    warmup = 0.2 if quick else 0.5
    rounds = args.rounds or (1 if quick else 3)
    warmup_rounds = args.warmup_rounds if args.warmup_rounds is not None else (0 if quick else 1)
    runs = args.runs or (1 if quick else 2)
    large = args.large or (100_000 if quick else 1_000_000)
    ops = 500 if quick else 2000

    print(
        f"outrig end-to-end bench: {os.cpu_count()} cores, Python {platform.python_version()}, "
        f"grpcio {grpc.__version__}, protobuf {protobuf.__version__}, numpy {numpy.__version__}, "
        f"redis-py {redis.__version__}, redis-server {_redis_server_version()}"
    )
    print(_source_state())
    print(f"client process allocator: {client_process}")
    print(
        "client path: " + ("unary calls (mux=False)" if args.unary else "the Mux stream (the SDK's default)")
    )
    print(
        f"{rounds} rounds x {runs} runs of {seconds:g} s (after {warmup:g} s warm-up) per workload and "
        f"target, interleaved, after {warmup_rounds} unrecorded warm-up round(s) of 1 run; clients "
        f"share the machine with the servers"
    )
    print(f"load average before: {_load()}", flush=True)

    workdir = Path(tempfile.mkdtemp(prefix="outrig-bench-"))
    throughput: Throughput | None = None
    scaling: ScalingResult | None = None
    with asyncio.Runner() as runner:
        plan = Plan(seconds, warmup, runner, mux=not args.unary)
        if args.retry_deadline is not None:
            plan = dataclasses.replace(plan, retry_deadline=args.retry_deadline)
        if args.only != "scaling":
            throughput = run_throughput(workdir, plan, rounds, runs, workloads, warmup_rounds, args.allocator)
        if args.only != "throughput":
            scaling = run_scaling(
                workdir, plan, large=large, waiters=10_000, rounds=rounds, runs=runs, ops=ops, log=progress
            )
    shutil.rmtree(workdir, ignore_errors=True)
    print(f"load average after: {_load()}")

    ratios: dict[str, float] = {}
    if throughput is not None:
        sizes = [f"{a:,} / {b:,}" for a, b in zip(*throughput.sizes, strict=True)]
        print("reply bytes, outrig / no-op: scalar read {}, read_many {}, HD array read {}".format(*sizes))
        if not throughput.redis:
            print(REDIS_MISSING)
        print()
        ratios = ratios_of(throughput.results)
        print_throughput(throughput.results, ratios)
        print()
        print_cpu(throughput.results)
        print()
    if scaling is not None:
        scaling_ratios = print_scaling(scaling)
        print()
        print(
            "scaling: "
            + " ".join(f"{name}={value:.2f}" for name, value in scaling_ratios.items())
            + f" (targets <= {SCALING_TARGET}; range_take and order_take <= {TAKE_TARGET})"
        )
    if throughput is not None:
        targets = [(f"{w.name}_{c}", w.target) for w in workloads for c in CLIENTS if w.target is not None]
        met = sum(ratios[name] >= target for name, target in targets)
        print(
            "targets: "
            + ", ".join(f"{name} >= {target}" for name, target in targets)
            + f" (met: {met} of {len(targets)})"
        )
    print("ratios: " + " ".join(f"{name}={value:.2f}" for name, value in ratios.items()))


if __name__ == "__main__":
    main()
