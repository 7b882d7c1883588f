"""What the admin API costs, and that a purge or a describe never holds the event loop long.

    python bench/admin.py [--quick] [--rounds N]

In process, no gRPC:
  - write: the engine's write of one entry with its write time noted (engine/ages.py, what the
    oldest entry's age needs) vs the same engine with the noting turned off, interleaved rounds;
  - purge under load: a memory backend holding N entries purges them all while a caller counts in
    a loop; the caller's waits during the purge (median, p99, longest) vs with no purge running
    (the baseline), and one purge batch's time (a wait is bounded by a batch, not by N);
  - describe of N entries, likewise;
  - browse: a page of 100 at 1,000 vs N entries, the first page (read from the front) and one from
    the middle (its cursor is found in a copy of the type's entries, which grows with N).
Medians over rounds, ratios in the same run, the core count. Asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import time
from collections.abc import Callable, Coroutine
from typing import Any

from outrig.service.backends.memory.backend import PURGE_BATCH, MemoryBackend
from outrig.service.config import ServerConfig
from outrig.service.engine import FakeClock, FieldValue, NewEntry, SpaceEngine, SpaceSettings, Template

SETTINGS = SpaceSettings(max_entries=10**8, max_bytes=10**12)
TEMPLATE = Template("bench.Task", {})


def _entry(i: int) -> NewEntry:
    return NewEntry("bench.Task", (), {"k": FieldValue("int", i)}, None, 40)


def _write_cost(noting: bool, count: int) -> float:
    clock = FakeClock()
    space = SpaceEngine("bench", SETTINGS, clock)
    if not noting:
        space._note_written = lambda first_id, now: None  # type: ignore[method-assign]
    entries = [[_entry(i)] for i in range(count)]
    started = time.perf_counter()
    for batch in entries:
        space.write(batch, 3600.0)
        clock.advance(0.0001)  # time moves: a checkpoint every second of it
    return (time.perf_counter() - started) / count * 1e6


async def _filled(entries: int) -> MemoryBackend:
    backend = MemoryBackend(ServerConfig(space_defaults=SETTINGS))
    await backend.start()
    for start in range(0, entries, 10_000):
        await backend.write("s", [_entry(i) for i in range(start, min(start + 10_000, entries))], None)
    return backend


async def _waits_during(
    work: Callable[[MemoryBackend], Coroutine[Any, Any, object]], entries: int
) -> tuple[list[float], float]:
    """(a counting caller's waits in ms while `work` runs, sorted; the work's seconds)."""
    backend = await _filled(entries)
    waits: list[float] = []
    task = asyncio.create_task(work(backend))
    started = time.perf_counter()
    while not task.done():
        before = time.perf_counter()
        await backend.count("s", [Template("bench.Other", {})])
        await asyncio.sleep(0)
        waits.append((time.perf_counter() - before) * 1000)
    seconds = time.perf_counter() - started
    await task
    await backend.close()
    return sorted(waits), seconds


async def _idle(backend: MemoryBackend) -> None:
    await asyncio.sleep(0.05)


async def _purge(backend: MemoryBackend) -> None:
    await backend.purge("s", [TEMPLATE], dry_run=False, max_entries=0)


async def _describe(backend: MemoryBackend) -> None:
    await backend.describe("s")


def _browse_ms(entries: int, rounds: int) -> tuple[float, float]:
    """A page of 100's median ms: (the first page, a page from the middle)."""
    space = SpaceEngine("bench", SETTINGS, FakeClock())
    for start in range(0, entries, 10_000):
        space.write([_entry(i) for i in range(start, min(start + 10_000, entries))], 3600.0)
    firsts: list[float] = []
    middles: list[float] = []
    for _ in range(rounds * 5):
        for after, times in ((0, firsts), (entries // 2, middles)):
            started = time.perf_counter()
            space.browse([TEMPLATE], after, 100, 1600)
            times.append(time.perf_counter() - started)
    return statistics.median(firsts) * 1000, statistics.median(middles) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes, for a smoke run")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    entries = 20_000 if args.quick else 200_000
    writes = 20_000 if args.quick else 100_000
    where = f"cores: {os.cpu_count()}  python: {platform.python_version()}"
    print(f"{where}  entries: {entries:,}  rounds: {args.rounds}")

    noted: list[float] = []
    plain: list[float] = []
    for round_ in range(args.rounds):  # interleaved, the order alternating: noise falls on both alike
        for noting in (False, True) if round_ % 2 else (True, False):
            (noted if noting else plain).append(_write_cost(noting, writes))
    base, real = statistics.median(plain), statistics.median(noted)
    print(
        f"write, 1 entry: {real:.2f} us with write times vs {base:.2f} us without (ratio {real / base:.3f})"
    )

    # Per round and kind of work: the caller's median, 99th percentile and longest wait (ms).
    waits: dict[str, list[tuple[float, float, float]]] = {"idle": [], "purge": [], "describe": []}
    spans: dict[str, list[float]] = {"purge": [], "describe": []}
    for _ in range(args.rounds):
        for name, work in (("idle", _idle), ("purge", _purge), ("describe", _describe)):
            seen, seconds = asyncio.run(_waits_during(work, entries))
            waits[name].append((seen[len(seen) // 2], seen[int(len(seen) * 0.99)], seen[-1]))
            if name in spans:
                spans[name].append(seconds)

    def medians(name: str) -> tuple[float, ...]:
        return tuple(statistics.median(round_[i] for round_ in waits[name]) for i in range(3))

    idle = medians("idle")
    print(f"idle: a caller's wait median {idle[0]:.3f} ms, p99 {idle[1]:.3f} ms, longest {idle[2]:.2f} ms")
    for name in ("purge", "describe"):
        (median, p99, longest), span = medians(name), statistics.median(spans[name])
        print(
            f"{name} of {entries:,}: takes {span * 1000:.0f} ms; a caller's wait median {median:.2f} ms, "
            f"p99 {p99:.2f} ms, longest {longest:.2f} ms (longest vs idle: {longest / idle[2]:.1f}x)"
        )
    batches = entries / PURGE_BATCH
    print(f"purge: {statistics.median(spans['purge']) / batches * 1000:.2f} ms per batch of {PURGE_BATCH:,}")

    (small_first, small_middle), (large_first, large_middle) = (
        _browse_ms(1_000, args.rounds),
        _browse_ms(entries, args.rounds),
    )
    for which, small, large in (("first", small_first, large_first), ("middle", small_middle, large_middle)):
        sizes = f"{small:.3f} ms at 1,000 vs {large:.3f} ms at {entries:,}"
        print(f"browse a page of 100 ({which} page): {sizes} (ratio {large / small:.1f})")


if __name__ == "__main__":
    main()
