"""Transactions, as every `SpaceBackend` must provide them (docs/transactions.md).

Each test runs once per backend in conftest.BACKENDS; lease times follow the `clock` fixture.
"""

from __future__ import annotations

import asyncio

import pytest

from outrig.service.backends.base import SpaceBackend
from outrig.service.engine import FakeClock
from outrig.service.exceptions import TransactionAbortedError, TransactionNotFoundError

from ..polling import wait_for_waiters_async, wait_until_async
from .test_backend_conformance import entry, ids, read, take, template, write


async def _begin(backend: SpaceBackend, space: str, lease: float = 60.0) -> int:
    return (await backend.begin(space, lease)).id


async def test_commit_makes_writes_visible_and_takes_final(backend: SpaceBackend, space: str) -> None:
    (kept,) = await write(backend, space, entry(n=1))
    txn = await _begin(backend, space)
    written = [g.id for g in await backend.write(space, [entry(n=2)], None, transaction=txn)]
    assert ids(await read(backend, space, template(n=2))) == []
    assert ids(await take(backend, space, template(n=1), transaction=txn)) == [kept]
    assert await backend.count(space, [template()]) == 0
    assert await backend.count(space, [template()], txn) == 1
    await backend.commit(space, txn)
    assert ids(await read(backend, space, template())) == written
    await backend.commit(space, txn)  # a retried commit: OK
    with pytest.raises(TransactionAbortedError):
        await backend.abort(space, txn)


async def test_abort_discards_writes_and_puts_takes_back(backend: SpaceBackend, space: str) -> None:
    first, second = await write(backend, space, entry(n=1), entry(n=2))
    txn = await _begin(backend, space)
    await backend.write(space, [entry(n=3)], None, transaction=txn)
    assert ids(await take(backend, space, template(), transaction=txn)) == [first]
    assert ids(await read(backend, space, template())) == [second]
    await backend.abort(space, txn)
    assert ids(await read(backend, space, template(), max_entries=10)) == [first, second]
    with pytest.raises(TransactionAbortedError):
        await backend.commit(space, txn)
    with pytest.raises(TransactionNotFoundError):
        await backend.write(space, [entry(n=4)], None, transaction=txn)


async def test_a_read_lock_blocks_takes_until_the_reader_ends(backend: SpaceBackend, space: str) -> None:
    (entry_id,) = await write(backend, space, entry(n=1))
    txn = await _begin(backend, space)
    assert ids(await read(backend, space, template(), transaction=txn)) == [entry_id]
    assert ids(await read(backend, space, template())) == [entry_id]  # others read
    assert await take(backend, space, template()) == []  # but do not take
    waiting = asyncio.ensure_future(take(backend, space, template(), timeout=None))
    await wait_for_waiters_async(backend, space, 1)  # parked behind the lock
    assert not waiting.done()
    await backend.commit(space, txn)
    assert ids(await waiting) == [entry_id]


async def test_if_exists_waits_only_for_locked_entries(backend: SpaceBackend, space: str) -> None:
    assert await take(backend, space, template(), timeout=None, if_exists=True) == []  # nothing: at once
    txn = await _begin(backend, space)
    (entry_id,) = [g.id for g in await backend.write(space, [entry(n=1)], None, transaction=txn)]
    waiting = asyncio.ensure_future(take(backend, space, template(), timeout=None, if_exists=True))
    await wait_for_waiters_async(backend, space, 1)  # parked: the one match is locked
    assert not waiting.done()
    await backend.commit(space, txn)
    assert ids(await waiting) == [entry_id]
    txn = await _begin(backend, space)
    await backend.write(space, [entry(n=2)], None, transaction=txn)
    waiting = asyncio.ensure_future(take(backend, space, template(), timeout=None, if_exists=True))
    await wait_for_waiters_async(backend, space, 1)
    await backend.abort(space, txn)
    assert await waiting == []  # the locked entry is gone: nothing left to wait for


async def test_a_transaction_aborts_when_its_lease_runs_out(
    backend: SpaceBackend, space: str, clock: FakeClock
) -> None:
    (entry_id,) = await write(backend, space, entry(n=1))
    txn = await _begin(backend, space, lease=5.0)
    await take(backend, space, template(), transaction=txn)
    clock.advance(6.0)
    # The reaper runs every 10 ms of real time: the take is undone at its next pass.
    await wait_until_async(
        lambda: read(backend, space, template()), what="the reaper to abort the transaction"
    )
    assert ids(await read(backend, space, template())) == [entry_id]
    with pytest.raises(TransactionAbortedError):
        await backend.commit(space, txn)


async def test_notify_hears_a_write_at_commit(backend: SpaceBackend, space: str) -> None:
    subscription = await backend.subscribe(space, [template()], 60.0)
    events = aiter(subscription)
    txn = await _begin(backend, space)
    inside = await backend.subscribe(space, [template()], 60.0, transaction=txn)
    (written,) = [g.id for g in await backend.write(space, [entry(n=1)], None, transaction=txn)]
    own = await asyncio.wait_for(anext(aiter(inside)), 5)
    assert own.entry.id == written
    next_event = asyncio.ensure_future(anext(events))
    # A deliberate pause, to show that no event comes before the commit: there is no state to
    # poll for an event that must not exist (a backend may deliver it from another connection).
    await asyncio.sleep(0.05)
    assert not next_event.done()  # not before the commit
    await backend.commit(space, txn)
    assert (await asyncio.wait_for(next_event, 5)).entry.id == written
    subscription.close()
