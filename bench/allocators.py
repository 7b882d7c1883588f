"""The server's allocator for HD arrays (3.6 MB entries): the standard ways against each other and
against the no-op floor, in one run.

    python bench/allocators.py [--quick] [--rounds N] [--seconds S] [--baseline-python PATH]
                               [--variants NAME,...]

Each variant is an `outrig serve --in-memory` of this checkout, its own process, differing only in
its environment (bench/servers.py's start_outrig with `extra_env`):
  - glibc: what `outrig serve --allocator glibc` does (service/process.py's tune_malloc: mmap threshold
    32 MiB, no automatic trim, malloc_trim once idle), protobuf's upb left to call malloc_trim(0)
    after every 10,000 frees of its arenas' blocks;
  - glibc-default: glibc as it comes (the environment sets the default trim threshold, so
    tune_malloc leaves it: every 3.6 MB entry its own fresh mapping);
  - jemalloc, tcmalloc: Debian's libjemalloc2 / libtcmalloc-minimal4 preloaded (LD_PRELOAD), as the
    container image can (and `outrig serve --allocator auto`, the default, does for tcmalloc where
    it is installed); tune_malloc then changes nothing (the allocator is not glibc's);
  - jemalloc-60s: jemalloc with MALLOC_CONF=dirty_decay_ms:60000 (freed pages kept a minute, as
    the glibc variant's idle release does);
  - patched (with --baseline-python, the interpreter of a checkout from before this change): the
    GOT redirect of upb's malloc_trim that `outrig serve` used to do;
and the no-op gRPC server (bench/noop_server.py), the floor.

Workloads (bench/workloads.py, 1 blocking client and 10 asyncio clients): HD array write, HD array
read, and the write+take pair, which runs before each HD row as in bench/run.py: its many small
calls are what set off upb's trims between two HD runs. Rounds interleave every variant in each
workload, in an order rotated per round, after one unrecorded warm-up round; medians over the
rounds of the rate, the server's CPU per unit and its minor page faults per unit (/proc/PID/stat).
This (client) process gets tune_client's settings; run it with the allocator preloaded
(LD_PRELOAD=...libjemalloc.so.2 python bench/allocators.py) for a client free of upb's trims too.
Prints the core count and the load average at the start and the end; asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from measure import Sample, tune_client
from run import _load, preload, progress
from servers import ServerProcess, start_noop, start_outrig, stop_all
from workloads import WORKLOADS, Plan

_LIBRARIES = Path("/usr/lib") / f"{os.uname().machine}-linux-gnu"
JEMALLOC = str(_LIBRARIES / "libjemalloc.so.2")
TCMALLOC = str(_LIBRARIES / "libtcmalloc_minimal.so.4")

VARIANTS: dict[str, dict[str, str]] = {
    # `outrig serve --allocator glibc`: without it, the server would start itself again on tcmalloc.
    "glibc": {"OUTRIG_ALLOCATOR": "glibc"},
    # glibc's own default trim threshold, given by the environment: tune_malloc leaves glibc alone.
    "glibc-default": {"OUTRIG_ALLOCATOR": "glibc", "GLIBC_TUNABLES": "glibc.malloc.trim_threshold=131072"},
    "jemalloc": {"LD_PRELOAD": JEMALLOC},
    "jemalloc-60s": {"LD_PRELOAD": JEMALLOC, "MALLOC_CONF": "dirty_decay_ms:60000"},
    "tcmalloc": {"LD_PRELOAD": TCMALLOC},
}
WORKLOAD_NAMES = ("pair", "hd_write", "hd_read")
CLIENTS = (1, 10)


def _minor_faults(server: ServerProcess) -> int:
    with open(f"/proc/{server.pid}/stat") as stat:
        return int(stat.read().rpartition(")")[2].split()[7])  # minflt


@dataclass(frozen=True)
class Run:
    sample: Sample
    faults: float  # the server's minor page faults per unit, the whole run (its warm-up too)


def measure(server: ServerProcess, workload_name: str, clients: int, plan: Plan) -> Run:
    workload = next(w for w in WORKLOADS if w.name == workload_name)
    before = _minor_faults(server)
    sample = workload.run(server, clients, plan)
    units = sample.rate * (plan.seconds + plan.warmup)
    return Run(sample, (_minor_faults(server) - before) / units if units else float("nan"))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="1 round of 0.5 s runs, no warm-up round")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    parser.add_argument("--seconds", type=float, default=1.5, help="measured seconds per run (default 1.5)")
    parser.add_argument("--baseline-python", help="an interpreter whose outrig still patches upb (main's)")
    parser.add_argument(
        "--variants", type=lambda text: text.split(","), default=list(VARIANTS), metavar="NAME,..."
    )
    args = parser.parse_args()
    missing = [path for path in (JEMALLOC, TCMALLOC) if not os.path.exists(path)]
    if missing:
        sys.exit(f"missing {', '.join(missing)}: apt-get install -y libjemalloc2 libtcmalloc-minimal4")
    rounds, seconds = (1, 0.5) if args.quick else (args.rounds, args.seconds)
    client = tune_client()
    print(f"allocators for HD arrays: {os.cpu_count()} cores, Python {sys.version.split()[0]}")
    print(f"client process: {client}; LD_PRELOAD={os.environ.get('LD_PRELOAD', '')!r}")
    print(f"{rounds} rounds x 1 run of {seconds:g} s per workload and target, interleaved")
    print(f"load average before: {_load()}", flush=True)

    workdir = Path(tempfile.mkdtemp(prefix="outrig-allocators-"))
    servers: dict[str, ServerProcess] = {}
    results: dict[tuple[str, str], list[Run]] = {}
    try:
        for name in args.variants:
            servers[name] = start_outrig(workdir, name=name, extra_env=VARIANTS[name])
        if args.baseline_python:
            servers["patched"] = start_outrig(workdir, name="patched", python=args.baseline_python)
        servers["noop"] = start_noop(workdir)
        with asyncio.Runner() as runner:
            plan = Plan(seconds, 0.2 if args.quick else 0.5, runner, mux=True)
            for server in servers.values():
                if server.name != "noop":
                    preload(server, plan)
            names = list(servers)
            schedule = [("warm-up", False)] * (0 if args.quick else 1)
            schedule += [(f"round {i + 1}/{rounds}", True) for i in range(rounds)]
            for index, (label, recorded) in enumerate(schedule):
                for workload in WORKLOAD_NAMES:
                    for clients in CLIENTS:
                        shift = index % len(names)
                        for name in names[shift:] + names[:shift]:
                            run = measure(servers[name], workload, clients, plan)
                            if recorded:
                                results.setdefault((f"{workload}_{clients}", name), []).append(run)
                            progress(
                                f"{label} {workload}_{clients:<3} {name:<14} {run.sample.rate:>9,.1f}/s "
                                f"{run.sample.server_cpu * 1e6:>8,.0f} us {run.faults:>7,.0f} faults"
                            )
    finally:
        stop_all(servers.values(), workdir)
    print(f"load average after: {_load()}")
    print()
    print("| workload | target | rate/s | vs no-op | server CPU us/unit | vs no-op | server faults/unit |")
    print("|---|---|---|---|---|---|---|")
    for workload in WORKLOAD_NAMES:
        for clients in CLIENTS:
            cell = f"{workload}_{clients}"
            floor = results[(cell, "noop")]
            floor_rate = statistics.median(r.sample.rate for r in floor)
            floor_cpu = statistics.median(r.sample.server_cpu for r in floor)
            for name in servers:
                runs = results[(cell, name)]
                rate = statistics.median(r.sample.rate for r in runs)
                cpu = statistics.median(r.sample.server_cpu for r in runs)
                faults = statistics.median(r.faults for r in runs)
                print(
                    f"| {cell} | {name} | {rate:,.1f} | {rate / floor_rate:.2f} | {cpu * 1e6:,.0f} | "
                    f"{cpu / floor_cpu:.2f} | {faults:,.0f} |"
                )


if __name__ == "__main__":
    main()
