"""How the pure engine's costs scale: the "no scans" design, measured.

    python bench/engine_scaling.py [--quick]

Measures, in-process with no gRPC (the engine alone, so the ratios isolate its data structures):
  - read (find_or_conflict) of a template with a set field, with 1,000 vs 1,000,000 entries in the space;
  - take of the oldest entry by wildcard template, same sizes;
  - write of an entry with 0 vs 10,000 parked non-matching waiters;
  - resident memory per stored entry (two fields, a two-level type);
  - a lease storm: every entry expiring at once, reaped in batches of 1,000 (time per batch).
Each figure is the median over rounds; ratios compare the large case to the small one in the same
run. Prints the core count and Python version. Nothing here is asserted: it reports.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from collections.abc import Callable

from outrig.service.engine import (
    FakeClock,
    FieldValue,
    NewEntry,
    SpaceEngine,
    SpaceSettings,
    Template,
    Waiter,
)


def _space(entries: int, clock: FakeClock, lease: float = 3600.0) -> SpaceEngine:
    space = SpaceEngine("bench", SpaceSettings(max_entries=10**8, max_bytes=10**12), clock)
    batch = 10_000
    for start in range(0, entries, batch):
        space.write(
            [
                NewEntry(
                    "bench.Task",
                    ("bench.Base",),
                    {"k": FieldValue("int", i), "job": FieldValue("string", "j")},
                    None,
                    40,
                )
                for i in range(start, min(start + batch, entries))
            ],
            lease,
        )
    return space


def _rss() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _per_op(op: Callable[[int], object], count: int) -> float:
    started = time.perf_counter()
    for i in range(count):
        op(i)
    return (time.perf_counter() - started) / count


def _median(samples: list[float]) -> float:
    return statistics.median(samples)


def _reader(space: SpaceEngine, size: int) -> Callable[[int], object]:
    def read(i: int) -> object:
        template = Template("bench.Base", {"k": FieldValue("int", (i * 7919) % size)})
        return space.find_or_conflict([template], take=False)[0]

    return read


def _taker(space: SpaceEngine) -> Callable[[int], object]:
    """Take the oldest entry, then write it back (at the back), keeping the size constant."""
    template = Template("bench.Task", {})

    def take(i: int) -> object:
        (entry,), _ = space.find_or_conflict([template], take=True)
        space.restore([entry])
        return entry

    return take


def _writer(space: SpaceEngine) -> Callable[[int], object]:
    new = NewEntry("bench.Task", ("bench.Base",), {"k": FieldValue("int", 1)}, None, 40)
    return lambda i: space.write([new], 3600.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes, fewer rounds")
    args = parser.parse_args()
    big, rounds, ops = (100_000, 3, 2_000) if args.quick else (1_000_000, 5, 10_000)
    small = 1_000
    print(f"cores={os.cpu_count()} python={platform.python_version()} rounds={rounds} ops/round={ops}")
    clock = FakeClock()
    spaces = {small: _space(small, clock)}
    before = _rss()
    spaces[big] = _space(big, clock)
    per_entry = (_rss() - before) / big

    results: dict[str, dict[int, float]] = {"read k=v": {}, "take oldest": {}}
    for size, space in spaces.items():
        results["read k=v"][size] = _median([_per_op(_reader(space, size), ops) for _ in range(rounds)])
        results["take oldest"][size] = _median([_per_op(_taker(space), ops) for _ in range(rounds)])

    writes: dict[int, float] = {}
    for parked in (0, 10_000):
        space = _space(0, clock)
        for i in range(parked):
            template = Template("bench.Task", {"k": FieldValue("int", -1 - i)})
            space.park(Waiter(space.new_waiter_seq(), (template,), True, lambda entries: True))
        writes[parked] = _median([_per_op(_writer(space), ops) for _ in range(rounds)])

    print(f"{'operation':<34}{'small':>12}{'large':>12}{'ratio':>8}")
    rows = [
        (f"{name} ({small:,} vs {big:,})", by_size[small], by_size[big]) for name, by_size in results.items()
    ]
    rows.append(("write (0 vs 10,000 waiters)", writes[0], writes[10_000]))
    for name, low, high in rows:
        print(f"{name:<34}{low * 1e6:>9.2f} us{high * 1e6:>9.2f} us{high / low:>8.2f}")

    print(f"memory: {per_entry:,.0f} bytes of resident memory per stored two-field entry (engine only)")
    storm = _space(big, clock, lease=1.0)
    clock.advance(2.0)
    steps = []
    while True:
        started = time.perf_counter()
        reaped = storm.reap(1000)
        steps.append(time.perf_counter() - started)
        if reaped < 1000:
            break
    print(
        f"lease storm: {big:,} expiring at once, {len(steps)} reaper steps of 1,000: "
        f"median {_median(steps) * 1e3:.2f} ms, max {max(steps) * 1e3:.2f} ms per step"
    )


if __name__ == "__main__":
    main()
