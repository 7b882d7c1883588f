"""Takes with an acknowledgement deadline in the engine, on the fake clock: deliveries, deadlines,
ordering after redelivery, fencing, backoff, dead letters, delayed writes waking waiters, cancel
and expiry of hidden entries, and recovery of delivery state."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest

from outrig.service.engine import FakeClock, SpaceEngine, SpaceSettings, StoredEntry, Waiter
from outrig.service.engine.model import Delivery
from outrig.service.engine.space import FOREVER
from outrig.service.exceptions import DeliveryExpiredError, InvalidArgumentError, QuotaExceededError

from .test_space import contents, find, ids, make, new, tpl


def fill(space: SpaceEngine, count: int, lease: float | None = FOREVER) -> list[int]:
    return [grant.id for grant in space.write([new("Job", n=n) for n in range(count)], lease)]


def numbers(entries: list[StoredEntry]) -> list[object]:
    return [stored.fields["n"].data for stored in entries]


def one(space: SpaceEngine, ack: float = 30.0, max_deliveries: int = 0) -> Delivery:
    (delivery,) = space.deliver([tpl("Job")], 1, ack, max_deliveries)
    return delivery


def collector(into: list[StoredEntry]) -> Callable[[list[StoredEntry]], bool]:
    """A waiter's `deliver` that keeps what it is handed."""

    def deliver(entries: list[StoredEntry]) -> bool:
        into.extend(entries)
        return True

    return deliver


def visible(space: SpaceEngine) -> list[object]:
    return numbers(contents(space, [tpl("Job")]))


# ---------------------------------------------------------------- delivering and acknowledging


def test_a_delivery_hides_the_entry_until_acked() -> None:
    clock = FakeClock()
    space = make(clock)
    first, second = fill(space, 2)
    delivery = one(space, ack=30.0)
    assert delivery.entry.id == first and delivery.deliveries == 1
    assert delivery.deadline == clock.time() + 30.0
    assert delivery.receipt not in (first, second)  # a fresh id of the space
    assert visible(space) == [1] and space.count([tpl("Job")]) == 1
    assert ids(find(space, [tpl("Job")], take=False, max_entries=5)) == [second]
    stats = space.statistics()
    assert (stats.entries, stats.in_flight) == (2, 1)  # still in the space: it counts
    assert space.ack(delivery.receipt) is delivery.entry
    assert space.statistics().entries == 1 and space.in_flight == 0
    clock.advance(60.0)
    space.reap()
    assert visible(space) == [1]  # acked: never back


def test_a_deadline_that_passes_returns_the_entry_in_its_place() -> None:
    clock = FakeClock()
    space = make(clock)
    fill(space, 3)
    delivery = one(space, ack=10.0)
    assert visible(space) == [1, 2]
    clock.advance(9.9)
    space.reap()
    assert visible(space) == [1, 2]
    clock.advance(0.1)
    space.reap()
    assert visible(space) == [0, 1, 2]  # whole, first again: its arrival is unchanged
    assert space.redelivered == 1
    again = one(space)
    assert again.entry is delivery.entry and again.deliveries == 2
    assert again.receipt != delivery.receipt


def test_redelivery_keeps_arrival_order_in_field_buckets_and_ordered_indexes() -> None:
    clock = FakeClock()
    space = make(clock)
    space.write([new("Job", kind="a", n=n) for n in range(4)], FOREVER)
    (delivery,) = space.deliver([tpl("Job", kind="a")], 1, 5.0)
    clock.advance(5.0)
    space.reap()
    assert numbers(find(space, [tpl("Job", kind="a")], take=False, max_entries=4)) == [0, 1, 2, 3]
    assert delivery.entry.fields["n"].data == 0


def test_deliver_many_draws_consecutive_receipts() -> None:
    space = make()
    fill(space, 3)
    deliveries = space.deliver([tpl("Job")], 5, 30.0)
    assert [d.entry.fields["n"].data for d in deliveries] == [0, 1, 2]
    first = deliveries[0].receipt
    assert [d.receipt for d in deliveries] == [first, first + 1, first + 2]
    assert space.deliver([tpl("Job")], 5, 30.0) == []


def test_a_hidden_entry_is_invisible_to_takes_and_notify() -> None:
    space = make()
    fill(space, 1)
    one(space)
    assert find(space, [tpl("Job")], take=True) == []
    assert space.deliver([tpl("Job")], 1, 30.0) == []


@pytest.mark.parametrize("ack", [0.0, -1.0, math.nan, math.inf])
def test_a_bad_deadline_is_refused(ack: float) -> None:
    space = make()
    fill(space, 1)
    with pytest.raises(InvalidArgumentError, match="ack"):
        space.deliver([tpl("Job")], 1, ack)
    assert visible(space) == [0]


# ---------------------------------------------------------------- fencing


def test_only_the_current_receipt_settles_a_delivery() -> None:
    clock = FakeClock()
    space = make(clock)
    fill(space, 1)
    old = one(space, ack=5.0)
    clock.advance(5.0)  # the reaper has not run: the ack finds the deadline past
    with pytest.raises(DeliveryExpiredError, match=f"receipt: {old.receipt}"):
        space.ack(old.receipt)
    new_one = one(space)
    for settle in (
        lambda: space.ack(old.receipt),
        lambda: space.nack(old.receipt, 0.0),
        lambda: space.extend(old.receipt, 10.0),
    ):
        with pytest.raises(DeliveryExpiredError):
            settle()
    assert space.in_flight == 1  # the new delivery is untouched
    space.ack(new_one.receipt)
    with pytest.raises(DeliveryExpiredError):
        space.ack(new_one.receipt)  # twice
    with pytest.raises(DeliveryExpiredError):
        space.ack(123_456)  # never given
    with pytest.raises(DeliveryExpiredError):
        space.ack(new_one.entry.id)  # an entry's id is no receipt


def test_cancel_or_expiry_of_a_hidden_entry_ends_its_delivery() -> None:
    clock = FakeClock()
    space = make(clock)
    first, second = fill(space, 2, lease=100.0)
    cancelled = one(space)
    assert space.cancel(first) is cancelled.entry
    with pytest.raises(DeliveryExpiredError):
        space.ack(cancelled.receipt)
    expiring = one(space, ack=500.0)
    clock.advance(100.0)
    space.reap()
    with pytest.raises(DeliveryExpiredError):
        space.ack(expiring.receipt)
    assert space.statistics().entries == 0 and space.in_flight == 0 and space.expired == 1
    assert second == expiring.entry.id


def test_renew_reaches_a_hidden_entry() -> None:
    clock = FakeClock()
    space = make(clock)
    (entry_id,) = fill(space, 1, lease=10.0)
    delivery = one(space, ack=30.0)
    space.renew(entry_id, 100.0)
    clock.advance(20.0)
    space.reap()
    space.ack(delivery.receipt)  # the lease was renewed: still pending


# ---------------------------------------------------------------- nack, extend, backoff


def test_nack_now_returns_the_entry_in_its_place() -> None:
    space = make()
    fill(space, 3)
    delivery = one(space)
    returned = space.nack(delivery.receipt, 0.0)
    assert returned.visible_at is None and returned.dead_letter == ""
    assert visible(space) == [0, 1, 2]
    assert space.redelivered == 1
    with pytest.raises(DeliveryExpiredError):
        space.nack(delivery.receipt, 0.0)


def test_nack_with_a_delay_hides_the_entry_until_then() -> None:
    clock = FakeClock()
    space = make(clock)
    fill(space, 2)
    delivery = one(space)
    returned = space.nack(delivery.receipt, 7.0)
    assert returned.visible_at == clock.time() + 7.0
    assert visible(space) == [1] and space.delayed == 1 and space.in_flight == 0
    clock.advance(7.0)
    space.reap()
    assert visible(space) == [0, 1] and space.delayed == 0


def test_nack_without_a_delay_backs_off_exponentially() -> None:
    clock = FakeClock()
    space = make(clock, nack_backoff=2.0, nack_backoff_max=10.0)
    fill(space, 1)
    waits = []
    for _ in range(5):
        delivery = one(space)
        returned = space.nack(delivery.receipt, None)
        assert returned.visible_at is not None
        waits.append(returned.visible_at - clock.time())
        clock.advance(waits[-1])
        space.reap()
    assert waits == [2.0, 4.0, 8.0, 10.0, 10.0]
    assert space.backoff(10_000) == 10.0  # no overflow


def test_extend_moves_the_deadline() -> None:
    clock = FakeClock()
    space = make(clock)
    fill(space, 1)
    delivery = one(space, ack=5.0)
    clock.advance(4.0)
    assert space.extend(delivery.receipt, 10.0) == clock.time() + 10.0
    clock.advance(9.0)
    space.reap()
    assert visible(space) == []
    clock.advance(1.0)
    space.reap()
    assert visible(space) == [0]
    with pytest.raises(InvalidArgumentError, match="seconds"):
        space.extend(one(space).receipt, -1.0)


def test_a_bad_nack_delay_is_refused_and_changes_nothing() -> None:
    space = make()
    fill(space, 1)
    delivery = one(space)
    with pytest.raises(InvalidArgumentError, match="delay"):
        space.nack(delivery.receipt, -1.0)
    assert space.in_flight == 1


# ---------------------------------------------------------------- dead letters


def dead_letters(space: SpaceEngine, dead: SpaceEngine) -> list[StoredEntry]:
    """Wire `space` to move its dead letters into `dead`, as the backend does."""
    moved: list[StoredEntry] = []

    def move(stored: StoredEntry, reason: str) -> None:
        written, _ = dead.write_entries(
            [new(stored.type_name, n=stored.fields["n"].data)],  # type: ignore[arg-type]
            FOREVER,
            carried=(stored.deliveries, reason),
        )
        moved.extend(written)

    space.on_dead_letter = move
    return moved


def test_an_entry_that_reaches_max_deliveries_moves_to_the_dead_letter_space() -> None:
    clock = FakeClock()
    space = make(clock, max_deliveries=2)
    dead = SpaceEngine(space.dead_letter_space, SpaceSettings(), clock)
    moved = dead_letters(space, dead)
    assert space.dead_letter_space == "test.dead"
    fill(space, 1)
    space.nack(one(space).receipt, 0.0)
    clock.advance(30.0)
    delivery = one(space, ack=1.0)
    assert delivery.deliveries == 2
    clock.advance(1.0)
    space.reap()  # the second delivery's deadline: the limit is reached
    assert space.statistics().entries == 0 and space.dead_lettered == 1
    (stored,) = moved
    assert stored.deliveries == 2 and stored.dead_letter_reason == "max_deliveries=2 reached in space 'test'"
    again = dead.deliver([tpl("Job")], 1, 30.0)[0]
    assert again.deliveries == 3 and again.dead_letter_reason == stored.dead_letter_reason


def test_a_nack_past_the_takes_limit_says_where_the_entry_went() -> None:
    space = make()
    dead = SpaceEngine("test.dead", SpaceSettings(), space._clock)
    moved = dead_letters(space, dead)
    fill(space, 1)
    returned = space.nack(one(space, max_deliveries=1).receipt, 5.0)
    assert returned == type(returned)(None, "test.dead")
    assert len(moved) == 1 and space.statistics().entries == 0


def test_a_dead_letter_space_that_refuses_keeps_the_entry() -> None:
    clock = FakeClock()
    space = make(clock, max_deliveries=1)
    dead = SpaceEngine("test.dead", SpaceSettings(max_entries=0), clock)
    dead_letters(space, dead)
    fill(space, 1)
    delivery = one(space)
    with pytest.raises(QuotaExceededError):
        space.nack(delivery.receipt, 0.0)
    assert space.in_flight == 1  # nothing changed: still pending
    clock.advance(30.0)
    space.reap()  # the deadline: refused again, so visible here, never dropped
    assert visible(space) == [0]


def test_a_partitions_dead_letter_space_is_the_same_partition() -> None:
    clock = FakeClock()
    assert SpaceEngine("jobs~3", SpaceSettings(), clock).dead_letter_space == "jobs.dead~3"
    assert SpaceEngine("jobs~3", SpaceSettings(dead_letter="failed"), clock).dead_letter_space == "failed~3"
    assert SpaceEngine("jobs", SpaceSettings(dead_letter="failed"), clock).dead_letter_space == "failed"


# ---------------------------------------------------------------- delayed writes


def test_a_delayed_write_is_hidden_until_its_time_then_offered_and_published() -> None:
    clock = FakeClock()
    space = make(clock)
    events: list[int] = []
    space.register((tpl("Job"),), FOREVER, lambda seq, stored: events.append(stored.id), lambda: None)
    handed: list[StoredEntry] = []
    space.park(Waiter(space.new_waiter_seq(), (tpl("Job"),), True, collector(handed)))
    (grant,) = space.write([new("Job", n=0)], FOREVER, visible_at=clock.time() + 60.0)
    assert handed == [] and events == [] and space.delayed == 1
    assert space.statistics().entries == 1 and visible(space) == []
    clock.advance(60.0)
    space.reap()
    assert ids(handed) == [grant.id]  # woken by the timer, not by polling
    assert events == [grant.id]
    assert space.statistics().entries == 0  # the parked take took it


def test_a_delayed_write_in_the_past_is_visible_at_once_and_keeps_arrival_order() -> None:
    clock = FakeClock()
    space = make(clock)
    space.write([new("Job", n=0)], FOREVER, visible_at=clock.time() + 5.0)
    space.write([new("Job", n=1)], FOREVER, visible_at=clock.time() - 5.0)
    assert visible(space) == [1]
    clock.advance(5.0)
    space.reap()
    assert visible(space) == [0, 1]


def test_a_delayed_write_cannot_run_under_a_transaction() -> None:
    space = make()
    txn, _ = space.begin(60.0)
    with pytest.raises(InvalidArgumentError, match="visible_at"):
        space.write_entries([new("Job", n=0)], FOREVER, txn, visible_at=space._clock.time() + 1.0)


def test_a_delayed_entry_counts_against_the_quota_and_can_be_cancelled() -> None:
    clock = FakeClock()
    space = make(clock, max_entries=1)
    (grant,) = space.write([new("Job", n=0)], FOREVER, visible_at=clock.time() + 60.0)
    with pytest.raises(QuotaExceededError):
        space.write([new("Job", n=1)], FOREVER)
    assert space.cancel(grant.id) is not None
    clock.advance(60.0)
    space.reap()
    assert visible(space) == [] and space.delayed == 0


# ---------------------------------------------------------------- waiters


def test_a_parked_take_with_ack_is_handed_a_delivery() -> None:
    clock = FakeClock()
    space = make(clock)
    handed: list[StoredEntry] = []
    space.park(Waiter(space.new_waiter_seq(), (tpl("Job"),), True, collector(handed), ack=15.0))
    fill(space, 1)
    (stored,) = handed
    delivery = space.delivery_of(stored)
    assert delivery.deliveries == 1 and delivery.deadline == clock.time() + 15.0
    assert space.statistics().entries == 1 and space.in_flight == 1
    assert space.pending(delivery.receipt) == delivery
    space.undeliver([delivery])  # its call went away: back, not counted
    assert stored.deliveries == 0 and visible(space) == [0] and space.pending(delivery.receipt) is None


def test_a_redelivered_entry_wakes_a_parked_take() -> None:
    clock = FakeClock()
    space = make(clock)
    fill(space, 1)
    delivery = one(space, ack=3.0)
    handed: list[StoredEntry] = []
    space.park(Waiter(space.new_waiter_seq(), (tpl("Job"),), True, collector(handed)))
    clock.advance(3.0)
    space.reap()
    assert handed == [delivery.entry] and space.statistics().entries == 0


# ---------------------------------------------------------------- recovery


def test_load_restores_pending_delayed_and_counted_entries() -> None:
    clock = FakeClock()
    space = make(clock)
    now = clock.time()
    space.load(1, 1, new("Job", n=0), None, hidden_until=now + 10.0, receipt=50, deliveries=1)
    space.load(2, 2, new("Job", n=1), None, hidden_until=now - 1.0, receipt=40, deliveries=3)
    space.load(3, 3, new("Job", n=2), None, hidden_until=now + 20.0)
    space.load(4, 4, new("Job", n=3), None, deliveries=2, dead_letter_reason="why")
    assert visible(space) == [1, 3]  # the one past its deadline is visible, its receipt dropped
    assert space.next_id > 50
    with pytest.raises(DeliveryExpiredError):
        space.ack(40)
    assert space.in_flight == 1 and space.delayed == 1
    clock.advance(10.0)
    space.reap()
    assert visible(space) == [0, 1, 3]
    clock.advance(10.0)
    space.reap()
    assert visible(space) == [0, 1, 2, 3]
    later = space.deliver([tpl("Job")], 4, 30.0)
    assert [d.deliveries for d in later] == [2, 4, 1, 3]
    assert later[3].dead_letter_reason == "why"


def test_load_keeps_a_pending_delivery_ackable() -> None:
    clock = FakeClock()
    space = make(clock)
    space.load(1, 1, new("Job", n=0), None, hidden_until=clock.time() + 10.0, receipt=7, deliveries=1)
    assert space.ack(7).id == 1


# ---------------------------------------------------------------- browse


def test_browse_shows_hidden_entries_in_arrival_order() -> None:
    clock = FakeClock()
    space = make(clock)
    fill(space, 3)
    one(space)
    space.write([new("Job", n=3)], FOREVER, visible_at=clock.time() + 5.0)
    for templates in ((), (tpl("Job"),)):
        found, _ = space.browse(templates, 0, 10, 100)
        assert numbers(found) == [0, 1, 2, 3]
