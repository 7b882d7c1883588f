"""A slow notify consumer loses events beyond the server's queue, and sees the loss as a gap."""

from __future__ import annotations

import asyncio

from outrig.service.backends.embedded.backend import EmbeddedBackend
from outrig.service.config import Limits, ServerConfig
from outrig.service.engine import FakeClock, NewEntry, Template


def _entry(n: int) -> NewEntry:
    return NewEntry("T", (), {}, n, 10)


async def test_events_beyond_the_queue_are_dropped_and_show_as_a_gap() -> None:
    backend = EmbeddedBackend(ServerConfig(limits=Limits(notify_queue=3)), clock=FakeClock())
    await backend.start()
    try:
        subscription = await backend.subscribe("s", [Template("T", {})], 60.0)
        events = aiter(subscription)
        await backend.write("s", [_entry(n) for n in range(10)], 60.0)  # nobody reads meanwhile
        first = [await anext(events) for _ in range(3)]
        assert [(e.sequence, e.entry.payload) for e in first] == [(1, 0), (2, 1), (3, 2)]
        assert subscription.dropped == 7
        await backend.write("s", [_entry(10)], 60.0)
        later = await asyncio.wait_for(anext(events), 5)
        assert (later.sequence, later.entry.payload) == (11, 10)  # 4..10 missed: a gap
    finally:
        await backend.close()
