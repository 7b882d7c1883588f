"""The end-to-end workloads of bench/run.py, each for 1 blocking client or 10 asyncio clients.

One client is the blocking SDK (`outrig.connect`) in this process's main thread. Ten clients are
10 tasks on one event loop in this process, each with its own connection (`outrig.aio.connect`
with a local subchannel pool, so 10 TCP connections): the shape of an asyncio application, and
the Milo benchmarks' "async 10 clients". The same code runs against outrig and the no-op server;
Redis gets the write+take pair as LPUSH + BRPOP through redis-py (sync, or redis.asyncio with 10
tasks and a connection each).

Work that only sets a run up or cleans after it is done outside the measured window: the HD array
writes are cancelled in batches after the window, and so are the notify writer's entries.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, cast

import redis
import redis.asyncio
from entries import (
    BATCH,
    NOTE,
    NOTIFY_SPACE,
    READ_ENTRIES,
    READ_KEY_BASE,
    SPACE,
    Frame,
    Small,
    hd_pixels,
)
from measure import Sample, Window, gather_counts, loop_async, loop_sync
from servers import ServerProcess

import outrig
from outrig._base import DEFAULT_RETRY_DEADLINE
from outrig._codec import encode_entry
from outrig.aio import AsyncLease, AsyncSpace

#: Each client gets its own TCP connection, not a channel on a shared one.
OWN_CONNECTION = [("grpc.use_local_subchannel_pool", 1)]
_WAIT = 10.0  # seconds a read or take may wait: they all match at once, unless something broke
_LEASE = 300.0  # long enough to outlive a run; what stays behind is cancelled after it
_CANCEL_CHUNK = 1000


@dataclass(frozen=True)
class Plan:
    """How long runs are, and the event loop the asyncio clients run on (one for the whole bench)."""

    seconds: float
    warmup: float
    runner: asyncio.Runner
    retry_deadline: float = DEFAULT_RETRY_DEADLINE
    mux: bool = True  # the SDK's default: a connection's calls over its Mux stream


def connect(server: ServerProcess, plan: Plan, space: str = SPACE) -> outrig.Space:
    return outrig.connect(
        server.address, space=space, options=OWN_CONNECTION, retry_deadline=plan.retry_deadline, mux=plan.mux
    )


def connect_async(server: ServerProcess, plan: Plan, space: str = SPACE) -> AsyncSpace:
    return outrig.aio.connect(
        server.address, space=space, options=OWN_CONNECTION, retry_deadline=plan.retry_deadline, mux=plan.mux
    )


async def _nothing() -> None:
    return None


@dataclass
class SyncClient:
    step: Callable[[], int]  # one unit of work; returns how many units it did
    finish: Callable[[], None] = lambda: None  # after the window: clean up, untimed


@dataclass
class AsyncClient:
    step: Callable[[], Awaitable[int]]
    finish: Callable[[], Awaitable[None]] = field(default=_nothing)


SyncFactory = Callable[[outrig.Space, int], SyncClient]
AsyncFactory = Callable[[AsyncSpace, int], AsyncClient]
Runner = Callable[[ServerProcess, int, Plan], Sample]


@dataclass(frozen=True)
class Workload:
    name: str  # the key in the ratios line, with the client count: read_1, read_10
    label: str
    unit: str
    run: Runner  # (server, clients, plan) -> Sample
    target: float | None = None  # the least outrig / no-op ratio aimed for


def _missing(what: str) -> RuntimeError:
    return RuntimeError(f"{what} found nothing, though it should have matched at once")


# ---------------------------------------------------------------- the workloads, sync and async


def _read_templates(number: int) -> itertools.cycle[Small]:
    start = number * READ_ENTRIES // 10  # the clients start at different keys
    keys = [READ_KEY_BASE + (start + i) % READ_ENTRIES for i in range(READ_ENTRIES)]
    return itertools.cycle([Small(key=key) for key in keys])


def read_sync(space: outrig.Space, number: int) -> SyncClient:
    templates = _read_templates(number)

    def step() -> int:
        if space.read(next(templates), timeout=_WAIT) is None:
            raise _missing("a read")
        return 1

    return SyncClient(step)


def read_async(space: AsyncSpace, number: int) -> AsyncClient:
    templates = _read_templates(number)

    async def step() -> int:
        if await space.read(next(templates), timeout=_WAIT) is None:
            raise _missing("a read")
        return 1

    return AsyncClient(step)


_READ_GROUP = Small(group="read")


def read_many_sync(space: outrig.Space, number: int) -> SyncClient:
    def step() -> int:
        if len(space.read_many(_READ_GROUP, max_entries=BATCH, timeout=_WAIT)) != BATCH:
            raise _missing(f"a read_many of {BATCH}")
        return 1

    return SyncClient(step)


def read_many_async(space: AsyncSpace, number: int) -> AsyncClient:
    async def step() -> int:
        if len(await space.read_many(_READ_GROUP, max_entries=BATCH, timeout=_WAIT)) != BATCH:
            raise _missing(f"a read_many of {BATCH}")
        return 1

    return AsyncClient(step)


def _pair_entry(number: int) -> Small:
    return Small(key=READ_KEY_BASE, client=number, group="pair", note=NOTE)


def pair_sync(space: outrig.Space, number: int) -> SyncClient:
    entry, template = _pair_entry(number), Small(client=number)

    def step() -> int:
        space.write(entry, lease=_LEASE)
        if space.take(template, timeout=_WAIT) is None:
            raise _missing("a take of the entry just written")
        return 1

    return SyncClient(step)


def pair_async(space: AsyncSpace, number: int) -> AsyncClient:
    entry, template = _pair_entry(number), Small(client=number)

    async def step() -> int:
        await space.write(entry, lease=_LEASE)
        if await space.take(template, timeout=_WAIT) is None:
            raise _missing("a take of the entry just written")
        return 1

    return AsyncClient(step)


def _batch(number: int) -> tuple[list[Small], Small]:
    entries = [Small(key=READ_KEY_BASE + i, client=number, group="batch", note=NOTE) for i in range(BATCH)]
    return entries, Small(client=number, group="batch")


def take_many_sync(space: outrig.Space, number: int) -> SyncClient:
    entries, template = _batch(number)

    def step() -> int:
        space.write_many(entries, lease=_LEASE)
        if len(space.take_many(template, max_entries=BATCH, timeout=_WAIT)) != BATCH:
            raise _missing(f"a take_many of the {BATCH} entries just written")
        return 1

    return SyncClient(step)


def take_many_async(space: AsyncSpace, number: int) -> AsyncClient:
    entries, template = _batch(number)

    async def step() -> int:
        await space.write_many(entries, lease=_LEASE)
        if len(await space.take_many(template, max_entries=BATCH, timeout=_WAIT)) != BATCH:
            raise _missing(f"a take_many of the {BATCH} entries just written")
        return 1

    return AsyncClient(step)


def hd_write_sync(space: outrig.Space, number: int) -> SyncClient:
    entry = Frame(tag="written", client=number, pixels=hd_pixels())
    leases: list[outrig.Lease] = []

    def step() -> int:
        leases.append(space.write(entry, lease=_LEASE))
        return 1

    def finish() -> None:  # free the server's memory for the next run
        for start in range(0, len(leases), _CANCEL_CHUNK):
            space.cancel_many(leases[start : start + _CANCEL_CHUNK])

    return SyncClient(step, finish)


def hd_write_async(space: AsyncSpace, number: int) -> AsyncClient:
    entry = Frame(tag="written", client=number, pixels=hd_pixels())
    leases: list[AsyncLease] = []

    async def step() -> int:
        leases.append(await space.write(entry, lease=_LEASE))
        return 1

    async def finish() -> None:
        for start in range(0, len(leases), _CANCEL_CHUNK):
            await space.cancel_many(leases[start : start + _CANCEL_CHUNK])

    return AsyncClient(step, finish)


_HD_TEMPLATE = Frame(tag="hd")


def hd_read_sync(space: outrig.Space, number: int) -> SyncClient:
    def step() -> int:
        if space.read(_HD_TEMPLATE, timeout=_WAIT) is None:
            raise _missing("an HD array read")
        return 1

    return SyncClient(step)


def hd_read_async(space: AsyncSpace, number: int) -> AsyncClient:
    async def step() -> int:
        if await space.read(_HD_TEMPLATE, timeout=_WAIT) is None:
            raise _missing("an HD array read")
        return 1

    return AsyncClient(step)


# ---------------------------------------------------------------- running clients


def _run_sync(factory: SyncFactory, server: ServerProcess, plan: Plan) -> Sample:
    with connect(server, plan) as space:
        client = factory(space, 0)
        space.count(Small())  # connect before the clock starts
        window = Window(plan.warmup, plan.seconds, server)
        done = loop_sync(client.step, window)
        client.finish()
    return window.sample(done)


async def _run_async(factory: AsyncFactory, server: ServerProcess, clients: int, plan: Plan) -> Sample:
    spaces = [connect_async(server, plan) for _ in range(clients)]
    try:
        made = [factory(space, number) for number, space in enumerate(spaces)]
        await asyncio.gather(*(space.count(Small()) for space in spaces))
        window = Window(plan.warmup, plan.seconds, server)
        done = await gather_counts([loop_async(client.step, window) for client in made])
        await asyncio.gather(*(client.finish() for client in made))
    finally:
        await asyncio.gather(*(space.close() for space in spaces))
    return window.sample(done)


def clients_of(sync: SyncFactory, asynchronous: AsyncFactory) -> Runner:
    """A runner: 1 client runs ``sync``; more run ``asynchronous`` as tasks on one event loop."""

    def run(server: ServerProcess, clients: int, plan: Plan) -> Sample:
        if clients == 1:
            return _run_sync(sync, server, plan)
        return plan.runner.run(_run_async(asynchronous, server, clients, plan))

    return run


# ---------------------------------------------------------------- notify fan-out

_NOTIFY_TEMPLATE = Small(group="notify")
_NOTIFY_ENTRY = Small(key=READ_KEY_BASE, group="notify", note=NOTE)


def _notify_sync(server: ServerProcess, plan: Plan) -> Sample:
    """One blocking subscriber (a thread) and one blocking writer (the main thread)."""
    received = 0
    failure: list[BaseException] = []
    with (
        connect(server, plan, NOTIFY_SPACE) as writer,
        connect(server, plan, NOTIFY_SPACE) as listener,
        listener.notify(_NOTIFY_TEMPLATE, lease=60.0) as events,
    ):
        writer.count(Small())
        window = Window(plan.warmup, plan.seconds, server)

        def consume() -> None:
            nonlocal received
            try:
                for _ in events:
                    if window.inside(time.monotonic()):
                        received += 1
            except BaseException as err:
                failure.append(err)

        thread = threading.Thread(target=consume, name="subscriber")
        thread.start()
        leases: list[outrig.Lease] = []

        def write() -> int:
            leases.append(writer.write(_NOTIFY_ENTRY, lease=_LEASE))
            return 0

        loop_sync(write, window)
        events.close()
        thread.join()
        for start in range(0, len(leases), _CANCEL_CHUNK):
            writer.cancel_many(leases[start : start + _CANCEL_CHUNK])
    if failure:
        raise RuntimeError("the notify subscriber failed") from failure[0]
    return window.sample(received)


async def _notify_async(server: ServerProcess, subscribers: int, plan: Plan) -> Sample:
    """`subscribers` tasks, each with its own connection, and one writer task, on one event loop."""
    writer = connect_async(server, plan, NOTIFY_SPACE)
    listeners = [connect_async(server, plan, NOTIFY_SPACE) for _ in range(subscribers)]
    notifications = [listener.notify(_NOTIFY_TEMPLATE, lease=60.0) for listener in listeners]
    try:
        await writer.count(Small())
        for notification in notifications:
            await notification.__aenter__()
        window = Window(plan.warmup, plan.seconds, server)

        async def consume(events: outrig.aio.AsyncNotification) -> int:
            received = 0
            async for _ in events:
                if window.inside(time.monotonic()):
                    received += 1
            return received

        consumers = [asyncio.create_task(consume(events)) for events in notifications]
        leases: list[AsyncLease] = []

        async def write() -> int:
            leases.append(await writer.write(_NOTIFY_ENTRY, lease=_LEASE))
            return 0

        await loop_async(write, window)
        for notification in notifications:
            await notification.close()
        received = sum(await asyncio.gather(*consumers))
        for start in range(0, len(leases), _CANCEL_CHUNK):
            await writer.cancel_many(leases[start : start + _CANCEL_CHUNK])
    finally:
        for notification in notifications:
            await notification.close()
        await asyncio.gather(writer.close(), *(listener.close() for listener in listeners))
    return window.sample(received)


def notify(server: ServerProcess, clients: int, plan: Plan) -> Sample:
    if clients == 1:
        return _notify_sync(server, plan)
    return plan.runner.run(_notify_async(server, clients, plan))


# ---------------------------------------------------------------- Redis: LPUSH + BRPOP


def redis_payload(number: int) -> bytes:
    """The bytes of the entry outrig's write+take pair carries."""
    return encode_entry(_pair_entry(number)).SerializeToString()


def _redis_sync(server: ServerProcess, plan: Plan) -> Sample:
    host, _, port = server.address.rpartition(":")
    client = redis.Redis(host=host, port=int(port))
    key, payload = "bench:pair:0", redis_payload(0)
    try:
        client.ping()

        def step() -> int:
            client.lpush(key, payload)
            if client.brpop([key], timeout=_WAIT) is None:
                raise _missing("a BRPOP of the value just pushed")
            return 1

        window = Window(plan.warmup, plan.seconds, server)
        done = loop_sync(step, window)
    finally:
        client.close()
    return window.sample(done)


async def _redis_async(server: ServerProcess, clients: int, plan: Plan) -> Sample:
    host, _, port = server.address.rpartition(":")
    connections = [redis.asyncio.Redis(host=host, port=int(port)) for _ in range(clients)]

    def pair(client: redis.asyncio.Redis, number: int) -> Callable[[], Awaitable[int]]:
        key, payload = f"bench:pair:{number}", redis_payload(number)

        async def step() -> int:
            # redis-py types its commands as "result or awaitable" for both of its clients.
            await cast(Awaitable[Any], client.lpush(key, payload))
            if await cast(Awaitable[Any], client.brpop([key], timeout=_WAIT)) is None:
                raise _missing("a BRPOP of the value just pushed")
            return 1

        return step

    try:
        await asyncio.gather(*(cast(Awaitable[Any], client.ping()) for client in connections))
        window = Window(plan.warmup, plan.seconds, server)
        steps = [pair(client, number) for number, client in enumerate(connections)]
        done = await gather_counts([loop_async(step, window) for step in steps])
    finally:
        await asyncio.gather(*(client.aclose() for client in connections))
    return window.sample(done)


def redis_pair(server: ServerProcess, clients: int, plan: Plan) -> Sample:
    if clients == 1:
        return _redis_sync(server, plan)
    return plan.runner.run(_redis_async(server, clients, plan))


WORKLOADS = (
    Workload("read", "scalar read (1 set field)", "reads/s", clients_of(read_sync, read_async), 0.8),
    Workload("read_many", f"read_many of {BATCH}", "calls/s", clients_of(read_many_sync, read_many_async)),
    Workload("pair", "write + take pair", "pairs/s", clients_of(pair_sync, pair_async), 0.8),
    Workload(
        "take_many",
        f"write_many({BATCH}) + take_many({BATCH})",
        "batches/s",
        clients_of(take_many_sync, take_many_async),
    ),
    Workload(
        "hd_write", "HD array write (3.6 MB)", "writes/s", clients_of(hd_write_sync, hd_write_async), 0.9
    ),
    Workload("hd_read", "HD array read (3.6 MB)", "reads/s", clients_of(hd_read_sync, hd_read_async), 0.9),
    Workload("notify", "notify fan-out, 1 writer", "events/s", notify),
)
REDIS_PAIR = Workload("redis_pair", "write + take pair vs Redis LPUSH + BRPOP", "pairs/s", redis_pair)
