"""Settling in the next take, batch acks and the worker loop through the asyncio SDK (the twin
of tests/integration/test_settling.py, which covers the behaviour in full), in one space and in
3 partitions."""

from __future__ import annotations

import pytest

import outrig
import outrig.aio

from .test_deliveries import Job, numbers
from .test_deliveries_async import AsyncServed, served

__all__ = ["served"]  # the fixture, shared


async def test_async_settles_and_batch_acks(served: AsyncServed) -> None:
    space = served.space
    await space.write_many([Job(region=region, n=n) for n, region in enumerate(["eu", "us", "eu", "ap"])])
    first = await space.take(Job(region="eu"), timeout=1.0, ack=30.0)
    assert first is not None
    second = await space.take_nowait(Job(region="us"), ack=30.0, settle=first)
    assert first.settled and second is not None
    many = await space.take_many(Job(), max_entries=5, timeout=1.0, ack=30.0, settle=[second])
    assert second.settled and set(numbers(d.entry for d in many)) == {2, 3}
    with pytest.raises(outrig.DeliveryExpiredError):
        await first.ack()
    await many[0].ack()
    outcomes = await space.ack_many(many)
    assert outcomes[1] is None and isinstance(outcomes[0], outrig.DeliveryExpiredError)
    assert (await space.browse()).entries == []


async def _work(space: outrig.aio.AsyncSpace, seen: list[int | None], fail_at: int) -> None:
    async with space.deliveries(Job(region="eu"), ack=30.0, timeout=0.5) as jobs:
        async for delivery in jobs:
            seen.extend(numbers([delivery.entry]))
            if seen[-1] == fail_at:
                raise KeyError("n")  # returned, with the space's backoff


async def test_async_worker_loop(served: AsyncServed) -> None:
    space = served.space
    await space.write_many([Job(region="eu", n=n) for n in range(4)])
    seen: list[int | None] = []
    with pytest.raises(KeyError):
        await _work(space, seen, fail_at=2)
    async with space.deliveries(Job(region="eu"), ack=30.0, timeout=0.5) as jobs:
        async for delivery in jobs:
            seen.extend(numbers([delivery.entry]))
    assert seen == [0, 1, 2, 3] and jobs.current is None
    (left,) = (await space.browse()).entries
    assert left.entry == Job(region="eu", n=2) and left.visible_at is not None  # backing off
