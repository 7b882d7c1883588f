"""Takes with an acknowledgement deadline through the asyncio SDK (the twin of
tests/integration/test_deliveries.py, which covers the behaviour in full): every call, the async
context manager, expiry, fencing, dead letters and delays, in one space and in 3 partitions."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest

import outrig
import outrig.aio
from outrig.service.config import ServerConfig
from outrig.testing import LocalServer

from ..polling import wait_for_waiters_async, wait_until_async
from .test_deliveries import BACKOFF, Job, Served, numbers, settings


@dataclass
class AsyncServed:
    served: Served
    space: outrig.aio.AsyncSpace


@pytest.fixture(params=["plain", "partitioned"])
async def served(request: pytest.FixtureRequest) -> AsyncIterator[AsyncServed]:
    config = ServerConfig(spaces={"jobs": settings(str(request.param))})
    with LocalServer(config, fake_clock=True) as server, outrig.connect(server.address, space="jobs") as sync:
        async with outrig.aio.connect(server.address, space="jobs") as space:
            yield AsyncServed(Served(server, sync, str(request.param)), space)


async def test_every_call(served: AsyncServed) -> None:
    space, clock = served.space, served.served
    await space.write_many([Job(region="eu", n=n) for n in range(4)])
    first = await space.take(Job(region="eu"), timeout=1.0, ack=10.0)
    assert isinstance(first, outrig.aio.AsyncDelivery) and first.entry == Job(region="eu", n=0)
    assert first.deliveries == 1 and first.deadline == pytest.approx(clock.now() + 10.0)
    assert await space.count(Job()) == 3
    assert await first.extend(20.0) == pytest.approx(clock.now() + 20.0)
    assert await first.nack(delay=0) == outrig.Returned(None)
    again = await space.take_nowait(Job(region="eu"), ack=10.0)
    assert again is not None and again.entry == Job(region="eu", n=0) and again.deliveries == 2
    await again.ack()
    many = await space.take_many(Job(region="eu"), max_entries=5, timeout=1.0, ack=10.0)
    assert numbers(d.entry for d in many) == [1, 2, 3]
    for delivery in many:
        await delivery.ack()
    with pytest.raises(outrig.DeliveryExpiredError):
        await many[0].ack()
    assert (await space.browse()).entries == []


async def _fail_while_taking(space: outrig.aio.AsyncSpace) -> None:
    async with space.taking(Job(region="eu"), ack=30.0, timeout=1.0) as failing:
        assert failing is not None
        raise KeyError("n")


async def test_async_taking(served: AsyncServed) -> None:
    space, clock = served.space, served.served
    await space.write_many([Job(region="eu", n=1), Job(region="eu", n=2)])
    async with space.taking(Job(region="eu"), ack=30.0, timeout=1.0) as delivery:
        assert delivery is not None and delivery.entry == Job(region="eu", n=1)
    assert delivery.settled
    with pytest.raises(KeyError):
        await _fail_while_taking(space)
    assert await space.read_nowait(Job()) is None
    clock.advance(BACKOFF + 0.01)
    found = await wait_until_async(lambda: space.read_nowait(Job(region="eu")), what="returned")
    assert found == Job(region="eu", n=2)
    async with space.taking(Job(region="eu"), ack=30.0, timeout=1.0) as back:
        assert back is not None and back.deliveries == 2
    async with space.taking(Job(region="eu"), ack=30.0, timeout=0.05) as nothing:
        assert nothing is None


async def test_expiry_redelivers_to_a_parked_taker_and_fences(served: AsyncServed) -> None:
    space, clock = served.space, served.served
    await space.write(Job(region="eu", n=5))
    lost = await space.take(Job(region="eu"), timeout=1.0, ack=5.0)
    assert lost is not None
    taker = asyncio.ensure_future(space.take(Job(region="eu"), timeout=10.0, ack=30.0))
    await wait_for_waiters_async(clock.server, clock.key(), 1)
    clock.advance(6.0)
    second = await taker
    assert second is not None and second.deliveries == 2 and second.entry == Job(region="eu", n=5)
    with pytest.raises(outrig.DeliveryExpiredError):
        await lost.extend(10.0)
    await second.ack()


async def test_dead_letters_and_delays(served: AsyncServed) -> None:
    space, clock = served.space, served.served
    await space.write(Job(region="eu", n=8), lease=3600.0)
    delivery = await space.take(Job(region="eu"), timeout=1.0, ack=30.0, max_deliveries=1)
    assert delivery is not None
    assert (await delivery.nack()).dead_letter == clock.dead_letter()
    dead = space.with_space("jobs.dead")
    found = await dead.take(Job(region="eu"), timeout=1.0, ack=30.0)
    assert found is not None and found.deliveries == 2 and found.dead_letter_reason
    await found.ack()
    await space.write(Job(region="eu", n=9), delay=30.0)
    assert await space.read_nowait(Job()) is None
    clock.advance(31.0)
    assert await wait_until_async(lambda: space.take_nowait(Job(region="eu")), what="delayed") == Job(
        region="eu", n=9
    )
