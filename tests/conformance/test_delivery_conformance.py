"""Takes with an acknowledgement deadline, delayed writes and dead letters (docs/work-queues.md),
as every SpaceBackend serves them: written against the protocol alone, run once per backend in
conftest.BACKENDS. Deadlines follow the `clock` fixture; the backend's reaper (every 0.01 s of
real time in CONFIG) acts on them, so a test moves the clock and then polls for the outcome.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

import pytest

from outrig.service.backends.base import SpaceBackend
from outrig.service.engine import FakeClock, Template
from outrig.service.engine.model import Delivery
from outrig.service.exceptions import DeliveryExpiredError, LeaseNotFoundError

from ..polling import wait_until_async
from .test_backend_conformance import WAIT, entry, ids, read, take, template, write

ACK = 30.0


async def deliver(
    backend: SpaceBackend,
    space: str,
    *templates: Template,
    max_entries: int = 1,
    timeout: float | None = 0,
    ack: float = ACK,
    max_deliveries: int = 0,
    request_id: str = "",
) -> list[Delivery]:
    async with asyncio.timeout(WAIT if timeout is None or timeout < WAIT else None):
        return await backend.deliver(
            space,
            list(templates) or [template()],
            max_entries=max_entries,
            timeout=timeout,
            ack=ack,
            max_deliveries=max_deliveries,
            request_id=request_id,
        )


def entry_ids(deliveries: Sequence[Delivery]) -> list[int]:
    return [delivery.entry.id for delivery in deliveries]


async def visible(backend: SpaceBackend, space: str) -> list[int]:
    return ids(await read(backend, space, template(), max_entries=100))


async def test_a_delivered_entry_is_hidden_until_acknowledged(
    backend: SpaceBackend, space: str, clock: FakeClock
) -> None:
    first, second = await write(backend, space, entry(n=1), entry(n=2))
    (delivery,) = await deliver(backend, space)
    assert delivery.entry.id == first
    assert delivery.deliveries == 1
    assert delivery.deadline == pytest.approx(clock.time() + ACK)
    assert delivery.receipt not in (first, second)
    assert await visible(backend, space) == [second]  # read, take and count do not see it
    assert await backend.count(space, [template()]) == 1
    assert entry_ids(await deliver(backend, space)) == [second]
    assert await deliver(backend, space) == []
    await backend.ack(space, delivery.receipt)
    with pytest.raises(DeliveryExpiredError):
        await backend.ack(space, delivery.receipt)  # acknowledged already
    with pytest.raises(DeliveryExpiredError):
        await backend.nack(space, delivery.receipt, 0.0)
    with pytest.raises(DeliveryExpiredError):
        await backend.extend(space, delivery.receipt, 10.0)
    with pytest.raises(DeliveryExpiredError):
        await backend.ack(space, delivery.receipt + 999_983)  # never given


async def test_a_deadline_that_passes_returns_the_entry_in_its_place(
    backend: SpaceBackend, space: str, clock: FakeClock
) -> None:
    first, second = await write(backend, space, entry(n=1), entry(n=2))
    (old,) = await deliver(backend, space, ack=5.0)
    clock.advance(5.5)
    await wait_until_async(lambda: _holds(backend, space, 2), what="the delivery's deadline to return it")
    assert await visible(backend, space) == [first, second]  # its arrival place, not the back
    (again,) = await deliver(backend, space)
    assert again.entry.id == first
    assert again.deliveries == 2
    assert again.receipt != old.receipt
    with pytest.raises(DeliveryExpiredError):
        await backend.ack(space, old.receipt)  # fenced: never applied to the new delivery
    assert await visible(backend, space) == [second]
    await backend.ack(space, again.receipt)
    assert await visible(backend, space) == [second]


async def _holds(backend: SpaceBackend, space: str, count: int) -> bool:
    return len(await visible(backend, space)) == count


async def test_nack_now_later_and_with_backoff(backend: SpaceBackend, space: str, clock: FakeClock) -> None:
    (first,) = await write(backend, space, entry(n=1))
    (delivery,) = await deliver(backend, space)
    returned = await backend.nack(space, delivery.receipt, 0.0)
    assert returned.visible_at is None and returned.dead_letter == ""
    assert await visible(backend, space) == [first]

    (delivery,) = await deliver(backend, space)
    assert delivery.deliveries == 2
    returned = await backend.nack(space, delivery.receipt, 10.0)
    assert returned.visible_at == pytest.approx(clock.time() + 10.0)
    assert await visible(backend, space) == []
    clock.advance(10.5)
    await wait_until_async(lambda: _holds(backend, space, 1), what="a nacked entry's delay to pass")

    (delivery,) = await deliver(backend, space)
    assert delivery.deliveries == 3
    returned = await backend.nack(space, delivery.receipt, None)  # backoff: 1 s * 2 ** (3 - 1)
    assert returned.visible_at == pytest.approx(clock.time() + 4.0)
    clock.advance(3.0)
    assert await visible(backend, space) == []
    clock.advance(1.5)
    await wait_until_async(lambda: _holds(backend, space, 1), what="the backoff to pass")


async def test_extend_pushes_the_deadline(backend: SpaceBackend, space: str, clock: FakeClock) -> None:
    await write(backend, space, entry(n=1), entry(n=2))
    (delivery,) = await deliver(backend, space, template(n=1), ack=5.0)
    (witness,) = await deliver(backend, space, template(n=2), ack=5.0)  # not extended
    deadline = await backend.extend(space, delivery.receipt, 60.0)
    assert deadline == pytest.approx(clock.time() + 60.0)
    clock.advance(10.0)
    # The witness coming back shows the reaper has passed the first deadline.
    await wait_until_async(lambda: _holds(backend, space, 1), what="the unextended delivery to expire")
    assert await visible(backend, space) == [witness.entry.id]
    await backend.ack(space, delivery.receipt)  # still pending: the extension held it
    with pytest.raises(DeliveryExpiredError):
        await backend.extend(space, witness.receipt, 60.0)


async def test_an_entry_past_max_deliveries_goes_to_the_dead_letter_space(
    backend: SpaceBackend, space: str, clock: FakeClock
) -> None:
    dead = f"{space}.dead"
    await write(backend, space, entry(n=7))
    (one,) = await deliver(backend, space, max_deliveries=2)
    assert (await backend.nack(space, one.receipt, 0.0)).dead_letter == ""
    (two,) = await deliver(backend, space, max_deliveries=2)
    assert two.deliveries == 2
    returned = await backend.nack(space, two.receipt, 0.0)
    assert returned.dead_letter == dead
    assert await visible(backend, space) == []
    (moved,) = await read(backend, dead, template(n=7))
    assert moved.payload == two.entry.payload
    (held,) = await deliver(backend, dead)
    assert held.deliveries == 3  # the count goes on
    assert "max_deliveries=2" in held.dead_letter_reason and repr(space) in held.dead_letter_reason
    await backend.ack(dead, held.receipt)

    # A deadline that passes counts as a failed delivery too.
    await write(backend, space, entry(n=8))
    (only,) = await deliver(backend, space, max_deliveries=1, ack=1.0)
    clock.advance(1.5)

    async def in_dead() -> bool:
        return bool(await read(backend, dead, template(n=8)))

    await wait_until_async(in_dead, what="the expired delivery's entry in the dead-letter space")
    assert await visible(backend, space) == []
    with pytest.raises(DeliveryExpiredError):
        await backend.ack(space, only.receipt)


async def test_a_delayed_write_is_invisible_until_its_time_and_wakes_a_parked_take(
    backend: SpaceBackend, space: str, clock: FakeClock, parked_waiters: Callable[[str], int | None]
) -> None:
    (grant,) = await backend.write(space, [entry(n=1)], None, visible_at=clock.time() + 20.0)
    assert await visible(backend, space) == []
    assert await backend.count(space, [template()]) == 0
    parked = asyncio.ensure_future(take(backend, space, template(n=1), timeout=WAIT))
    await wait_until_async(lambda: parked_waiters(space) in (1, None), what="the take to park")
    assert not parked.done()
    clock.advance(20.5)
    async with asyncio.timeout(WAIT):
        assert ids(await parked) == [grant.id]


async def test_a_parked_take_with_ack_is_handed_a_delivery(
    backend: SpaceBackend, space: str, parked_waiters: Callable[[str], int | None]
) -> None:
    parked = asyncio.ensure_future(deliver(backend, space, template(n=1), timeout=WAIT))
    await wait_until_async(lambda: parked_waiters(space) in (1, None), what="the take to park")
    (written,) = await write(backend, space, entry(n=1))
    async with asyncio.timeout(WAIT):
        (delivery,) = await parked
    assert delivery.entry.id == written and delivery.deliveries == 1
    assert await visible(backend, space) == []
    await backend.ack(space, delivery.receipt)


async def test_take_many_with_ack_and_the_order(backend: SpaceBackend, space: str, clock: FakeClock) -> None:
    written = await write(backend, space, *(entry(n=i) for i in range(5)))
    got = await deliver(backend, space, max_entries=3, ack=2.0)
    assert entry_ids(got) == written[:3]
    assert len({delivery.receipt for delivery in got}) == 3
    await backend.ack(space, got[1].receipt)
    clock.advance(2.5)
    await wait_until_async(lambda: _holds(backend, space, 4), what="two deliveries to expire")
    assert await visible(backend, space) == [written[0], written[2], written[3], written[4]]


async def test_retries_with_a_request_id_get_the_first_answer(backend: SpaceBackend, space: str) -> None:
    await write(backend, space, entry(n=1), entry(n=2))
    (first,) = await deliver(backend, space, request_id="deliver-1")
    (again,) = await deliver(backend, space, request_id="deliver-1")
    assert (again.entry.id, again.receipt) == (first.entry.id, first.receipt)
    assert len(await visible(backend, space)) == 1  # the retry took nothing more
    await backend.ack(space, first.receipt, request_id="ack-1")
    await backend.ack(space, first.receipt, request_id="ack-1")  # a retry, not a second ack
    with pytest.raises(DeliveryExpiredError):
        await backend.ack(space, first.receipt, request_id="ack-2")


async def test_a_cancelled_entry_ends_its_delivery(backend: SpaceBackend, space: str) -> None:
    (first,) = await write(backend, space, entry(n=1))
    (delivery,) = await deliver(backend, space)
    assert await backend.cancel(space, [first]) == [None]
    with pytest.raises(DeliveryExpiredError):
        await backend.ack(space, delivery.receipt)
    (error,) = await backend.cancel(space, [first])
    assert isinstance(error, LeaseNotFoundError)


# ---------------------------------------------------------------- settling in the next take, batch acks


async def test_a_take_settles_earlier_deliveries_before_it_takes(backend: SpaceBackend, space: str) -> None:
    written = await write(backend, space, entry(n=1), entry(n=2), entry(n=3), entry(n=4))
    first, second = await deliver(backend, space, max_entries=2)
    got = await backend.deliver(
        space, [template()], max_entries=1, timeout=0, ack=ACK, settle=[first.receipt, second.receipt]
    )
    assert entry_ids(got) == [written[2]]
    for done in (first, second):  # acknowledged by the take: gone for good
        with pytest.raises(DeliveryExpiredError):
            await backend.ack(space, done.receipt)
    assert await visible(backend, space) == [written[3]]
    # The take answers even when nothing is left to take: the settle stands.
    (last,) = await backend.deliver(
        space, [template()], max_entries=1, timeout=0, ack=ACK, settle=[got[0].receipt]
    )
    assert last.entry.id == written[3]
    assert (
        await backend.deliver(space, [template()], max_entries=1, timeout=0, ack=ACK, settle=[last.receipt])
        == []
    )
    assert (await backend.browse(space, [template()], 0, 10))[0] == []


async def test_a_settle_with_one_receipt_not_pending_changes_nothing(
    backend: SpaceBackend, space: str
) -> None:
    written = await write(backend, space, entry(n=1), entry(n=2), entry(n=3))
    first, second = await deliver(backend, space, max_entries=2)
    await backend.ack(space, second.receipt)
    with pytest.raises(DeliveryExpiredError, match=str(second.receipt)):
        await backend.deliver(
            space, [template()], max_entries=1, timeout=0, ack=ACK, settle=[first.receipt, second.receipt]
        )
    assert await visible(backend, space) == [written[2]]  # nothing taken
    await backend.ack(space, first.receipt)  # still pending: the failed settle did not ack it


async def test_a_settle_of_a_waiting_take_is_made_before_it_waits(backend: SpaceBackend, space: str) -> None:
    await write(backend, space, entry(n=1))
    (first,) = await deliver(backend, space)
    waiting = asyncio.ensure_future(
        backend.deliver(space, [template()], max_entries=1, timeout=None, ack=ACK, settle=[first.receipt])
    )

    async def settled() -> bool:  # browse shows pending deliveries too: the entry is gone
        return (await backend.browse(space, [template()], 0, 10))[0] == []

    await wait_until_async(settled, what="the waiting take's settle")
    with pytest.raises(DeliveryExpiredError):
        await backend.ack(space, first.receipt)
    assert not waiting.done()
    (later,) = await write(backend, space, entry(n=2))
    async with asyncio.timeout(WAIT):
        assert entry_ids(await waiting) == [later]


async def test_a_settling_take_retried_with_its_request_id_gets_the_first_answer(
    backend: SpaceBackend, space: str
) -> None:
    await write(backend, space, entry(n=1), entry(n=2), entry(n=3))
    (first,) = await deliver(backend, space)

    async def settle_take(request_id: str, receipt: int) -> list[Delivery]:
        return await backend.deliver(
            space, [template()], max_entries=1, timeout=0, ack=ACK, request_id=request_id, settle=[receipt]
        )

    (taken,) = await settle_take("settle-1", first.receipt)
    (again,) = await settle_take("settle-1", first.receipt)  # no DeliveryExpiredError: a retry
    assert again.receipt == taken.receipt
    assert len(await visible(backend, space)) == 1
    # A settling take that took nothing answers its retry with nothing, and acks nothing again.
    (last,) = await deliver(backend, space)
    await backend.ack(space, taken.receipt)
    assert await settle_take("settle-2", last.receipt) == []
    assert await settle_take("settle-2", last.receipt) == []


async def test_a_batch_ack_answers_per_receipt(backend: SpaceBackend, space: str) -> None:
    await write(backend, space, entry(n=1), entry(n=2), entry(n=3))
    got = await deliver(backend, space, max_entries=3)
    await backend.ack(space, got[1].receipt)
    outcomes = await backend.ack_many(space, [d.receipt for d in got], request_id="batch-1")
    assert outcomes[0] is None and outcomes[2] is None
    assert isinstance(outcomes[1], DeliveryExpiredError)
    assert await visible(backend, space) == []
    assert (await backend.browse(space, [template()], 0, 10))[0] == []
    again = await backend.ack_many(space, [d.receipt for d in got], request_id="batch-1")  # a retry
    assert [outcome is None for outcome in again] == [True, False, True]
    assert all(isinstance(o, DeliveryExpiredError) for o in await backend.ack_many(space, [got[0].receipt]))
