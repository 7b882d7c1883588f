"""Request ids on an in-memory server (backends/memory/backend.py, idempotency.py): a write, and a
take that finds at once, are recorded once they have acted (`RequestLog.acted`, no `Outcome`
begun); a take that parks is begun when it parks, so a retry that comes meanwhile waits for it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Coroutine
from typing import Any

import pytest

from outrig.service.backends.memory.backend import MemoryBackend
from outrig.service.backends.memory.idempotency import Outcome, RequestLog
from outrig.service.config import ServerConfig
from outrig.service.engine import FakeClock, NewEntry, Template
from outrig.service.engine.model import LeaseGrant, StoredEntry
from outrig.service.exceptions import RequestConflictError, TypeConflictError

from ..polling import wait_until_async


def _entry(n: int, supertypes: tuple[str, ...] = ()) -> NewEntry:
    return NewEntry("T", supertypes, {}, n, 10)


@pytest.fixture
async def backend() -> AsyncIterator[MemoryBackend]:
    backend = MemoryBackend(ServerConfig(in_memory=True), clock=FakeClock(1_000.0))
    await backend.start()
    try:
        yield backend
    finally:
        await backend.close()


def _take(
    backend: MemoryBackend, request_id: str, timeout: float | None = 0
) -> Coroutine[Any, Any, list[StoredEntry]]:
    return backend.match(
        "s",
        [Template("T", {})],
        take=True,
        max_entries=1,
        timeout=timeout,
        if_exists=False,
        request_id=request_id,
    )


@pytest.mark.parametrize(
    "result", [[LeaseGrant(7, 1_060.0, 60.0)], [LeaseGrant(7, None, None), LeaseGrant(8, None, None)], None]
)
def test_acted_records_what_begin_and_finish_record(result: object) -> None:
    clock = FakeClock(1_000.0)
    begun, acted = RequestLog(60.0, clock), RequestLog(60.0, clock)
    begun.finish(begun.begin("id", "jobs", "write"), result)
    acted.acted("id", "jobs", "write", result)
    assert acted._outcomes == begun._outcomes and list(acted._order) == list(begun._order)
    found = acted.find("id", "jobs", "write")
    assert isinstance(found, Outcome) and found.done is None and found.result == result
    with pytest.raises(RequestConflictError):
        acted.find("id", "jobs", "take")
    clock.advance(60.0)
    assert acted.prune() == 1 and len(acted) == 0


async def test_a_retried_write_acts_once_and_answers_the_same(backend: MemoryBackend) -> None:
    first = await backend.write("s", [_entry(1)], 60.0, request_id="w")
    again = await backend.write("s", [_entry(1)], 60.0, request_id="w")
    assert again == first and await backend.count("s", [Template("T", {})]) == 1
    with pytest.raises(RequestConflictError):
        await _take(backend, "w")


async def test_a_write_that_fails_leaves_its_id_free(backend: MemoryBackend) -> None:
    await backend.write("s", [_entry(1, ("Base",))], 60.0)
    with pytest.raises(TypeConflictError):
        await backend.write("s", [_entry(2, ("Other",))], 60.0, request_id="w")
    assert "w" not in backend._requests.ids
    await backend.write("s", [_entry(2, ("Base",))], 60.0, request_id="w")  # acts afresh
    assert await backend.count("s", [Template("T", {})]) == 2


async def test_a_retried_take_that_found_at_once_takes_once(backend: MemoryBackend) -> None:
    await backend.write("s", [_entry(1)], 60.0)
    await backend.write("s", [_entry(2)], 60.0)
    taken = await _take(backend, "t")
    again = await _take(backend, "t")
    assert [(e.id, e.payload) for e in again] == [(e.id, e.payload) for e in taken] == [(taken[0].id, 1)]
    assert await backend.count("s", [Template("T", {})]) == 1


async def test_a_take_that_found_nothing_leaves_its_id_free(backend: MemoryBackend) -> None:
    assert await _take(backend, "t") == []
    assert "t" not in backend._requests.ids
    await backend.write("s", [_entry(1)], 60.0)
    taken = await _take(backend, "t")
    assert [e.payload for e in taken] == [1]


async def test_a_retry_of_a_parked_take_waits_for_it_and_gets_its_entry(backend: MemoryBackend) -> None:
    first = asyncio.ensure_future(_take(backend, "t", timeout=None))
    await wait_until_async(lambda: backend.engine("s").waiting == 1, what="the take parks")
    outcome = backend._requests.find("t", "s", "take")
    assert isinstance(outcome, Outcome) and outcome._done is None  # begun as it parked
    retry = asyncio.ensure_future(_take(backend, "t", timeout=None))
    await wait_until_async(lambda: outcome._done is not None, what="the retry waits for the first call")
    assert backend.engine("s").waiting == 1 and not retry.done()  # it parked nothing
    await backend.write("s", [_entry(1)], 60.0)
    taken, again = await asyncio.wait_for(asyncio.gather(first, retry), 5)
    assert [(e.id, e.payload) for e in again] == [(e.id, e.payload) for e in taken]
    assert [e.payload for e in taken] == [1] and await backend.count("s", [Template("T", {})]) == 0
