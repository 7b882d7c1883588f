"""The behaviour every SpaceBackend owes the servicer, written against the protocol alone.

Each test runs once per backend in conftest.BACKENDS. Lease times follow the `clock` fixture;
the few real waits (a blocked call timing out) are a fraction of a second of loop time.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from outrig.service.backends.base import Event, SpaceBackend, Subscription
from outrig.service.engine import MAX_LEASE_SECONDS, FakeClock, LeaseGrant, NewEntry, StoredEntry, Template
from outrig.service.exceptions import (
    InvalidArgumentError,
    LeaseNotFoundError,
    QuotaExceededError,
    TypeConflictError,
)
from outrig.service.protocol import codec
from outrig.v1 import space_pb2 as pb

from ..field_values import value
from ..polling import wait_until_async

WAIT = 5.0  # a bound on anything that should happen promptly; a hang fails instead of timing out


def message(type_name: str = "Task", *supertypes: str, **fields: object) -> pb.Entry:
    """The protobuf entry whose encoding the servicer stores as the payload (backends keep it)."""
    return pb.Entry(
        type_name=type_name,
        supertypes=supertypes,
        fields={name: codec.value_message(value(x)) for name, x in fields.items()},
    )


def entry(type_name: str = "Task", *supertypes: str, size: int = 10, **fields: object) -> NewEntry:
    payload = codec.payload_of(message(type_name, *supertypes, **fields))
    return NewEntry(type_name, supertypes, {name: value(x) for name, x in fields.items()}, payload, size)


def template(type_name: str = "Task", **fields: object) -> Template:
    return Template(type_name, {name: value(x) for name, x in fields.items()})


def ids(entries: Sequence[StoredEntry]) -> list[int]:
    return [e.id for e in entries]


async def write(
    backend: SpaceBackend, space: str, *entries: NewEntry, lease: float | None = None
) -> list[int]:
    return [grant.id for grant in await backend.write(space, list(entries), lease)]


async def read(backend: SpaceBackend, space: str, *templates: Template, **options: Any) -> list[StoredEntry]:
    return await match(backend, space, *templates, take=False, **options)


async def take(backend: SpaceBackend, space: str, *templates: Template, **options: Any) -> list[StoredEntry]:
    return await match(backend, space, *templates, take=True, **options)


async def match(
    backend: SpaceBackend,
    space: str,
    *templates: Template,
    take: bool,
    max_entries: int = 1,
    timeout: float | None = 0,
    if_exists: bool = False,
    transaction: int = 0,
) -> list[StoredEntry]:
    async with asyncio.timeout(WAIT if timeout is None or timeout < WAIT else None):
        return await backend.match(
            space,
            list(templates),
            take=take,
            max_entries=max_entries,
            timeout=timeout,
            if_exists=if_exists,
            transaction=transaction,
        )


async def contents(
    backend: SpaceBackend, space: str, *templates: Template, max_entries: int = 0
) -> list[list[int]]:
    async with asyncio.timeout(WAIT):
        return [ids(chunk) async for chunk in backend.contents(space, list(templates), max_entries)]


async def settle() -> None:
    """Let started tasks run up to where they block (parking a waiter, awaiting an event)."""
    for _ in range(20):
        await asyncio.sleep(0)


async def collect(subscription: Subscription) -> list[Event]:
    async with asyncio.timeout(WAIT):
        return [event async for event in subscription]


# ---------------------------------------------------------------- write, read, take


async def test_write_then_read_then_take(backend: SpaceBackend, space: str) -> None:
    grants = await backend.write(space, [entry(n=1), entry(n=2)], None)
    assert len(grants) == 2
    assert len({grant.id for grant in grants}) == 2
    (found,) = await read(backend, space, template(n=1))
    assert found.id == grants[0].id
    assert found.payload == codec.payload_of(message("Task", n=1))
    assert found.type_name == "Task"
    assert ids(await read(backend, space, template(n=1))) == [grants[0].id]  # a read leaves it
    assert ids(await take(backend, space, template(n=1))) == [grants[0].id]
    assert await take(backend, space, template(n=1)) == []
    assert await backend.count(space, [template()]) == 1


async def test_nothing_matching_returns_at_once_with_if_exists_or_timeout_zero(
    backend: SpaceBackend, space: str
) -> None:
    await write(backend, space, entry(n=1))
    for is_take in (False, True):
        assert await match(backend, space, template(n=2), take=is_take, timeout=None, if_exists=True) == []
        assert await match(backend, space, template(n=2), take=is_take, timeout=0) == []
        assert await match(backend, space, template("Other"), take=is_take, timeout=0, if_exists=True) == []
    assert await backend.count(space, [template()]) == 1


async def test_matching_by_type_hierarchy_and_value_kind(backend: SpaceBackend, space: str) -> None:
    dog, rock = await write(
        backend,
        space,
        entry("Dog", "Mammal", "Animal", legs=4, name="rex"),
        entry("Rock", legs=4, name="rex"),
    )
    (found,) = await read(backend, space, template("Animal", legs=4))
    assert (found.id, found.type_name) == (dog, "Dog")
    assert ids(await read(backend, space, template("Mammal", name="rex"), max_entries=5)) == [dog]
    assert await read(backend, space, template("Animal", legs=4.0)) == []
    assert await read(backend, space, template("Animal", legs=True)) == []
    assert await read(backend, space, template("Dog", legs=4, name="max")) == []
    assert ids(await read(backend, space, template("Rock", name="rex", legs=None))) == [rock]


async def test_large_values_match_exactly(backend: SpaceBackend, space: str) -> None:
    blobs = [b"h" * 40 + bytes([i]) * 1000 + b"t" * 40 for i in range(3)]
    written = await write(backend, space, *(entry(blob=b) for b in blobs))
    for blob, entry_id in zip(blobs, written, strict=True):
        assert ids(await read(backend, space, template(blob=blob), max_entries=5)) == [entry_id]
        assert await backend.count(space, [template(blob=blob)]) == 1


async def test_spaces_are_separate(backend: SpaceBackend, space: str) -> None:
    await write(backend, space, entry())
    other = space + "-other"
    assert await read(backend, other, template()) == []
    assert await backend.count(other, [template()]) == 0
    assert await backend.count(space, [template()]) == 1


async def test_take_many_takes_at_most_max_entries_oldest_first(backend: SpaceBackend, space: str) -> None:
    written = await write(backend, space, *(entry(i=i) for i in range(5)))
    assert ids(await take(backend, space, template(), max_entries=3)) == written[:3]
    assert ids(await take(backend, space, template(), max_entries=10)) == written[3:]
    assert await take(backend, space, template(), max_entries=10) == []


async def test_read_many_with_several_templates_is_a_union_in_arrival_order(
    backend: SpaceBackend, space: str
) -> None:
    written = await write(backend, space, entry(k=1), entry("Other", k=1), entry(k=2), entry(k=3))
    templates = [template(k=2), template("Other"), template(), template(k=1)]
    assert ids(await read(backend, space, *templates, max_entries=10)) == written
    assert ids(await read(backend, space, template(k=3), template(k=1), max_entries=10)) == [
        written[0],
        written[3],
    ]
    assert await backend.count(space, templates) == 4


async def test_count(backend: SpaceBackend, space: str) -> None:
    assert await backend.count(space, [template()]) == 0
    await write(backend, space, *(entry(a=i % 2, b=i % 3) for i in range(12)))
    assert await backend.count(space, [template()]) == 12
    assert await backend.count(space, [template(a=0)]) == 6
    assert await backend.count(space, [template(a=0, b=0)]) == 2
    assert await backend.count(space, [template(a=0), template(b=0)]) == 8
    await take(backend, space, template(a=0), max_entries=2)
    assert await backend.count(space, [template(a=0)]) == 4


# ---------------------------------------------------------------- blocking


async def test_a_blocked_take_is_woken_by_a_later_write(backend: SpaceBackend, space: str) -> None:
    taker = asyncio.create_task(take(backend, space, template(k=1), timeout=5))
    await settle()
    assert not taker.done()
    await write(backend, space, entry(k=2))
    await settle()
    assert not taker.done()
    (entry_id,) = await write(backend, space, entry(k=1))
    assert ids(await taker) == [entry_id]
    assert await backend.count(space, [template(k=1)]) == 0
    assert await backend.count(space, [template(k=2)]) == 1


async def test_blocked_readers_all_see_a_write_and_it_stays(backend: SpaceBackend, space: str) -> None:
    readers = [asyncio.create_task(read(backend, space, template(), timeout=5)) for _ in range(3)]
    await settle()
    (entry_id,) = await write(backend, space, entry())
    assert [ids(found) for found in await asyncio.gather(*readers)] == [[entry_id]] * 3
    assert await backend.count(space, [template()]) == 1


async def test_blocked_take_many_returns_at_least_one(backend: SpaceBackend, space: str) -> None:
    taker = asyncio.create_task(take(backend, space, template(), max_entries=10, timeout=5))
    await settle()
    written = await write(backend, space, entry(), entry(), entry())
    got = ids(await taker)
    assert 1 <= len(got) <= 3
    assert set(got) <= set(written)
    assert await backend.count(space, [template()]) == 3 - len(got)


async def test_a_blocked_take_times_out_empty(
    backend: SpaceBackend, space: str, parked_waiters: Callable[[str], int | None]
) -> None:
    loop = asyncio.get_running_loop()
    started = loop.time()
    assert await take(backend, space, template(), timeout=0.05) == []
    assert loop.time() - started >= 0.04
    assert parked_waiters(space) in (0, None)
    # Nothing of the timed-out call lingers: the next write is stored, not handed to a dead waiter.
    (entry_id,) = await write(backend, space, entry())
    assert ids(await read(backend, space, template())) == [entry_id]
    assert await backend.count(space, [template()]) == 1


async def test_a_blocked_read_times_out_empty(backend: SpaceBackend, space: str) -> None:
    assert await read(backend, space, template(), timeout=0.05) == []


async def test_concurrent_takers_never_share_an_entry(backend: SpaceBackend, space: str) -> None:
    takers = [asyncio.create_task(take(backend, space, template(), timeout=5)) for _ in range(50)]
    await settle()
    written: list[int] = []
    for start in range(0, 50, 10):
        written += await write(backend, space, *(entry(i=i) for i in range(start, start + 10)))
        await asyncio.sleep(0)
    results = await asyncio.gather(*takers)
    got = [e.id for found in results for e in found]
    assert all(len(found) == 1 for found in results)
    assert len(got) == len(set(got)) == 50
    assert set(got) == set(written)
    assert await backend.count(space, [template()]) == 0


async def test_concurrent_takers_over_stored_entries(backend: SpaceBackend, space: str) -> None:
    written = await write(backend, space, *(entry(i=i) for i in range(50)))
    results = await asyncio.gather(*(take(backend, space, template(), timeout=5) for _ in range(50)))
    got = [e.id for found in results for e in found]
    assert sorted(got) == sorted(written)
    assert await take(backend, space, template(), timeout=0) == []


async def test_a_cancelled_blocked_take_leaves_no_waiter_and_loses_nothing(
    backend: SpaceBackend, space: str, parked_waiters: Callable[[str], int | None]
) -> None:
    taker = asyncio.create_task(take(backend, space, template(), timeout=None))
    await settle()
    await wait_until_async(lambda: parked_waiters(space) in (1, None), what="the take parked")
    taker.cancel()
    with pytest.raises(asyncio.CancelledError):
        await taker
    assert parked_waiters(space) in (0, None)
    (entry_id,) = await write(backend, space, entry())
    assert await backend.count(space, [template()]) == 1
    assert ids(await take(backend, space, template())) == [entry_id]


async def test_a_take_cancelled_as_its_entry_arrives_loses_nothing(backend: SpaceBackend, space: str) -> None:
    taker = asyncio.create_task(take(backend, space, template(), timeout=5))
    await settle()
    (entry_id,) = await write(backend, space, entry())
    taker.cancel()  # before the taker could return what it was handed
    try:
        got = ids(await taker)
    except asyncio.CancelledError:
        got = []
    # Either the call returned the entry, or the entry is still in the space: never neither.
    left = ids(await read(backend, space, template(), max_entries=5))
    assert sorted(got + left) == [entry_id]


# ---------------------------------------------------------------- contents


async def test_contents_in_arrival_order(backend: SpaceBackend, space: str) -> None:
    written = await write(
        backend, space, *(entry("Dog", "Animal", i=i) if i % 3 else entry("Animal", i=i) for i in range(10))
    )
    await write(backend, space, entry("Rock"))
    chunks = await contents(backend, space, template("Animal"))
    assert all(chunks)
    assert [i for chunk in chunks for i in chunk] == written
    dogs = [i for chunk in await contents(backend, space, template("Dog")) for i in chunk]
    assert dogs == [entry_id for n, entry_id in enumerate(written) if n % 3]
    assert await contents(backend, space, template("Nothing")) == []


async def test_contents_max_entries(backend: SpaceBackend, space: str) -> None:
    written = await write(backend, space, *(entry(i=i) for i in range(10)))
    chunks = await contents(backend, space, template(), max_entries=6)
    assert [i for chunk in chunks for i in chunk] == written[:6]
    assert await backend.count(space, [template()]) == 10  # contents removes nothing


async def test_contents_skips_entries_taken_while_iterating(backend: SpaceBackend, space: str) -> None:
    written = await write(backend, space, *(entry(i=i) for i in range(20)))
    seen: list[int] = []
    iterator = aiter(backend.contents(space, [template()], 0))
    async with asyncio.timeout(WAIT):
        first = ids(await anext(iterator))
        assert first == written[: len(first)]
        taken = set(ids(await take(backend, space, template(), max_entries=20)))
        assert taken == set(written)
        async for chunk in iterator:
            seen += ids(chunk)
    assert seen == []  # every later entry was taken before its chunk was sent


# ---------------------------------------------------------------- leases


async def test_lease_grants(
    backend: SpaceBackend, space: str, clock: FakeClock, default_lease: float
) -> None:
    (forever,) = await backend.write(space, [entry()], math.inf)
    assert (forever.expires_at, forever.granted) == (None, None)
    (timed,) = await backend.write(space, [entry()], 30.0)
    assert (timed.expires_at, timed.granted) == (clock.time() + 30, 30)
    (default,) = await backend.write(space, [entry()], None)
    assert (default.expires_at, default.granted) == (clock.time() + default_lease, default_lease)


async def test_an_expired_entry_is_gone(backend: SpaceBackend, space: str, clock: FakeClock) -> None:
    (short,) = await write(backend, space, entry(k=1), lease=10)
    (long,) = await write(backend, space, entry(k=1), lease=100)
    clock.advance(10)
    assert ids(await read(backend, space, template(k=1), max_entries=5)) == [long]
    assert await backend.count(space, [template()]) == 1
    assert [i for chunk in await contents(backend, space, template()) for i in chunk] == [long]
    (renewed,) = await backend.renew(space, [(short, 10.0)])
    assert isinstance(renewed, LeaseNotFoundError)
    (cancelled,) = await backend.cancel(space, [short])
    assert isinstance(cancelled, LeaseNotFoundError)
    assert ids(await take(backend, space, template(), max_entries=5)) == [long]


async def test_renew_and_cancel_batches_report_each_lease(
    backend: SpaceBackend, space: str, clock: FakeClock
) -> None:
    first, second = await write(backend, space, entry(n=1), entry(n=2), lease=10)
    unknown = max(first, second) + 1_000_000
    results = await backend.renew(space, [(first, 30.0), (unknown, 30.0), (second, math.inf)])
    assert len(results) == 3
    assert isinstance(results[0], LeaseGrant)
    assert (results[0].id, results[0].expires_at, results[0].granted) == (first, clock.time() + 30, 30)
    assert isinstance(results[1], LeaseNotFoundError)
    assert isinstance(results[2], LeaseGrant)
    assert (results[2].id, results[2].expires_at) == (second, None)
    clock.advance(10)  # the original expiry: both survive their renewals
    assert await backend.count(space, [template()]) == 2

    cancelled = await backend.cancel(space, [first, unknown, first])
    assert cancelled[0] is None
    assert isinstance(cancelled[1], LeaseNotFoundError)
    assert isinstance(cancelled[2], LeaseNotFoundError)
    assert ids(await read(backend, space, template(), max_entries=5)) == [second]
    clock.advance(1e9)
    assert await backend.count(space, [template()]) == 1  # renewed to FOREVER


# ---------------------------------------------------------------- notify


async def test_subscribe_delivers_matching_writes_in_sequence(
    backend: SpaceBackend, space: str, clock: FakeClock
) -> None:
    subscription = await backend.subscribe(space, [template("Animal", legs=4)], 60.0)
    assert subscription.lease.expires_at == clock.time() + 60
    events_task = asyncio.create_task(collect(subscription))
    wanted = await write(backend, space, entry("Dog", "Animal", legs=4))
    await write(backend, space, entry("Dog", "Animal", legs=3), entry("Rock", legs=4))
    wanted += await write(backend, space, entry("Animal", legs=4), entry("Dog", "Animal", legs=4))
    await settle()
    assert await backend.cancel(space, [subscription.lease.id]) == [None]
    events = await events_task
    assert [event.entry.id for event in events] == wanted
    # Strictly increasing from 1; with no events dropped (a tiny queue), without gaps.
    assert [event.sequence for event in events] == list(range(1, len(wanted) + 1))
    assert events[0].entry.payload == codec.payload_of(message("Dog", "Animal", legs=4))


async def test_two_subscriptions_count_their_own_events(backend: SpaceBackend, space: str) -> None:
    every = await backend.subscribe(space, [template()], 60.0)
    evens = await backend.subscribe(space, [template(even=True)], 60.0)
    for i in range(4):
        await write(backend, space, entry(even=i % 2 == 0))
    await settle()
    assert await backend.cancel(space, [every.lease.id, evens.lease.id]) == [None, None]
    every_events, even_events = await collect(every), await collect(evens)
    assert len(every_events) == 4
    assert len(even_events) == 2
    assert [event.sequence for event in every_events] == [1, 2, 3, 4]
    assert [event.sequence for event in even_events] == [1, 2]
    assert [event.entry.id for event in even_events] == [every_events[0].entry.id, every_events[2].entry.id]


async def test_a_subscription_ends_when_its_lease_expires(
    backend: SpaceBackend, space: str, clock: FakeClock
) -> None:
    subscription = await backend.subscribe(space, [template()], 10.0)
    (before,) = await write(backend, space, entry())
    clock.advance(10)
    events = await collect(subscription)  # ends without a further write
    assert [event.entry.id for event in events] == [before]
    await write(backend, space, entry())
    (result,) = await backend.renew(space, [(subscription.lease.id, 10.0)])
    assert isinstance(result, LeaseNotFoundError)


async def test_a_renewed_subscription_lives_on(backend: SpaceBackend, space: str, clock: FakeClock) -> None:
    subscription = await backend.subscribe(space, [template()], 10.0)
    (grant,) = await backend.renew(space, [(subscription.lease.id, 100.0)])
    assert isinstance(grant, LeaseGrant)
    clock.advance(50)
    (entry_id,) = await write(backend, space, entry())
    subscription.close()
    assert [event.entry.id for event in await collect(subscription)] == [entry_id]


async def test_closing_a_subscription_ends_it(backend: SpaceBackend, space: str) -> None:
    subscription = await backend.subscribe(space, [template()], None)
    events_task = asyncio.create_task(collect(subscription))
    await settle()
    subscription.close()
    assert await events_task == []
    await write(backend, space, entry())
    (result,) = await backend.cancel(space, [subscription.lease.id])
    assert isinstance(result, LeaseNotFoundError)


# ---------------------------------------------------------------- quotas and types


async def test_max_entries_quota_is_all_or_nothing(backend: SpaceBackend, quota_space: Any) -> None:
    space, max_entries = quota_space.name, quota_space.max_entries
    await write(backend, space, *(entry() for _ in range(max_entries - 1)))
    with pytest.raises(QuotaExceededError):
        await write(backend, space, entry(), entry())
    assert await backend.count(space, [template()]) == max_entries - 1
    await write(backend, space, entry())
    with pytest.raises(QuotaExceededError):
        await write(backend, space, entry())
    await take(backend, space, template())
    await write(backend, space, entry())
    assert await backend.count(space, [template()]) == max_entries


async def test_max_bytes_quota(backend: SpaceBackend, quota_space: Any) -> None:
    space, max_bytes = quota_space.name, quota_space.max_bytes
    with pytest.raises(QuotaExceededError):
        await write(backend, space, entry(size=max_bytes + 1))
    await write(backend, space, entry(size=max_bytes // 2))
    with pytest.raises(QuotaExceededError):
        await write(backend, space, entry(size=max_bytes // 2 + 1))
    assert await backend.count(space, [template()]) == 1


async def test_expired_entries_free_their_quota(
    backend: SpaceBackend, quota_space: Any, clock: FakeClock
) -> None:
    space, max_entries = quota_space.name, quota_space.max_entries
    await write(backend, space, *(entry() for _ in range(max_entries)), lease=5)
    clock.advance(5)
    await write(backend, space, *(entry() for _ in range(max_entries)), lease=5)
    assert await backend.count(space, [template()]) == max_entries


async def test_type_conflicts_store_nothing(backend: SpaceBackend, space: str) -> None:
    await write(backend, space, entry("Dog", "Animal"))
    with pytest.raises(TypeConflictError):
        await write(backend, space, entry("Cat", "Animal"), entry("Dog", "Pet"))
    with pytest.raises(TypeConflictError):
        await write(backend, space, entry("A", "B"), entry("A", "C"))
    assert await backend.count(space, [template("Animal")]) == 1
    assert await backend.count(space, [template("A")]) == 0
    await write(backend, space, entry("A", "C"))  # the refused batch declared nothing
    assert await backend.count(space, [template("C")]) == 1


# ---------------------------------------------------------------- lease limits (issue 17)

HUGE = 1e308  # finite, and once overflowed the lease queue's arithmetic after the entry was filed


async def test_a_write_beyond_the_maximum_lease_is_refused_and_stores_nothing(
    backend: SpaceBackend, space: str
) -> None:
    with pytest.raises(
        InvalidArgumentError, match=r"lease\.seconds: 1e\+308 exceeds the maximum of 3155760000"
    ):
        await backend.write(space, [entry(job="huge")], HUGE)
    with pytest.raises(InvalidArgumentError, match="exceeds the maximum"):
        await backend.write(space, [entry(job="huge")], MAX_LEASE_SECONDS + 1)
    assert await backend.count(space, [template()]) == 0
    assert await take(backend, space, template()) == []
    assert await contents(backend, space, template()) == []
    # The space still works, and an ordinary write is taken once.
    (kept,) = await write(backend, space, entry(job="kept"))
    assert ids(await take(backend, space, template())) == [kept]
    assert await take(backend, space, template()) == []


async def test_the_maximum_lease_itself_is_granted(
    backend: SpaceBackend, space: str, clock: FakeClock
) -> None:
    (grant,) = await backend.write(space, [entry()], MAX_LEASE_SECONDS)
    assert (grant.expires_at, grant.granted) == (clock.time() + MAX_LEASE_SECONDS, MAX_LEASE_SECONDS)
    (renewed,) = await backend.renew(space, [(grant.id, MAX_LEASE_SECONDS)])
    assert isinstance(renewed, LeaseGrant) and renewed.granted == MAX_LEASE_SECONDS
    transaction = await backend.begin(space, MAX_LEASE_SECONDS)
    assert transaction.granted == MAX_LEASE_SECONDS
    await backend.abort(space, transaction.id)
    subscription = await backend.subscribe(space, [template()], MAX_LEASE_SECONDS)
    assert subscription.lease.granted == MAX_LEASE_SECONDS
    subscription.close()
    clock.advance(MAX_LEASE_SECONDS - 1)
    assert ids(await take(backend, space, template())) == [grant.id]
    assert await take(backend, space, template()) == []


async def test_renew_begin_and_notify_beyond_the_maximum_lease_are_refused(
    backend: SpaceBackend, space: str, clock: FakeClock
) -> None:
    first, second = await write(backend, space, entry(n=1), entry(n=2), lease=10)
    # The whole batch is refused, as the servicer refuses a malformed request: nothing renewed.
    with pytest.raises(InvalidArgumentError, match=r"duration\.seconds: 1e\+308 exceeds the maximum"):
        await backend.renew(space, [(first, 100.0), (second, HUGE)])
    with pytest.raises(InvalidArgumentError, match=r"lease\.seconds: 1e\+308 exceeds the maximum"):
        await backend.begin(space, HUGE)
    with pytest.raises(InvalidArgumentError, match=r"lease\.seconds: 1e\+308 exceeds the maximum"):
        await backend.subscribe(space, [template()], HUGE)
    transaction = await backend.begin(space, 60.0)
    with pytest.raises(InvalidArgumentError, match="exceeds the maximum"):
        await backend.renew(space, [(transaction.id, HUGE)])
    with pytest.raises(InvalidArgumentError, match="exceeds the maximum"):
        await backend.write(space, [entry(n=3)], HUGE, transaction=transaction.id)
    await backend.commit(space, transaction.id)  # still active: the refusals left it alone
    assert sorted(ids(await read(backend, space, template(), max_entries=5))) == [first, second]
    clock.advance(10)  # the leases were not renewed
    assert await backend.count(space, [template()]) == 0
