"""The admin API every backend owes the servicer: describe, browse, purge, cancel_registration
(and AbortTransaction, which is `abort`). Each test runs once per backend in conftest.BACKENDS."""

from __future__ import annotations

import asyncio

import pytest

from outrig.service.backends.base import SpaceBackend
from outrig.service.engine import FakeClock
from outrig.service.exceptions import LeaseNotFoundError, TransactionAbortedError

from ..polling import wait_for_waiters_async
from .test_backend_conformance import collect, entry, ids, read, template, write


async def test_describe_shows_types_indexes_waiters_registrations_and_transactions(
    backend: SpaceBackend, space: str, clock: FakeClock
) -> None:
    await write(backend, space, entry("Animal", legs=4, size=10), entry("Dog", "Animal", legs=4, size=30))
    await write(backend, space, entry("Dog", "Animal", legs=3, name="rex", size=20))
    clock.advance(30)
    await write(backend, space, entry("Rock", size=5))
    subscription = await backend.subscribe(space, [template("Dog", legs=4)], 60.0)
    txn = await backend.begin(space, 120.0)
    await write(backend, space, entry("Dog", "Animal", size=7), lease=None)  # outside the transaction
    (txn_write,) = [
        g.id for g in await backend.write(space, [entry("Rock", size=1)], None, transaction=txn.id)
    ]
    waiters = [asyncio.create_task(read(backend, space, template("Cat"), timeout=5)) for _ in range(2)]
    taker = asyncio.create_task(
        backend.match(space, [template("Cat")], take=True, max_entries=1, timeout=5, if_exists=False)
    )
    await wait_for_waiters_async(backend, space, 3)

    described = await backend.describe(space)

    types = {view.type_name: view for view in described.types}
    assert set(types) == {"Animal", "Dog", "Rock"}
    assert (types["Dog"].entries, types["Dog"].bytes, types["Dog"].supertypes) == (3, 57, ("Animal",))
    assert (types["Animal"].entries, types["Animal"].with_subtypes) == (1, 4)
    assert (types["Rock"].entries, types["Rock"].bytes) == (2, 6)  # the transaction's write counts
    assert types["Dog"].indexes == {"legs": 2, "name": 1}  # legs 4 and 3; one name
    assert types["Animal"].indexes == {"legs": 2, "name": 1}  # subtypes are filed under it too
    assert (described.entries, described.bytes, described.locked) == (6, 73, 1)
    assert described.waiters == 3
    groups = sorted((g.take, g.count, g.templates[0].type_name) for g in described.waiting)
    assert groups == [(False, 2, "Cat"), (True, 1, "Cat")]
    (registration,) = described.registration_list
    assert registration.id == subscription.lease.id
    assert registration.expires_at == subscription.lease.expires_at
    assert [t.type_name for t in registration.templates] == ["Dog"]
    (transaction,) = described.transaction_list
    assert (transaction.id, transaction.written, transaction.taken) == (txn.id, 1, 0)
    assert transaction.expires_at == txn.expires_at
    assert described.oldest_entry_age is not None and 30 <= described.oldest_entry_age < 31
    assert described.settings.fifo and described.max_registrations > 0
    assert txn_write

    for task in (*waiters, taker):
        task.cancel()
    await asyncio.gather(*waiters, taker, return_exceptions=True)
    subscription.close()


async def test_describe_an_empty_space(backend: SpaceBackend, space: str) -> None:
    described = await backend.describe(space)
    assert (described.entries, described.types, described.oldest_entry_age) == (0, [], None)


async def test_browse_pages_through_matches_in_arrival_order_without_taking(
    backend: SpaceBackend, space: str
) -> None:
    written = []
    for i in range(30):
        written += await write(backend, space, entry("Task", n=i, even=i % 2 == 0))
    await write(backend, space, entry("Other", n=99))
    evens = [entry_id for i, entry_id in enumerate(written) if i % 2 == 0]

    seen: list[int] = []
    cursor, pages = 0, 0
    while True:
        found, cursor = await backend.browse(space, [template("Task", even=True)], cursor, 4)
        assert len(found) <= 4
        seen += ids(found)
        pages += 1
        if not cursor:
            break
    assert seen == evens
    assert pages == 4  # 15 entries, 4 a page
    everything, cursor = await backend.browse(space, [], 0, 1000)
    assert (len(everything), cursor) == (31, 0)
    assert await backend.count(space, [template("Task")]) == 30  # nothing was taken


async def test_browse_hides_what_a_transaction_took_and_wrote(backend: SpaceBackend, space: str) -> None:
    first, second = await write(backend, space, entry(n=1), entry(n=2))
    txn = await backend.begin(space, 60.0)
    await backend.match(
        space, [template(n=1)], take=True, max_entries=1, timeout=0, if_exists=False, transaction=txn.id
    )
    await backend.write(space, [entry(n=3)], None, transaction=txn.id)
    found, _ = await backend.browse(space, [template()], 0, 100)
    assert ids(found) == [second]
    await backend.abort(space, txn.id)
    found, _ = await backend.browse(space, [template()], 0, 100)
    assert sorted(ids(found)) == [first, second]


async def test_purge_removes_the_matches_and_a_dry_run_only_counts(backend: SpaceBackend, space: str) -> None:
    for i in range(10):
        await write(backend, space, entry("Task", n=i, even=i % 2 == 0))
    await write(backend, space, entry("Other"))
    evens = [template("Task", even=True)]
    assert await backend.purge(space, evens, dry_run=True, max_entries=0) == 5
    assert await backend.purge(space, evens, dry_run=True, max_entries=3) == 3
    assert await backend.count(space, [template("Task")]) == 10
    assert await backend.purge(space, evens, dry_run=False, max_entries=2) == 2
    assert await backend.purge(space, evens, dry_run=False, max_entries=0) == 3
    assert await backend.count(space, evens) == 0
    assert await backend.count(space, [template("Task")]) == 5
    assert await backend.count(space, [template("Other")]) == 1


async def test_a_purge_lets_other_calls_run_between_its_batches(backend: SpaceBackend, space: str) -> None:
    """A purge of many entries removes a batch at a time: a caller running meanwhile sees the
    space part-purged, never held up until the whole purge is done."""
    total = 5000
    for start in range(0, total, 1000):
        await backend.write(space, [entry(n=i) for i in range(start, start + 1000)], None)
    purge = asyncio.create_task(backend.purge(space, [template()], dry_run=False, max_entries=0))
    seen: list[int] = []
    while not purge.done():
        seen.append(await backend.count(space, [template()]))
        await asyncio.sleep(0)
    assert await purge == total
    assert any(0 < number < total for number in seen), seen
    assert await backend.count(space, [template()]) == 0


async def test_cancel_registration_ends_only_a_registration(backend: SpaceBackend, space: str) -> None:
    (entry_id,) = await write(backend, space, entry())
    subscription = await backend.subscribe(space, [template()], 60.0)
    with pytest.raises(LeaseNotFoundError, match=f"registration {entry_id} "):
        await backend.cancel_registration(space, entry_id)  # an entry's lease: not a registration
    with pytest.raises(LeaseNotFoundError, match="registration 999999 "):
        await backend.cancel_registration(space, 999999)
    await backend.cancel_registration(space, subscription.lease.id)
    assert await collect(subscription) == []  # its events end
    assert (await backend.describe(space)).registrations == 0
    assert await backend.count(space, [template()]) == 1
    with pytest.raises(LeaseNotFoundError):
        await backend.cancel_registration(space, subscription.lease.id)


async def test_abort_by_id_puts_a_transactions_takes_back(backend: SpaceBackend, space: str) -> None:
    (entry_id,) = await write(backend, space, entry())
    txn = await backend.begin(space, 60.0)
    await backend.match(
        space, [template()], take=True, max_entries=1, timeout=0, if_exists=False, transaction=txn.id
    )
    assert (await backend.describe(space)).transaction_list[0].taken == 1
    await backend.abort(space, txn.id)
    assert ids(await read(backend, space, template())) == [entry_id]
    with pytest.raises(TransactionAbortedError):
        await backend.commit(space, txn.id)
