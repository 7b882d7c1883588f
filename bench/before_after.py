"""Server CPU per write+take pair over the Mux stream: this checkout against another one (the code
before a change), in memory and durable, with the no-op gRPC server as the floor, in one run.

    python bench/before_after.py --baseline-python PATH [--rounds N] [--seconds S] [--warmup S]
                                 [--shapes 10_shared,1] [--workloads take_many,read_many]
                                 [--profile S] [--quick]

PATH is the interpreter of a virtualenv with the other checkout installed (e.g. a `git worktree`
of main with its own `.venv`: `git worktree add ../base main && cd ../base && python3 -m venv .venv
&& .venv/bin/pip install -e '.[dev]'`). Targets, each its own process started once for the run
(bench/servers.py): the baseline's `outrig serve` in memory and durable (`--durability always`),
this checkout's the same two, and the no-op server (bench/noop_server.py). (Commit fa07e26 had
``--loop NAME``, this checkout's servers once more on `outrig serve --loop uvloop`: measured and
dropped, docs/performance.md.)

Client shapes (bench/mux.py's, the SDK's Mux stream): ``10_shared``, 10 asyncio tasks on one
AsyncSpace; ``1``, one blocking Space. Each round runs every shape against every target, in an
order rotated per round; each run has a warm-up, then a measured window (pairs completed in it,
and the CPU time of the server process, all threads, at its edges). Medians over the rounds, with
the ratios: each server's CPU per pair over the no-op server's of the same rounds, and after /
before. Prints the core count and the load average at the start and the end; asserts nothing.

With ``--workloads NAMES`` (bench/run.py's workloads, e.g. ``take_many,read_many``), each round
runs those instead of the pairs, with 1 blocking client and with 10 asyncio clients (a connection
each), as bench/run.py does; the shapes are then ``<workload>_1`` and ``<workload>_10``, the
unit is bench/run.py's (a write_many(100) + take_many(100) batch pair, a read_many(100)), and
every server is first given bench/run.py's entries to read (`run.preload`).

With ``--profile S``, after the rounds each outrig server is sampled by ``py-spy record --native``
(bench/hotspots.py's parse and report: the event loop's thread, idle samples set apart) for S
seconds while 10 tasks on one connection do pairs, and the shares of its busy samples spent in
getpid(2) (Python 3.11's running-loop check), in creating tasks and futures, and in stepping tasks
are printed beside the usual tables.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from hotspots import Profile, _py_spy, parse, report
from measure import tune_client
from mux import SHAPE, Probe, Shape
from run import _load, preload, progress
from servers import (
    ServerProcess,
    start_durable_outrig,
    start_noop,
    start_outrig,
    stop_all,
)
from workloads import WORKLOADS, Plan, Workload


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--baseline-python", required=True, help="the other checkout's interpreter")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    parser.add_argument("--seconds", type=float, default=3.0, help="measured seconds per run (default 3)")
    parser.add_argument("--warmup", type=float, default=1.0, help="warm-up seconds per run (default 1)")
    parser.add_argument("--shapes", default="10_shared,1", help="client shapes (bench/mux.py's)")
    parser.add_argument(
        "--workloads", help="bench/run.py's workloads (e.g. take_many,read_many) instead of the pairs"
    )
    parser.add_argument("--profile", type=float, help="also sample each outrig server for S seconds")
    parser.add_argument("--quick", action="store_true", help="1 round of 1 s runs")
    args = parser.parse_args()
    rounds, seconds, warmup = (1, 1.0, 0.5) if args.quick else (args.rounds, args.seconds, args.warmup)
    shapes = client_shapes(args.shapes, args.workloads)
    client = tune_client()
    print(f"server CPU per pair, before / after: {os.cpu_count()} cores, Python {sys.version.split()[0]}")
    print(f"baseline: {args.baseline_python}; client process: {client}")
    print(f"{rounds} rounds x 1 run of {seconds:g} s (after {warmup:g} s warm-up) per shape and target")
    print(f"load average before: {_load()}", flush=True)

    workdir = Path(tempfile.mkdtemp(prefix="outrig-before-after-"))
    base = args.baseline_python
    servers: dict[str, ServerProcess] = {}
    results: dict[tuple[str, str], list[tuple[float, float]]] = {}  # (target, shape) -> (rate, cpu)
    profiles: dict[str, tuple[Profile, dict[str, int], float]] = {}
    try:
        servers["before_memory"] = start_outrig(workdir, name="before-memory", python=base)
        servers["before_durable"] = start_durable_outrig(workdir, name="before-durable", python=base)
        servers["after_memory"] = start_outrig(workdir, name="after-memory")
        servers["after_durable"] = start_durable_outrig(workdir, name="after-durable")
        servers["noop"] = start_noop(workdir)
        names = list(servers)
        with asyncio.Runner() as runner:
            plan = Plan(seconds, warmup, runner, mux=True)
            if args.workloads:
                for server in servers.values():
                    preload(server, plan)
            for index in range(rounds):
                for shape in shapes:
                    shift = index % len(names)
                    for name in names[shift:] + names[:shift]:
                        server = servers[name]
                        if isinstance(shape, Shape):
                            probe = Probe(server, plan, None)
                            sample = probe.result(shape.run(server, plan, True, probe)).sample
                        else:
                            workload, clients = shape
                            sample = workload.run(server, clients, plan)
                        label = shape_name(shape)
                        results.setdefault((name, label), []).append((sample.rate, sample.server_cpu))
                        progress(
                            f"round {index + 1}/{rounds} {label:<12} {name:<15} {sample.rate:>9,.1f} "
                            f"/s {sample.server_cpu * 1e6:>9,.1f} us each"
                        )
            if args.profile:
                for name, server in servers.items():
                    if name != "noop":
                        profiles[name] = _profile(server, workdir, args.profile, runner)
    finally:
        stop_all(servers.values(), workdir)
    print(f"load average after: {_load()}")
    print()
    unit = "unit" if args.workloads else "pair"
    print(f"| shape | target | {unit}s/s | server us/{unit} (min - max) | vs no-op | after / before |")
    print("|---|---|---|---|---|---|")
    for shape in shapes:
        cpu = {name: statistics.median(c for _, c in results[(name, shape_name(shape))]) for name in servers}
        for name in servers:
            runs = results[(name, shape_name(shape))]
            rate = statistics.median(r for r, _ in runs)
            low, high = min(c for _, c in runs), max(c for _, c in runs)
            kind = name.rpartition("_")[2]
            before = cpu.get(f"before_{kind}")
            versus = (
                f"{cpu[name] / before:.2f}"
                if before and not name.startswith("before") and name != "noop"
                else ""
            )
            print(
                f"| {shape_name(shape)} | {name} | {rate:,.0f} | {cpu[name] * 1e6:,.1f} ({low * 1e6:,.0f} - "
                f"{high * 1e6:,.0f}) | {cpu[name] / cpu['noop']:.2f} | {versus} |"
            )
    for name, (profile, marked, rate) in profiles.items():
        print()
        report(f"{name}, 10 tasks on one connection", profile, rate)
        print("| on the stack (busy samples) | share |")
        print("|---|---|")
        for what, count in marked.items():
            print(f"| {what} | {count / profile.busy:.1%} |")


def client_shapes(shapes: str, workloads: str | None) -> list[Shape | tuple[Workload, int]]:
    """bench/mux.py's shapes by name, or with `workloads` bench/run.py's workloads by name, each with
    1 and with 10 clients (also bench/floor.py's)."""
    if not workloads:
        return [SHAPE[name] for name in shapes.split(",")]
    return [
        (workload, clients)
        for name in workloads.split(",")
        for workload in WORKLOADS
        if workload.name == name
        for clients in (1, 10)
    ]


def shape_name(shape: Shape | tuple[Workload, int]) -> str:
    """A shape's name in the tables: bench/mux.py's, or a workload's as bench/run.py's ratios name it."""
    return shape.name if isinstance(shape, Shape) else f"{shape[0].name}_{shape[1]}"


#: Native and Python frames that mark the per-operation asyncio costs this bench is about.
MARKS = {
    "the running-loop check (getpid, get_running_loop, get_event_loop)": (
        "getpid",
        "get_running_loop",
        "get_event_loop",
    ),
    "creating a task (create_task, ensure_future, Task.__init__)": (
        "create_task",
        "ensure_future",
        "task_init",
        "Task.__init__",
    ),
    "creating a future (create_future, Future.__init__)": ("create_future", "future_init", "Future.__init__"),
    "scheduling a callback (call_soon)": ("call_soon",),
}


def _profile(
    server: ServerProcess, workdir: Path, seconds: float, runner: asyncio.Runner
) -> tuple[Profile, dict[str, int], float]:
    """py-spy --native on `server` for `seconds` while 10 tasks on one connection do pairs."""
    raw = workdir / f"{server.name}.raw"
    plan = Plan(seconds + 1.0, 0.5, runner, mux=True)
    command = [_py_spy(), "record", "-p", str(server.pid), "-d", str(int(seconds)), "-f", "raw"]
    spy = subprocess.Popen(
        [*command, "-o", str(raw), "--threads", "--native"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    probe = Probe(server, plan, None)
    pairs = probe.result(SHAPE["10_shared"].run(server, plan, True, probe)).sample.rate
    spy.wait()
    profile = parse(raw, server.pid, seconds)
    marked = dict.fromkeys(MARKS, 0)
    main_thread = f"thread ({server.pid})"
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack.startswith(main_thread) or stack.rpartition(";")[2].startswith(
            ("epoll_wait", "EpollSelector")
        ):
            continue
        for what, needles in MARKS.items():
            if any(needle in stack for needle in needles):
                marked[what] += int(count)
    return profile, marked, pairs


if __name__ == "__main__":
    main()
