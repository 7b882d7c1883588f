"""The asyncio SDK retries through a server that goes away and comes back (see test_sdk_retry)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

import outrig
import outrig.aio
from outrig.service.config import ServerConfig

from ..polling import wait_for_waiters_async
from .entries import Task
from .test_sdk_retry import Outage


@pytest.fixture
def outage():
    running = Outage()
    yield running
    running.close()


async def _back_after(outage: Outage, seconds: float) -> None:
    # Stopping and starting a LocalServer blocks; keep it off the event loop the client runs on.
    await asyncio.to_thread(outage.back_after, seconds)


async def test_a_write_while_the_server_is_down_succeeds_once_it_is_back(outage):
    async with outrig.aio.connect(outage.address, space="jobs") as space:
        await space.write(Task(n=0))
        await _back_after(outage, 0.5)
        started = time.monotonic()
        lease = await space.write(Task(n=1), lease=60.0)
        assert time.monotonic() - started > 0.3
        assert lease.id > 0
        assert await space.read_nowait(Task()) == Task(n=1)
        assert space.retries > 0
        assert space.with_space("other").retries == space.retries


async def test_retry_deadline_zero_raises_at_once(outage):
    outage.stop()
    async with outrig.aio.connect(outage.address, retry_deadline=0) as space:
        started = time.monotonic()
        with pytest.raises(outrig.UnavailableError):
            await space.write(Task(n=1))
        assert time.monotonic() - started < 1.0
        assert space.retries == 0


async def test_a_deadline_shorter_than_the_outage_raises_after_about_the_deadline(outage):
    outage.stop()
    async with outrig.aio.connect(outage.address, retry_deadline=0.5) as space:
        started = time.monotonic()
        with pytest.raises(outrig.UnavailableError):
            await space.write_many([Task(n=1), Task(n=2)])
        assert 0.4 < time.monotonic() - started < 3.0
        assert space.retries >= 1


async def test_a_take_retried_across_an_outage_keeps_to_its_timeout(outage):
    async with outrig.aio.connect(outage.address) as space:
        await space.count(Task())
        started = time.monotonic()
        taker = asyncio.ensure_future(space.take(Task(), timeout=2.0))
        await wait_for_waiters_async(outage.server, "default", 1)
        await _back_after(outage, 0.5)
        assert await taker is None
        ended = time.monotonic()
        await asyncio.to_thread(outage.wait_until_back)
        assert ended - started > 1.8  # the retry waited out the rest of the timeout
        assert ended < outage.back_at + 2.0  # it did not wait the whole timeout again
        assert space.retries > 0


async def test_contents_is_retried_until_its_first_entries(outage):
    async with outrig.aio.connect(outage.address) as space:
        await _back_after(outage, 0.3)
        assert [entry async for entry in space.contents(Task())] == []
        assert space.retries > 0


async def test_an_in_memory_servers_notify_stream_ends_when_it_stops(outage):
    # An in-memory server ends notify streams with OK (see the sync test for the grace).
    async with outrig.aio.connect(outage.address, retry_deadline=1.0) as space:
        async with space.notify(Task()) as events:
            await asyncio.to_thread(outage.stop, 2.0)
            assert [event async for event in events] == []
        assert space.retries == 0


async def test_a_notification_resumes_on_a_durable_server_after_a_restart(tmp_path: Path):
    server = Outage(ServerConfig(data_dir=tmp_path))
    try:
        async with outrig.aio.connect(server.address) as space, space.notify(Task(), lease=60.0) as events:
            await space.write(Task(n=1))
            first = await anext(events)
            await _back_after(server, 0.3)
            await asyncio.to_thread(server.wait_until_back)
            await space.write(Task(n=2))
            second = await asyncio.wait_for(anext(events), 4.0)
            assert second.entry == Task(n=2)
            assert second.sequence >= first.sequence + 2**31
            assert space.retries > 0
    finally:
        server.close()


async def test_a_resume_of_a_registration_that_ended_raises_not_found(tmp_path: Path):
    server = Outage(ServerConfig(data_dir=tmp_path))
    try:
        async with outrig.aio.connect(server.address) as space, space.notify(Task(), lease=60.0) as events:
            await _back_after(server, 0.3)
            await asyncio.to_thread(server.wait_until_back)
            # The stream is only read, and so only resumed, by the next anext(): end the
            # registration before that.
            await events.lease.cancel()
            with pytest.raises(outrig.NotFoundError):
                await asyncio.wait_for(anext(events), 4.0)
    finally:
        server.close()
