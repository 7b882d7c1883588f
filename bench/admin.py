"""What the admin API costs, and that a purge or a describe never holds the event loop long.

    python bench/admin.py [--quick] [--rounds N]

In process, no gRPC:
  - write: the engine's write of one entry with its write time noted (engine/ages.py, what the
    oldest entry's age needs) vs the same engine with the noting turned off, interleaved rounds;
  - purge under load: a memory backend holding N entries purges them all while a caller counts in
    a loop; the caller's longest wait during the purge vs its longest wait with no purge running
    (the baseline), and one purge batch's time (a wait is bounded by a batch, not by N);
  - describe of N entries, likewise (its longest stall of the loop vs the baseline);
  - browse: one page of 100 at 1,000 vs N entries (the candidate copy grows with the type's size).
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


async def _longest_wait_during(
    work: Callable[[MemoryBackend], Coroutine[Any, Any, object]], entries: int
) -> tuple[float, float]:
    """(the counting caller's longest wait in ms while `work` runs, the work's seconds)."""
    backend = await _filled(entries)
    longest = 0.0
    task = asyncio.create_task(work(backend))
    started = time.perf_counter()
    while not task.done():
        before = time.perf_counter()
        await backend.count("s", [Template("bench.Other", {})])
        await asyncio.sleep(0)
        longest = max(longest, time.perf_counter() - before)
    seconds = time.perf_counter() - started
    await task
    await backend.close()
    return longest * 1000, seconds


async def _idle(backend: MemoryBackend) -> None:
    await asyncio.sleep(0.05)


async def _purge(backend: MemoryBackend) -> None:
    await backend.purge("s", [TEMPLATE], dry_run=False, max_entries=0)


async def _describe(backend: MemoryBackend) -> None:
    await backend.describe("s")


def _browse_ms(entries: int, rounds: int) -> float:
    space = SpaceEngine("bench", SETTINGS, FakeClock())
    for start in range(0, entries, 10_000):
        space.write([_entry(i) for i in range(start, min(start + 10_000, entries))], 3600.0)
    times = []
    for _ in range(rounds * 5):
        started = time.perf_counter()
        space.browse([TEMPLATE], entries // 2, 100, 1600)
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes, for a smoke run")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    entries = 20_000 if args.quick else 200_000
    writes = 20_000 if args.quick else 100_000
    where = f"cores: {os.cpu_count()}  python: {platform.python_version()}"
    print(f"{where}  entries: {entries:,}  rounds: {args.rounds}")

    noted, plain = [], []
    for _ in range(args.rounds):  # interleaved: the machine's noise falls on both alike
        plain.append(_write_cost(False, writes))
        noted.append(_write_cost(True, writes))
    base, real = statistics.median(plain), statistics.median(noted)
    print(
        f"write, 1 entry: {real:.2f} us with write times vs {base:.2f} us without (ratio {real / base:.3f})"
    )

    waits: dict[str, list[float]] = {"idle": [], "purge": [], "describe": []}
    spans: dict[str, list[float]] = {"purge": [], "describe": []}
    for _ in range(args.rounds):
        for name, work in (("idle", _idle), ("purge", _purge), ("describe", _describe)):
            longest, seconds = asyncio.run(_longest_wait_during(work, entries))
            waits[name].append(longest)
            if name in spans:
                spans[name].append(seconds)
    idle = statistics.median(waits["idle"])
    for name in ("purge", "describe"):
        wait, span = statistics.median(waits[name]), statistics.median(spans[name])
        print(
            f"{name} of {entries:,}: takes {span * 1000:.0f} ms; a caller's longest wait {wait:.2f} ms "
            f"vs {idle:.2f} ms idle (ratio {wait / idle:.1f})"
        )
    batches = entries / PURGE_BATCH
    print(f"purge: {statistics.median(spans['purge']) / batches * 1000:.2f} ms per batch of {PURGE_BATCH:,}")

    small, large = _browse_ms(1_000, args.rounds), _browse_ms(entries, args.rounds)
    sizes = f"{small:.3f} ms at 1,000 vs {large:.3f} ms at {entries:,}"
    print(f"browse a page of 100: {sizes} (ratio {large / small:.1f})")


if __name__ == "__main__":
    main()
