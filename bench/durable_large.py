"""Large entries on a durable server: this checkout against another one, in one run.

    python bench/durable_large.py --baseline-python PATH [--rounds N] [--entries K] [--passes P]

bench/run.py's HD array rows run in memory; this bench times the same HD array entry
(bench/entries.py's `Frame`: 921,600 int32 values, 3.6 MB) on `outrig serve --data-dir ...
--durability always`, where each operation waits for its commit: a write stores the entry's
payload in SQLite (overflow pages), a take deletes it. PATH is the interpreter of another
checkout's virtualenv (the code before a change); each round starts a fresh durable server of
each checkout, in an order rotated per round, and one blocking client of this process makes P
passes (default 3) over it, each writing K entries (default 10), reading each once, then taking
each: the passes after the first reuse the pages the takes before them freed, as a store in
service does. Prints the median milliseconds per write, read and take (over every pass of every
round) of each checkout, each after / before, the store's size after the writes,
the core count and the load average. Asserts nothing (each read and take must find its entry).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from entries import Frame, hd_entry
from servers import ServerProcess, start_durable_outrig
from workloads import OWN_CONNECTION

import outrig

PHASES = ("write", "read", "take")


def _round(server: ServerProcess, entries: int, passes: int) -> dict[str, list[float]]:
    """Milliseconds per operation of each phase of each pass, against one fresh server."""
    with outrig.connect(server.address, space="large", options=OWN_CONNECTION) as space:
        each = [_pass(space, entries) for _ in range(passes)]
    return {phase: [one[phase] for one in each] for phase in PHASES}


def _pass(space: outrig.Space, entries: int) -> dict[str, float]:
    """Write `entries` HD arrays, read each, take each: milliseconds per operation of each."""
    entry = hd_entry()
    times: dict[str, float] = {}
    started = time.perf_counter()
    for key in range(entries):
        entry.client = key
        space.write(entry, lease=300.0)
    times["write"] = time.perf_counter() - started
    started = time.perf_counter()
    for key in range(entries):
        if space.read_nowait(Frame(client=key)) is None:
            raise SystemExit(f"a read of entry {key} found nothing")
    times["read"] = time.perf_counter() - started
    started = time.perf_counter()
    for key in range(entries):
        if space.take_nowait(Frame(client=key)) is None:
            raise SystemExit(f"a take of entry {key} found nothing")
    times["take"] = time.perf_counter() - started
    return {phase: seconds * 1e3 / entries for phase, seconds in times.items()}


def _store_bytes(workdir: Path, name: str) -> int:
    return sum(file.stat().st_size for file in (workdir / f"{name}-data").glob("outrig.db*"))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--baseline-python", required=True, help="the other checkout's interpreter")
    parser.add_argument("--rounds", type=int, default=3, help="rounds (default 3)")
    parser.add_argument("--entries", type=int, default=10, help="entries written per pass (default 10)")
    parser.add_argument("--passes", type=int, default=3, help="passes per server (default 3)")
    args = parser.parse_args()
    targets = {"before": args.baseline_python, "after": sys.executable}
    print(
        f"durable large entries (3.6 MB HD arrays), {args.passes} passes of {args.entries} a round,"
        f" {args.rounds} rounds, {os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}"
    )
    results: dict[str, dict[str, list[float]]] = {name: {p: [] for p in PHASES} for name in targets}
    sizes: dict[str, int] = {}
    with tempfile.TemporaryDirectory(prefix="durable-large-") as temporary:
        workdir = Path(temporary)
        for number in range(args.rounds):
            order = list(targets) if number % 2 == 0 else list(reversed(targets))
            for name in order:
                server = start_durable_outrig(workdir, name=name, python=targets[name])
                try:
                    for phase, millis in _round(server, args.entries, args.passes).items():
                        results[name][phase].extend(millis)
                finally:
                    server.stop()
                sizes[name] = _store_bytes(workdir, name)
    print(f"{'ms per operation':<18}{'before':>10}{'after':>10}{'after / before':>16}")
    for phase in PHASES:
        before, after = (statistics.median(results[name][phase]) for name in targets)
        print(f"{phase:<18}{before:>10.1f}{after:>10.1f}{after / before:>16.2f}")
    print(f"store after the takes: before {sizes['before'] >> 10:,} KiB, after {sizes['after'] >> 10:,} KiB")
    print(f"load at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
