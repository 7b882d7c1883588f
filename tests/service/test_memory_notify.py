"""When a notify stream waiting for events is woken (memory/subscription.py): on the loop's turn
after the write's, so that what the writing step set going first (a Mux stream's writer, which
answers the write) runs before the event is sent; events that come while it is awake wait for
no turn at all."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from outrig.service.backends.memory.backend import MemoryBackend
from outrig.service.config import ServerConfig
from outrig.service.engine import FakeClock, NewEntry, Template

from ..polling import wait_until_async


def _entry(n: int) -> NewEntry:
    return NewEntry("T", (), {}, n, 10)


@pytest.fixture
async def backend() -> AsyncIterator[MemoryBackend]:
    backend = MemoryBackend(ServerConfig(in_memory=True), clock=FakeClock())
    await backend.start()
    try:
        yield backend
    finally:
        await backend.close()


async def test_a_waiting_stream_is_woken_after_what_the_write_set_going(backend: MemoryBackend) -> None:
    subscription = await backend.subscribe("s", [Template("T", {})], 60.0)
    events = aiter(subscription)
    order: list[str] = []

    async def listen(count: int) -> None:
        for _ in range(count):
            event = await anext(events)
            order.append(f"event {event.sequence}")

    listener = asyncio.ensure_future(listen(3))
    await wait_until_async(lambda: subscription.waiting, what="the stream waits for events")
    await backend.write("s", [_entry(1)], 60.0)  # in memory: it never yields
    asyncio.get_running_loop().call_soon(order.append, "answer")  # as the Mux writer is woken
    await wait_until_async(lambda: len(order) == 2, what="the event and the answer")
    assert order == ["answer", "event 1"]
    # Two writes in one step, while the stream waits: both events, one wake.
    await wait_until_async(lambda: subscription.waiting, what="the stream waits again")
    await backend.write("s", [_entry(2)], 60.0)
    await backend.write("s", [_entry(3)], 60.0)
    await asyncio.wait_for(listener, 5)
    assert order == ["answer", "event 1", "event 2", "event 3"]


async def test_a_stream_that_ends_while_waiting_ends_at_once(backend: MemoryBackend) -> None:
    subscription = await backend.subscribe("s", [Template("T", {})], 60.0)
    events = aiter(subscription)
    listener = asyncio.ensure_future(anext(events, None))
    await wait_until_async(lambda: subscription.waiting, what="the stream waits for events")
    subscription.close()
    assert await asyncio.wait_for(listener, 5) is None
    assert not subscription.waiting
    await backend.write("s", [_entry(1)], 60.0)  # after the end: no wake is set going
