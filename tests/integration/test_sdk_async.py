"""The asyncio SDK against a real server process: every operation, end to end."""

from __future__ import annotations

import asyncio
from collections import Counter

import numpy as np
import pytest

import outrig
import outrig.aio

from ..polling import wait_for_waiters_async, waiters
from .entries import Animal, Everything, Puppy, Task


@pytest.fixture(params=[True, False], ids=["mux", "unary"])
async def space(request, server, space_name):
    async with outrig.aio.connect(server.address, space=space_name, mux=request.param) as space:
        yield space


async def test_write_read_take(space):
    lease = await space.write(Puppy(name="rex", legs=4, breed="pug", age_weeks=3), lease=60.0)
    assert lease.id > 0
    got = await space.read(Animal(legs=4), timeout=1.0)
    assert isinstance(got, Puppy) and got.name == "rex"
    assert await space.take(Animal(name="rex"), timeout=1.0) == got
    assert await space.take_nowait(Animal()) is None
    assert await space.read_nowait(Animal()) is None


async def test_blocking_take_woken_by_a_later_write(space, server):
    taker = asyncio.ensure_future(space.take(Task(job="late"), timeout=10.0))
    await wait_for_waiters_async(server, space.name, 1)
    assert not taker.done()
    await space.write(Task(job="early"))  # does not match: the taker keeps waiting
    # A write offers itself to the parked waiters before it replies: had it woken the taker, the
    # taker would no longer be parked now.
    assert await asyncio.to_thread(waiters, server, space.name) == 1
    assert not taker.done()
    await space.write(Task(job="late", n=1))
    assert await taker == Task(job="late", n=1)
    assert await space.count(Task()) == 1


async def test_timeouts(space):
    assert await space.read(Task(), timeout=0.05) is None
    assert await space.take(Task(), timeout=0.05) is None
    assert await space.read_many(Task(), max_entries=5, timeout=0.05) == []


async def test_cancelling_a_blocked_take_loses_nothing(space, server):
    taker = asyncio.ensure_future(space.take(Task(), timeout=None))
    await wait_for_waiters_async(server, space.name, 1)
    taker.cancel()
    with pytest.raises(asyncio.CancelledError):
        await taker
    await space.write(Task(n=9))  # may reach the server before the cancel does
    # Once the cancel has reached the server the waiter is gone, and what it took is back.
    await wait_for_waiters_async(server, space.name, 0)
    assert await space.read_nowait(Task()) == Task(n=9)


async def test_batches_contents_and_count(space):
    leases = await space.write_many([Task(n=i) for i in range(10)], lease=60.0)
    assert len(leases) == 10
    assert [t.n for t in await space.read_many(Task(), max_entries=4)] == [0, 1, 2, 3]
    assert [t.n for t in await space.take_many(Task(), max_entries=3)] == [0, 1, 2]
    assert [t.n async for t in space.contents(Task())] == list(range(3, 10))
    assert [t.n async for t in space.contents(Task(), max_entries=2)] == [3, 4]
    assert await space.count(Task()) == 7


async def test_many_concurrent_takers_never_share_an_entry(space):
    await space.write_many([Task(job="race", n=i) for i in range(100)])

    async def taker() -> list[int]:
        taken = []
        while (entry := await space.take(Task(job="race"), timeout=0.2)) is not None:
            taken.append(entry.n)
        return taken

    results = await asyncio.gather(*(taker() for _ in range(20)))
    assert Counter(n for batch in results for n in batch) == Counter(range(100))


async def test_leases(space):
    lease = await space.write(Task(n=1), lease=30.0)
    await lease.renew(60.0)
    assert lease.duration == pytest.approx(60.0)
    results = await space.renew_many([lease], outrig.FOREVER)
    assert results[0].error is None and lease.expires_at is None
    await lease.cancel()
    with pytest.raises(outrig.NotFoundError):
        await lease.cancel()
    assert [r.error is not None for r in await space.cancel_many([lease])] == [True]


async def test_notify(space):
    async with space.notify(Task(job="n"), lease=60.0) as events:
        await space.write(Task(job="n", n=1))
        await space.write(Task(job="x", n=2))
        await space.write(Task(job="n", n=3))
        got = [await events.__anext__(), await events.__anext__()]
        assert [(e.sequence, e.entry.n) for e in got] == [(1, 1), (2, 3)]
        await events.lease.cancel()
        assert [e async for e in events] == []


async def test_hd_array(space):
    hd = np.arange(921_600, dtype=np.int32)
    await space.write(Everything(text="hd", samples=hd))
    got = await space.take(Everything(text="hd"), timeout=5.0)
    assert np.array_equal(got.samples, hd)


async def test_bad_input(space):
    with pytest.raises(outrig.InvalidArgumentError, match="timeout"):
        await space.take(Task(), timeout=-1.0)
    with pytest.raises(outrig.InvalidArgumentError, match="space"):
        await space.with_space("").count(Task())
    assert await space.count(Task()) == 0


async def test_a_burst_of_blocked_takes_is_not_cut_off(server, space_name):
    """gRPC cancels calls waiting to be picked up beyond its pending-request limit (1,000 by
    default); the server raises it to max_waiters, so a burst of blocked takes all get served."""
    async with outrig.aio.connect(server.address, space=space_name, retry_deadline=0) as space:
        takes = [space.take(Task(job="never"), timeout=1.0) for _ in range(2500)]
        results = await asyncio.gather(*takes, return_exceptions=True)
    failures = Counter(type(result).__name__ for result in results if result is not None)
    assert not failures, f"{sum(failures.values())} of 2500 blocked takes failed: {dict(failures)}"
