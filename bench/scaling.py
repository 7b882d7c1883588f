"""How the real server's costs grow with what it holds: the "no scans" design, end to end.

Through one `outrig serve` process and the blocking SDK (1 client, calls one after the other):
  - read latency, template with a set field (a random key), with SMALL vs LARGE entries in the space;
  - take latency, the oldest entry by wildcard template (FIFO); the entry is written back after
    each take, untimed, so the space keeps its size;
  - the same for a range take (the oldest entry with key in a random [k, k + 10)) and an order_by
    take (the entry with the highest key, `order_by=outrig.desc("key")`), through the ordered
    index of (Small, key) that the first of them makes;
  - write latency with WAITERS parked non-matching takes in the space vs none (and vs as many
    parked range takes, `key >= 2**60`, that no write matches either; and vs as many two-sided
    range takes over disjoint intervals, `key in [10j + 1, 10j + 9]` for j = 0 .. WAITERS - 1,
    with every written key a multiple of 10 among them, so in a gap between two ranges, which
    the engine finds by a walk of its interval map, engine/stabbing.py, not by one comparison):
    the waiters are blocked takes of a key that is never written, from an asyncio client in a
    thread of this process (10 connections), sent 250 at a time a quarter of a second apart (gRPC's server
    cancels calls that arrive in a burst of more than about 1,000 it has not yet taken on);
  - resident memory (VmRSS) of the server per stored small entry, and per parked waiter.

The two spaces of each comparison live in the same server and are measured in interleaved
rounds, so both sides see the same process, heap and caches. The large space is filled once, by
`write_many` of 1,000 from 4 threads with retries off (so without request ids, whose remembered
results would otherwise be counted as the entries' memory for the 120 s they are kept); the
parked takes use the SDK's defaults, request id included, as a real blocked take does.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from entries import NOTE, Small
from servers import ServerProcess, start_outrig
from workloads import Plan, connect, connect_async

import outrig
from outrig._codec import encode_entry
from outrig.aio import AsyncSpace

SMALL_SPACE, LARGE_SPACE = "scale-small", "scale-large"
QUIET_SPACE, PARKED_SPACE, RANGED_SPACE = "scale-quiet", "scale-parked", "scale-ranged"
GAPPED_SPACE = "scale-gapped"
SMALL = 1000
FILL_BATCH, FILLERS = 1000, 4
_WAIT = 10.0
_LEASE = 3600.0
_NEVER = Small(key=-1)  # the parked takes' template: no entry ever has key -1
_NEVER_RANGE = Small(key=outrig.GE(1 << 60))  # the parked range takes': no key is that large
_GAP = 10  # the gapped space's parked takes: key in [10j + 1, 10j + 9]; its writes: key = 10m
_ANY = Small()
_PARK_BURST, _PARK_PAUSE = 250, 0.25


def fill_entry(key: int) -> Small:
    """The stored small entry: two set fields (key, group) and two null ones."""
    return Small(key=key, group="scale")


@dataclass
class ScalingResult:
    small: int
    large: int
    waiters: int
    entry_bytes: int  # encoded size of one stored entry
    fill_seconds: float
    bytes_per_entry: float
    bytes_per_waiter: float
    rss_large: int  # server's resident memory once the large space was filled
    # microseconds per call, one sample per run: {"small": [...], "large": [...]}
    read_us: dict[str, list[float]] = field(default_factory=dict)
    take_us: dict[str, list[float]] = field(default_factory=dict)
    range_take_us: dict[str, list[float]] = field(default_factory=dict)
    order_take_us: dict[str, list[float]] = field(default_factory=dict)
    # {"none": [...], "parked": [...]}
    write_us: dict[str, list[float]] = field(default_factory=dict)


def _fill(server: ServerProcess, plan: Plan, space: str, count: int) -> float:
    """Write ``count`` small entries (keys 0 .. count - 1); the seconds it took."""
    batches = iter(range(0, count, FILL_BATCH))
    lock = threading.Lock()
    failures: list[BaseException] = []
    no_retries = Plan(plan.seconds, plan.warmup, plan.runner, retry_deadline=0.0)

    def filler() -> None:
        try:
            with connect(server, no_retries, space) as client:
                while True:
                    with lock:
                        start = next(batches, None)
                    if start is None:
                        return
                    keys = range(start, min(start + FILL_BATCH, count))
                    client.write_many([fill_entry(key) for key in keys], lease=_LEASE)
        except BaseException as err:
            failures.append(err)

    started = time.perf_counter()
    threads = [threading.Thread(target=filler) for _ in range(FILLERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if failures:
        raise RuntimeError(f"filling {space} failed") from failures[0]
    return time.perf_counter() - started


def _settled_rss(server: ServerProcess, timeout: float = 30.0) -> int:
    """The server's resident memory once it stops growing and its CPU is idle (or after `timeout`)."""
    deadline = time.monotonic() + timeout
    rss, cpu = server.rss_bytes(), server.cpu_seconds()
    while True:
        time.sleep(0.5)
        new_rss, new_cpu = server.rss_bytes(), server.cpu_seconds()
        if (abs(new_rss - rss) < 1 << 20 and new_cpu - cpu < 0.05) or time.monotonic() > deadline:
            return new_rss
        rss, cpu = new_rss, new_cpu


class ParkedWaiters:
    """``count`` blocked takes that never match, from an asyncio client on a thread of its own."""

    def __init__(
        self,
        server: ServerProcess,
        plan: Plan,
        count: int,
        connections: int = 10,
        space: str = PARKED_SPACE,
        template: Small | Callable[[int], Small] = _NEVER,
    ) -> None:
        self._server, self._plan, self._count, self._connections = server, plan, count, connections
        self._space = space
        # one template for every take, or the i-th take's template
        self._template = template if callable(template) else lambda i: template
        self._started = threading.Event()
        self._failure: BaseException | None = None
        self._loop = asyncio.new_event_loop()
        self._stopping: asyncio.Event | None = None
        self._tasks: list[asyncio.Task[object]] = []
        self._thread = threading.Thread(target=self._run, name="parked-waiters", daemon=True)
        self._thread.start()
        self._started.wait()
        if self._failure is not None:
            raise RuntimeError("the parked waiters could not connect") from self._failure

    def _run(self) -> None:
        try:
            self._loop.run_until_complete(self._main())
        finally:
            self._loop.close()

    async def _main(self) -> None:
        self._stopping = asyncio.Event()
        spaces: list[AsyncSpace] = []
        try:
            spaces = [connect_async(self._server, self._plan, self._space) for _ in range(self._connections)]
            await asyncio.gather(*(space.count(_ANY) for space in spaces))
            # In bursts, each followed by a round trip on every connection: gRPC's server cancels
            # calls that arrive while more than 1,000 already wait for the server to take them on
            # (grpc.server.max_pending_requests), and a Python server takes them on one by one.
            for start in range(0, self._count, _PARK_BURST):
                self._tasks += [
                    asyncio.create_task(spaces[i % len(spaces)].take(self._template(i), timeout=None))
                    for i in range(start, min(start + _PARK_BURST, self._count))
                ]
                await asyncio.sleep(_PARK_PAUSE)
        except BaseException as err:
            self._failure = err
            self._started.set()
            raise
        self._started.set()
        await self._stopping.wait()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await asyncio.gather(*(space.close() for space in spaces))

    def check(self) -> None:
        """Raise if any parked take has ended (it should be waiting still)."""
        ended = [task for task in self._tasks if task.done()]
        if ended:
            err = ended[0].exception() if not ended[0].cancelled() else None
            raise RuntimeError(f"{len(ended)} of {self._count} parked takes ended early") from err

    def stop(self) -> None:
        if self._stopping is not None:
            self._loop.call_soon_threadsafe(self._stopping.set)
        self._thread.join(30)


def _read_us(space: outrig.Space, size: int, ops: int, rng: random.Random) -> float:
    templates = [Small(key=rng.randrange(size)) for _ in range(ops)]
    started = time.perf_counter()
    for template in templates:
        if space.read(template, timeout=_WAIT) is None:
            raise RuntimeError(f"a read of {template} found nothing")
    return (time.perf_counter() - started) / ops * 1e6


def _take_us(
    space: outrig.Space,
    ops: int,
    templates: Callable[[], Small] = lambda: _ANY,
    order_by: outrig.OrderKey | None = None,
) -> float:
    taking = 0.0
    for _ in range(ops):
        template = templates()
        started = time.perf_counter()
        entry = space.take(template, timeout=_WAIT, order_by=order_by)
        taking += time.perf_counter() - started
        if entry is None:
            raise RuntimeError("a take of the oldest entry found nothing")
        space.write(entry, lease=_LEASE)  # untimed: keep the space's size
    return taking / ops * 1e6


def _ranges(size: int, rng: random.Random) -> Callable[[], Small]:
    """Templates of a random range of 10 keys, all held by the space (keys 0 .. size - 1)."""

    def draw() -> Small:
        low = rng.randrange(size - 10)
        return Small(key=outrig.Range(low, low + 10, high_inclusive=False))

    return draw


def _gap_range(i: int) -> Small:
    """The i-th gapped take: key in [10i + 1, 10i + 9], disjoint from every other one's."""
    return Small(key=outrig.Range(_GAP * i + 1, _GAP * i + _GAP - 1))


def _write_us(space: outrig.Space, ops: int, first_key: int, keys: Callable[[int], int] = int) -> float:
    entries = [Small(key=keys(first_key + i), group="written", note=NOTE) for i in range(ops)]
    started = time.perf_counter()
    for entry in entries:
        space.write(entry, lease=_LEASE)
    return (time.perf_counter() - started) / ops * 1e6


def run_scaling(
    workdir: Path,
    plan: Plan,
    *,
    large: int,
    waiters: int,
    rounds: int,
    runs: int,
    ops: int,
    log: Callable[[str], None],
) -> ScalingResult:
    """The scaling section; ``ops`` reads (and half as many takes, and as many writes) per run."""
    server = start_outrig(workdir, "outrig-scaling")
    parked: ParkedWaiters | None = None
    range_parked: ParkedWaiters | None = None
    gap_parked: ParkedWaiters | None = None
    try:
        _fill(server, plan, SMALL_SPACE, SMALL)
        before = _settled_rss(server)
        log(f"scaling: filling {large:,} entries ...")
        fill_seconds = _fill(server, plan, LARGE_SPACE, large)
        rss_large = _settled_rss(server)
        per_entry = (rss_large - before) / large
        log(f"scaling: filled in {fill_seconds:.1f} s; parking {waiters:,} takes ...")
        before = _settled_rss(server)
        parked = ParkedWaiters(server, plan, waiters)
        time.sleep(1.0)
        per_waiter = (_settled_rss(server) - before) / waiters
        parked.check()
        log(f"scaling: parking {waiters:,} range takes ...")
        range_parked = ParkedWaiters(server, plan, waiters, space=RANGED_SPACE, template=_NEVER_RANGE)
        time.sleep(1.0)
        range_parked.check()
        log(f"scaling: parking {waiters:,} two-sided range takes over disjoint intervals ...")
        gap_parked = ParkedWaiters(server, plan, waiters, space=GAPPED_SPACE, template=_gap_range)
        time.sleep(1.0)
        gap_parked.check()

        def gap_keys(key: int) -> int:  # a multiple of 10 among the parked intervals: in a gap
            return _GAP * (key % waiters)

        result = ScalingResult(
            small=SMALL,
            large=large,
            waiters=waiters,
            entry_bytes=encode_entry(fill_entry(large - 1)).ByteSize(),
            fill_seconds=fill_seconds,
            bytes_per_entry=per_entry,
            bytes_per_waiter=per_waiter,
            rss_large=rss_large,
        )
        rng = random.Random(7)
        sizes = {"small": (SMALL_SPACE, SMALL), "large": (LARGE_SPACE, large)}
        writes = {"none": QUIET_SPACE, "parked": PARKED_SPACE, "ranged": RANGED_SPACE, "gapped": GAPPED_SPACE}
        next_key = 0
        for round_number in range(rounds):
            log(f"scaling: round {round_number + 1}/{rounds}")
            for run in range(runs):
                flip = (round_number + run) % 2 == 1  # alternate which side goes first
                for name in sorted(sizes, reverse=flip):
                    space_name, size = sizes[name]
                    with connect(server, plan, space_name) as space:
                        _read_us(space, size, ops // 10, rng)  # warm-up
                        result.read_us.setdefault(name, []).append(_read_us(space, size, ops, rng))
                        result.take_us.setdefault(name, []).append(_take_us(space, ops // 2))
                        ranged = _ranges(size, rng)
                        result.range_take_us.setdefault(name, []).append(_take_us(space, ops // 2, ranged))
                        highest = _take_us(space, ops // 2, order_by=outrig.desc("key"))
                        result.order_take_us.setdefault(name, []).append(highest)
                for name in sorted(writes, reverse=flip):
                    keys: Callable[[int], int] = gap_keys if name == "gapped" else int
                    with connect(server, plan, writes[name]) as space:
                        _write_us(space, ops // 10, next_key, keys)  # warm-up
                        next_key += ops // 10
                        result.write_us.setdefault(name, []).append(_write_us(space, ops, next_key, keys))
                        next_key += ops
        parked.check()
        range_parked.check()
        gap_parked.check()
        server.check_alive()
        return result
    finally:
        for waiting in (parked, range_parked, gap_parked):
            if waiting is not None:
                waiting.stop()
        server.stop()
