"""Partitioned spaces (docs/scaling.md): what fan-out costs, and the blocking take's claim protocol.

    python bench/partitions.py [--quick] [--part b|c] [--rounds N] [--entries N]

b. Fan-out latency: one in-memory server holding a space in P = 1 (unpartitioned: the baseline),
   2 and 4 partitions by "region", each with --entries entries spread over 64 regions. One
   blocking client times read_nowait of a template without the routing field (a match in every
   partition), read_nowait of one that matches nothing (every partition looked at), count of the
   space, and, as the routed case, read_nowait naming a region (one partition). Median and p99
   per call, and the ratio to P = 1, rounds interleaved.
c. The blocking take without the routing field: 10 takers, each on its own connection, wait with
   take(Job(), timeout) on a space of P = 1 or 4; one writer writes --entries entries one at a time,
   each stamped with its write time, after all takers are parked (the server's parked reads are
   polled). Wake-up latency: from the write's call to the take's return (same machine, monotonic
   clock), median and p99; and the check that every entry was taken exactly once.

Part a (worker processes) is bench/workers.py. Rounds are interleaved, figures are medians over
rounds; prints the core count and load average: server and clients share this machine's cores.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from servers import ServerProcess, start_outrig_with

import outrig

REGIONS = [f"region-{i}" for i in range(64)]
SHAPES = (1, 2, 4)


@dataclass
class Job(outrig.Entry, type_name="bench.PartJob"):
    region: str | None = None
    n: int | None = None
    written: float | None = None


def _config(workdir: Path) -> Path:
    path = workdir / "partitions.toml"
    lines = ["[space_defaults]", "max_entries = 10000000", ""]
    for p in SHAPES:
        if p > 1:
            lines += [f"[spaces.p{p}]", 'partition_by = "region"', f"partitions = {p}", ""]
    path.write_text("\n".join(lines))
    return path


def _start(workdir: Path) -> ServerProcess:
    return start_outrig_with(
        workdir, "--in-memory", "--config", str(_config(workdir)), "--log-level", "WARNING"
    )


def _quantiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return statistics.median(ordered), ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


# ---------------------------------------------------------------- b. fan-out latency

CASES = ("read_any", "read_none", "count", "read_routed")


def _time_case(space: outrig.Space, case: str, calls: int) -> list[float]:
    samples = []
    for i in range(calls):
        began = time.perf_counter()
        if case == "read_any":
            space.read_nowait(Job())
        elif case == "read_none":
            space.read_nowait(Job(n=-1))
        elif case == "count":
            space.count(Job())
        else:
            space.read_nowait(Job(region=REGIONS[i % len(REGIONS)]))
        samples.append(time.perf_counter() - began)
    return samples


def part_b(workdir: Path, rounds: int, entries: int, calls: int) -> None:
    print(f"\nb. fan-out latency, {entries} entries per space, {calls} calls a case a round, {rounds} rounds")
    server = _start(workdir)
    try:
        spaces = {p: outrig.connect(server.address, space=f"p{p}" if p > 1 else "p1") for p in SHAPES}
        for space in spaces.values():
            space.write_many(
                [Job(region=REGIONS[i % len(REGIONS)], n=i) for i in range(entries)], lease=3600.0
            )
        samples: dict[tuple[int, str], list[float]] = {}
        for _ in range(rounds):
            for p in SHAPES:
                for case in CASES:
                    _time_case(spaces[p], case, 20)  # warm
                    samples.setdefault((p, case), []).append(
                        statistics.median(_time_case(spaces[p], case, calls))
                    )
        print(f"{'case':<12} {'P':>2} {'median us':>10} {'worst us':>9} {'vs P=1':>7}")
        for case in CASES:
            base = statistics.median(samples[(1, case)])
            for p in SHAPES:
                rounds_medians = samples[(p, case)]
                median = statistics.median(rounds_medians)
                spread = max(rounds_medians)
                print(f"{case:<12} {p:>2} {median * 1e6:>10.0f} {spread * 1e6:>9.0f} {median / base:>7.2f}")
        print("(worst: the slowest round's median; every partition is on this one server)")
        for space in spaces.values():
            space.close()
    finally:
        server.stop()


# ---------------------------------------------------------------- c. blocking take


def _parked(space: outrig.Space, at_least: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while space.describe().waiters < at_least:
        if time.monotonic() > deadline:
            raise RuntimeError("the takers did not park")
        time.sleep(0.005)


def _taker(
    address: str,
    name: str,
    stop: threading.Event,
    lock: threading.Lock,
    taken: list[int],
    latencies: list[float],
) -> None:
    with outrig.connect(address, space=name) as mine:
        while not stop.is_set():
            job = mine.take(Job(), timeout=0.5)
            if isinstance(job, Job) and job.n is not None and job.written is not None:
                done = time.monotonic()
                with lock:
                    taken.append(job.n)
                    latencies.append(done - job.written)


def part_c(workdir: Path, rounds: int, entries: int) -> None:
    print(f"\nc. blocking take without the routing field: 10 takers, {entries} entries, {rounds} rounds")
    server = _start(workdir)
    try:
        results: dict[int, list[tuple[float, float, bool]]] = {}
        for _ in range(rounds):
            for p in (1, 4):
                name = f"p{p}"
                taken: list[int] = []
                latencies: list[float] = []
                lock = threading.Lock()
                stop = threading.Event()

                args = (server.address, name, stop, lock, taken, latencies)
                threads = [threading.Thread(target=_taker, args=args) for _ in range(10)]
                for thread in threads:
                    thread.start()
                with outrig.connect(server.address, space=name) as writer:
                    for i in range(entries):
                        _parked(writer, 10 * p if i == 0 else 1)
                        writer.write(Job(region=REGIONS[i % len(REGIONS)], n=i, written=time.monotonic()))
                        deadline = time.monotonic() + 30
                        while len(taken) <= i and time.monotonic() < deadline:
                            time.sleep(0.0005)
                    stop.set()
                    for thread in threads:
                        thread.join()
                    left = writer.count(Job())
                exact = sorted(taken) == list(range(entries)) and left == 0
                median, p99 = _quantiles(latencies)
                results.setdefault(p, []).append((median, p99, exact))
        base = statistics.median(m for m, _, _ in results[1])
        print(f"{'P':>2} {'wake median ms':>15} {'p99 ms':>8} {'vs P=1':>7} {'exactly once':>13}")
        for p, rows in results.items():
            median = statistics.median(m for m, _, _ in rows)
            p99 = statistics.median(q for _, q, _ in rows)
            exact = all(e for _, _, e in rows)
            verdict = "yes" if exact else "NO"
            print(f"{p:>2} {median * 1e3:>15.2f} {p99 * 1e3:>8.2f} {median / base:>7.2f} {verdict:>13}")
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--part", choices=["b", "c"])
    parser.add_argument("--rounds", type=int)
    parser.add_argument("--entries", type=int)
    args = parser.parse_args()
    rounds = args.rounds or (3 if args.quick else 5)
    print(f"cores: {os.cpu_count()}, load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    with tempfile.TemporaryDirectory(prefix="outrig-bench-partitions-") as work:
        workdir = Path(work)
        if args.part in (None, "b"):
            part_b(
                workdir, rounds, args.entries or (1000 if args.quick else 10_000), 100 if args.quick else 300
            )
        if args.part in (None, "c"):
            part_c(workdir, rounds, args.entries or (50 if args.quick else 200))


if __name__ == "__main__":
    main()
