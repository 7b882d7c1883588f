"""The change log in the engine, on the fake clock: every change kind logged at its commit point
(and nothing else), a transaction's commit as consecutive changes, retention by count, bytes and
age, compacted and ahead-of-head positions, rewind and restore, durable subscriptions, and the
description's figures."""

from __future__ import annotations

import pytest

from outrig.service.engine import FakeClock, SpaceEngine, StoredEntry, Waiter
from outrig.service.engine.changes import CHANGE_OVERHEAD, Change, ChangeLog
from outrig.service.engine.inspection import Tally, describe
from outrig.service.engine.space import FOREVER
from outrig.service.exceptions import (
    CompactedError,
    InvalidCursorError,
    SubscriptionBusyError,
    SubscriptionNotFoundError,
)

from .test_space import find, make, new, tpl


def kinds(space: SpaceEngine, after: int = 0) -> list[tuple[str, int]]:
    """The log after `after` as (kind, entry id) pairs."""
    assert space.changes is not None
    return [(change.kind, change.entry.id) for change in space.changes.after(after, 1 << 20)]


def logged(space: SpaceEngine) -> list[Change]:
    """Have the engine's hook keep every change it is told of."""
    told: list[Change] = []
    space.on_change = told.append
    return told


def seqs(space: SpaceEngine) -> list[int]:
    assert space.changes is not None
    return [change.seq for change in space.changes.after(0, 1 << 20)]


# ---------------------------------------------------------------- what is a change


def test_writes_and_takes_are_logged_in_order_and_told_to_the_hook() -> None:
    space = make()
    told = logged(space)
    a, b = (grant.id for grant in space.write([new("T", n=1), new("T", n=2)], FOREVER))
    (taken,) = find(space, [tpl("T", n=2)], take=True)
    assert kinds(space) == [("write", a), ("write", b), ("take", b)]
    assert [change.seq for change in told] == [1, 2, 3]
    assert told[2].entry is taken and told[2].transaction == 0
    assert space.changes is not None and space.changes.head == 3 and space.changes.oldest == 1


def test_reads_renewals_and_deliveries_are_not_changes() -> None:
    space = make()
    (grant,) = space.write([new("T", n=1)], 60.0)
    find(space, [tpl("T")], take=False)
    space.count([tpl("T")])
    space.renew(grant.id, 120.0)
    (delivery,) = space.deliver([tpl("T")], 1, 30.0)
    space.extend(delivery.receipt, 60.0)
    space.nack(delivery.receipt, 0.0)
    assert kinds(space) == [("write", grant.id)]


def test_a_blocked_take_is_logged_by_its_call_not_by_the_write_that_hands_it_over() -> None:
    space = make()
    handed: list[StoredEntry] = []

    def deliver(entries: list[StoredEntry]) -> bool:
        handed.extend(entries)
        return True

    space.park(Waiter(space.new_waiter_seq(), (tpl("T"),), True, deliver))
    (grant,) = space.write([new("T", n=1)], FOREVER)
    assert [stored.id for stored in handed] == [grant.id]
    assert kinds(space) == [("write", grant.id)]
    space.log_taken(handed)
    assert kinds(space) == [("write", grant.id), ("take", grant.id)]


def test_expiry_by_the_reaper_and_on_the_way_and_cancel_and_purge() -> None:
    clock = FakeClock()
    space = make(clock)
    reaped, lazy, cancelled, purged = (g.id for g in space.write([new("T", n=n) for n in range(4)], 10.0))
    space.renew(cancelled, FOREVER)
    space.renew(purged, FOREVER)
    space.renew(lazy, 20.0)
    clock.advance(11)
    assert space.reap() == 1
    clock.advance(10)
    assert [s.id for s in find(space, [tpl("T")], take=False, max_entries=5)] == [cancelled, purged]
    space.cancel(cancelled)
    space.cancel(purged, "purge")
    assert kinds(space, 4) == [("expire", reaped), ("expire", lazy), ("cancel", cancelled), ("purge", purged)]


def test_a_delayed_write_is_logged_at_write_time_with_its_visible_at() -> None:
    clock = FakeClock()
    space = make(clock)
    (grant,) = space.write([new("T", n=1)], FOREVER, visible_at=clock.time() + 5)
    assert space.changes is not None
    (change,) = space.changes.after(0, 10)
    assert change.kind == "write" and change.visible_at == clock.time() + 5
    clock.advance(6)
    space.reap()  # it shows now: not a change
    assert kinds(space) == [("write", grant.id)]


def test_an_ack_is_a_take_and_a_dead_letter_is_dead_here() -> None:
    space = make(max_deliveries=1)
    moved: list[StoredEntry] = []
    space.on_dead_letter = lambda stored, reason: moved.append(stored)
    first, second = (g.id for g in space.write([new("T", n=1), new("T", n=2)], FOREVER))
    one, two = space.deliver([tpl("T")], 2, 30.0)
    space.ack(one.receipt)
    space.nack(two.receipt, 0.0)  # its count is at max_deliveries: a dead letter
    assert [stored.id for stored in moved] == [second]
    assert kinds(space, 2) == [("take", first), ("dead", second)]


def test_a_commit_logs_its_writes_and_takes_consecutively_and_an_abort_nothing() -> None:
    space = make()
    (kept,) = (g.id for g in space.write([new("T", n=0)], FOREVER))
    txn, _ = space.begin(60.0)
    (mine,), _ = space.write_entries([new("T", n=1)], FOREVER, txn)
    (back,), _ = space.write_entries([new("T", n=2)], FOREVER, txn)
    find(space, [tpl("T", n=0)], take=True, txn=txn)
    find(space, [tpl("T", n=2)], take=True, txn=txn)  # its own write, taken back: never a change
    other = make()
    assert kinds(space) == [("write", kept)]
    space.write([new("U")], FOREVER)  # another change between: the commit's stay together
    space.commit(txn)
    assert space.changes is not None
    commit = space.changes.after(2, 10)
    assert [(c.kind, c.entry.id, c.transaction) for c in commit] == [
        ("write", mine.id, txn.id),
        ("take", kept, txn.id),
    ]
    assert [c.seq for c in commit] == [3, 4]
    txn2, _ = other.begin(60.0)
    other.write_entries([new("T")], FOREVER, txn2)
    other.abort(txn2)
    assert kinds(other) == []
    del back


def test_a_transactions_own_write_that_expires_or_is_cancelled_is_no_change() -> None:
    clock = FakeClock()
    space = make(clock)
    txn, _ = space.begin(FOREVER)
    (short,), _ = space.write_entries([new("T", n=1)], 5.0, txn)
    (cancelled,), _ = space.write_entries([new("T", n=2)], FOREVER, txn)
    space.cancel(cancelled.id)
    clock.advance(6)
    space.reap()
    assert kinds(space) == []
    del short


def test_entries_put_back_after_a_cancelled_call_are_written_again() -> None:
    space = make()
    (grant,) = space.write([new("T")], FOREVER)
    taken = find(space, [tpl("T")], take=True)
    space.restore(taken)
    assert kinds(space) == [("write", grant.id), ("take", grant.id), ("write", grant.id)]
    again = find(space, [tpl("T")], take=True)
    space.restore(again, logged=False)  # a parked take's, not logged yet: nothing to say
    assert kinds(space, 3) == [("take", grant.id)]


def test_a_space_with_changes_off_has_no_log() -> None:
    space = make(changes=False)
    space.write([new("T")], FOREVER)
    assert space.changes is None


# ---------------------------------------------------------------- retention


def test_count_retention_drops_the_oldest_on_append() -> None:
    space = make(changes_max_count=3)
    for n in range(5):
        space.write([new("T", n=n)], FOREVER)
    assert seqs(space) == [3, 4, 5]
    assert space.changes is not None and space.changes.oldest == 3 and space.changes.count == 3


def test_bytes_retention_counts_each_change_as_its_size_plus_the_overhead() -> None:
    size = 100
    space = make(changes_max_bytes=3 * (size + CHANGE_OVERHEAD))
    for n in range(4):
        space.write([new("T", size=size, n=n)], FOREVER)
    assert seqs(space) == [2, 3, 4]
    assert space.changes is not None and space.changes.bytes == 3 * (size + CHANGE_OVERHEAD)
    space.write([new("T", size=size + 1)], FOREVER)
    assert seqs(space) == [4, 5]


def test_age_retention_trims_in_the_reapers_pass() -> None:
    clock = FakeClock()
    space = make(clock, changes_max_age=60.0)
    log = space.changes
    assert log is not None
    space.write([new("T", n=1)], FOREVER)
    clock.advance(30)
    space.write([new("T", n=2)], FOREVER)
    clock.advance(31)
    assert seqs(space) == [1, 2]  # not on append: in the reaper's pass
    assert log.trim(clock.time()) == 2
    assert seqs(space) == [2]
    assert log.trim(clock.time()) is None  # nothing moved
    clock.advance(30)
    assert log.trim(clock.time()) == 3
    assert seqs(space) == [] and log.head == 2 and log.oldest == 3


def test_positions_older_than_retention_are_compacted_and_ahead_of_the_head_invalid() -> None:
    space = make(changes_max_count=2)
    for n in range(5):
        space.write([new("T", n=n)], FOREVER)
    log = space.changes
    assert log is not None
    log.check(3)  # the oldest held is 4: after 3 is readable
    log.check(5)
    with pytest.raises(CompactedError) as compacted:
        log.check(2)
    assert compacted.value.oldest == 3 and compacted.value.epoch == log.epoch
    assert "since" in str(compacted.value)
    with pytest.raises(InvalidCursorError, match="ahead of the log's head 5"):
        log.check(6)
    assert [c.seq for c in log.after(3, 10)] == [4, 5]
    assert [c.seq for c in log.after(3, 1)] == [4]
    assert log.after(5, 10) == []


# ---------------------------------------------------------------- rewind, restore, epoch


def test_rewind_drops_the_changes_of_a_failed_batch() -> None:
    space = make()
    for n in range(4):
        space.write([new("T", n=n)], FOREVER)
    log = space.changes
    assert log is not None
    log.rewind(2)
    assert seqs(space) == [1, 2] and log.head == 2
    space.write([new("T")], FOREVER)
    assert seqs(space) == [1, 2, 3]


def test_rewind_past_what_count_retention_dropped_leaves_an_empty_log_at_that_head() -> None:
    space = make(changes_max_count=2)
    for n in range(4):
        space.write([new("T", n=n)], FOREVER)
    log = space.changes
    assert log is not None
    log.rewind(1)
    assert log.head == 1 and log.oldest == 2 and log.count == 0 and log.bytes == 0


def test_restore_keeps_epoch_head_and_changes_and_holds_nothing_across_a_gap() -> None:
    entry = StoredEntry(1, new("T"), None)
    log = ChangeLog(100, 60.0, 1 << 20)
    changes = [Change(seq, "write", entry, 0.0) for seq in (3, 4, 5)]
    log.restore(42, changes, 5)
    assert (log.epoch, log.head, log.oldest, log.count) == (42, 5, 3, 3)
    log.restore(42, [], 9)  # emptied by trimming: the head is kept
    assert (log.head, log.oldest, log.count) == (9, 10, 0)
    log.restore(42, [changes[0], changes[2]], 5)  # a gap: only after it
    assert [c.seq for c in log.after(0, 10)] == [5] and log.oldest == 5
    assert log.append("take", entry, 1.0).seq == 6


def test_every_log_gets_its_own_random_epoch() -> None:
    epochs = {ChangeLog(1, 1.0, 1).epoch for _ in range(20)}
    assert len(epochs) == 20 and all(0 < epoch < 1 << 63 for epoch in epochs)


# ---------------------------------------------------------------- durable subscriptions


def test_a_durable_subscription_is_made_once_attached_once_and_acked_forward() -> None:
    space = make()
    log = space.changes
    assert log is not None
    for n in range(3):
        space.write([new("T", n=n)], FOREVER)
    assert log.subscribe("billing", None) == (3, True)  # made at the head
    with pytest.raises(SubscriptionBusyError, match="'billing'"):
        log.subscribe("billing", 0)
    log.release("billing")
    assert log.subscribe("billing", 0) == (3, False)  # exists: its position, `since` ignored
    assert log.subscribe("audit", 1) == (1, True)
    assert log.ack("audit", 2) is True
    assert log.ack("audit", 1) is False  # older: no-op
    assert log.subscriptions == {"billing": 3, "audit": 2}
    with pytest.raises(InvalidCursorError):
        log.ack("audit", 4)
    with pytest.raises(SubscriptionNotFoundError, match="'nobody'"):
        log.ack("nobody", 1)
    assert log.unsubscribe("audit") == 2
    with pytest.raises(SubscriptionNotFoundError):
        log.unsubscribe("audit")


def test_a_durable_subscription_left_behind_by_retention_is_compacted_on_attach() -> None:
    space = make(changes_max_count=2)
    log = space.changes
    assert log is not None
    log.subscribe("slow", None)
    log.release("slow")
    for n in range(4):
        space.write([new("T", n=n)], FOREVER)
    with pytest.raises(CompactedError) as compacted:
        log.subscribe("slow", None)
    assert compacted.value.oldest == 2
    assert "slow" not in log.attached
    with pytest.raises(InvalidCursorError):
        log.subscribe("new", 9)


def test_describe_shows_the_logs_figures() -> None:
    space = make()
    space.write([new("T", size=10)], FOREVER)
    assert space.changes is not None
    space.changes.subscribe("b", None)
    space.changes.subscribe("a", 0)
    view = describe(space, Tally(space.declared_types()), 0.0, 10).changes
    assert view is not None
    assert (view.epoch, view.head, view.oldest, view.count, view.bytes) == (
        space.changes.epoch,
        1,
        1,
        1,
        10 + CHANGE_OVERHEAD,
    )
    assert list(view.subscriptions.items()) == [("a", 0), ("b", 1)]
    assert describe(make(changes=False), Tally({}), 0.0, 10).changes is None
