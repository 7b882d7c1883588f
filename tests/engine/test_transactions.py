"""Transactions in the engine: the lock table case by case, visibility, commit and abort,
waiters and notify under locks, and leases."""

from __future__ import annotations

import pytest

from outrig.service.engine import FakeClock, SpaceEngine, StoredEntry, Waiter
from outrig.service.engine.locks import CONFLICT, HIDDEN, OK, EntryLock, read_access, take_access
from outrig.service.engine.model import NewEntry, Transaction, TransactionOutcome, TransactionState
from outrig.service.engine.space import FOREVER
from outrig.service.exceptions import LeaseNotFoundError, TransactionNotFoundError

from .test_space import contents, find, ids, make, new, tpl

# ---------------------------------------------------------------- the lock table, case by case

HOLDER = Transaction(1, None)
OTHER = Transaction(2, None)
THIRD = Transaction(3, None)


def _lock(*, writer: Transaction | None = None, taker: Transaction | None = None, readers=()) -> EntryLock:
    lock = EntryLock()
    lock.writer, lock.taker, lock.readers = writer, taker, set(readers)
    return lock


@pytest.mark.parametrize(
    ("lock", "asker", "read", "take"),
    [
        # write-locked: only the writer sees it
        (_lock(writer=HOLDER), HOLDER, OK, OK),
        (_lock(writer=HOLDER), OTHER, CONFLICT, CONFLICT),
        (_lock(writer=HOLDER), None, CONFLICT, CONFLICT),
        # take-locked: nobody sees it, the taker included; others may see it again on abort
        (_lock(taker=HOLDER), HOLDER, HIDDEN, HIDDEN),
        (_lock(taker=HOLDER), OTHER, CONFLICT, CONFLICT),
        (_lock(taker=HOLDER), None, CONFLICT, CONFLICT),
        # read-locked: anyone reads; a take only by the sole reader
        (_lock(readers=[HOLDER]), HOLDER, OK, OK),
        (_lock(readers=[HOLDER]), OTHER, OK, CONFLICT),
        (_lock(readers=[HOLDER]), None, OK, CONFLICT),
        (_lock(readers=[HOLDER, OTHER]), HOLDER, OK, CONFLICT),
        (_lock(readers=[HOLDER, OTHER]), THIRD, OK, CONFLICT),
    ],
)
def test_the_lock_table(lock: EntryLock, asker: Transaction | None, read: int, take: int) -> None:
    assert read_access(lock, asker) == read
    assert take_access(lock, asker) == take


# ---------------------------------------------------------------- visibility


def test_a_write_is_invisible_outside_its_transaction_until_commit() -> None:
    space = make()
    txn, _ = space.begin(60.0)
    written, _ = space.write_entries([new("T", n=1)], FOREVER, txn)
    assert ids(find(space, [tpl("T")], take=False, txn=txn)) == ids(written)  # its own write
    assert space.find_or_conflict([tpl("T")], take=False) == ([], True)  # others: a conflict
    assert space.find_or_conflict([tpl("T")], take=True) == ([], True)
    other, _ = space.begin(60.0)
    assert space.find_or_conflict([tpl("T")], take=False, txn=other) == ([], True)
    assert space.count([tpl("T")]) == 0
    assert space.count([tpl("T")], txn) == 1
    space.commit(txn)
    assert ids(find(space, [tpl("T")], take=True)) == ids(written)


def test_a_write_taken_back_in_its_transaction_never_shows() -> None:
    space = make()
    events: list[int] = []
    space.register((tpl("T"),), FOREVER, lambda seq, stored: events.append(stored.id), lambda: None)
    txn, _ = space.begin(60.0)
    space.write_entries([new("T", n=1)], FOREVER, txn)
    assert len(find(space, [tpl("T")], take=True, txn=txn)) == 1
    outcome = space.commit(txn)
    assert outcome.written == [] and outcome.taken == []
    assert space.count([tpl("T")]) == 0 and space.statistics().entries == 0
    assert events == []  # never visible, so no event
    assert space.statistics().locked == 0


def test_a_read_lock_lets_others_read_but_not_take() -> None:
    space = make()
    (entry_id,) = ids(space.write_entries([new("T", n=1)], FOREVER)[0])
    reader, _ = space.begin(60.0)
    other, _ = space.begin(60.0)
    assert ids(find(space, [tpl("T")], take=False, txn=reader)) == [entry_id]
    assert ids(find(space, [tpl("T")], take=False)) == [entry_id]  # others may read
    assert ids(find(space, [tpl("T")], take=False, txn=other)) == [entry_id]
    assert space.find_or_conflict([tpl("T")], take=True) == ([], True)  # but not take
    # Two readers now: neither may take it.
    assert space.find_or_conflict([tpl("T")], take=True, txn=reader) == ([], True)
    space.commit(other)
    assert ids(find(space, [tpl("T")], take=True, txn=reader)) == [entry_id]  # the sole reader may
    space.commit(reader)
    assert space.statistics().entries == 0


def test_a_take_lock_hides_the_entry_and_abort_puts_it_back_in_its_place() -> None:
    space = make()
    first, second = (s.id for s in space.write_entries([new("T", n=1), new("T", n=2)], FOREVER)[0])
    txn, _ = space.begin(60.0)
    assert ids(find(space, [tpl("T")], take=True, txn=txn)) == [first]
    assert space.find_or_conflict([tpl("T")], take=False, txn=txn) == ([space._entries[second]], False)
    assert ids(find(space, [tpl("T")], take=False)) == [second]  # others skip it...
    assert space.find_or_conflict([tpl("T", n=1)], take=False) == ([], True)  # ...as a conflict
    assert space.count([tpl("T")]) == 1
    outcome = space.abort(txn)
    assert ids(outcome.taken) == [first]
    assert ids(find(space, [tpl("T")], take=False)) == [first]  # back, still the oldest


def test_commit_makes_takes_final() -> None:
    space = make()
    written, _ = space.write_entries([new("T", n=1)], FOREVER)
    txn, _ = space.begin(60.0)
    find(space, [tpl("T")], take=True, txn=txn)
    outcome = space.commit(txn)
    assert ids(outcome.taken) == ids(written)
    assert space.statistics().entries == 0 and space.statistics().locked == 0


def test_abort_discards_writes() -> None:
    space = make()
    txn, _ = space.begin(60.0)
    space.write_entries([new("T", n=1)], FOREVER, txn)
    assert space.statistics().entries == 1  # it occupies the space meanwhile (quotas count it)
    space.abort(txn)
    assert space.statistics().entries == 0 and space.statistics().locked == 0


def test_contents_under_a_transaction_sees_its_writes_and_not_its_takes() -> None:
    space = make()
    kept, gone = space.write_entries([new("T", n=1), new("T", n=2)], FOREVER)[0]
    txn, _ = space.begin(60.0)
    find(space, [tpl("T", n=2)], take=True, txn=txn)
    (mine,) = space.write_entries([new("T", n=3)], FOREVER, txn)[0]
    assert ids(contents(space, [tpl("T")], txn=txn)) == [kept.id, mine.id]
    assert kept.lock is not None and kept.lock.readers == {txn}  # what a transaction lists, it has read
    assert ids(contents(space, [tpl("T")])) == [kept.id]
    assert gone.lock is not None and gone.lock.taker is txn


# ---------------------------------------------------------------- waiters and notify


def _park(space: SpaceEngine, *, take: bool, txn: Transaction | None = None, if_exists: bool = False):
    got: list[list[StoredEntry]] = []

    def deliver(entries: list[StoredEntry]) -> bool:
        got.append(entries)
        return True

    waiter = Waiter(space.new_waiter_seq(), (tpl("T"),), take, deliver, txn=txn, if_exists=if_exists)
    space.park(waiter)
    return got


def test_a_blocked_take_gets_a_transactions_write_at_commit() -> None:
    space = make()
    got = _park(space, take=True)
    txn, _ = space.begin(60.0)
    space.write_entries([new("T", n=1)], FOREVER, txn)
    assert got == []  # invisible to it until commit
    space.commit(txn)
    assert len(got) == 1 and len(got[0]) == 1
    assert space.statistics().entries == 0  # the plain take removed it


def test_a_blocked_take_gets_an_entry_back_when_its_taker_aborts() -> None:
    space = make()
    space.write_entries([new("T", n=1)], FOREVER)
    txn, _ = space.begin(60.0)
    find(space, [tpl("T")], take=True, txn=txn)
    got = _park(space, take=True)
    space.abort(txn)
    assert len(got) == 1
    assert space.statistics().entries == 0


def test_a_blocked_take_waits_for_a_read_lock_to_go() -> None:
    space = make()
    space.write_entries([new("T", n=1)], FOREVER)
    txn, _ = space.begin(60.0)
    find(space, [tpl("T")], take=False, txn=txn)
    got = _park(space, take=True)
    assert got == []
    space.commit(txn)
    assert len(got) == 1


def test_a_waiter_under_a_transaction_locks_what_it_is_handed() -> None:
    space = make()
    txn, _ = space.begin(60.0)
    got = _park(space, take=True, txn=txn)
    (stored,) = space.write_entries([new("T", n=1)], FOREVER)[0]
    assert [ids(x) for x in got] == [[stored.id]]
    assert stored.lock is not None and stored.lock.taker is txn
    assert space.count([tpl("T")]) == 0
    space.abort(txn)
    assert space.count([tpl("T")]) == 1


def test_an_if_exists_waiter_ends_empty_when_nothing_locked_is_left() -> None:
    space = make()
    txn, _ = space.begin(60.0)
    space.write_entries([new("T", n=1)], FOREVER, txn)
    got = _park(space, take=True, if_exists=True)
    space.abort(txn)  # the write is gone: nothing to wait for
    assert got == [[]]
    assert space.waiting == 0


def test_an_if_exists_waiter_gets_the_entry_when_the_lock_holder_commits() -> None:
    space = make()
    txn, _ = space.begin(60.0)
    (stored,) = space.write_entries([new("T", n=1)], FOREVER, txn)[0]
    got = _park(space, take=True, if_exists=True)
    space.commit(txn)
    assert [ids(x) for x in got] == [[stored.id]]


def test_notify_hears_committed_writes_and_a_transactions_own_registration_its_writes() -> None:
    space = make()
    outside: list[int] = []
    inside: list[int] = []
    space.register((tpl("T"),), FOREVER, lambda seq, s: outside.append(s.id), lambda: None)
    txn, _ = space.begin(60.0)
    ended: list[bool] = []
    space.register((tpl("T"),), FOREVER, lambda seq, s: inside.append(s.id), lambda: ended.append(True), txn)
    (stored,) = space.write_entries([new("T", n=1)], FOREVER, txn)[0]
    assert inside == [stored.id] and outside == []
    aborted, _ = space.begin(60.0)
    space.write_entries([new("T", n=2)], FOREVER, aborted)
    space.abort(aborted)
    space.commit(txn)
    assert outside == [stored.id]  # at commit, once; the aborted write never
    assert ended == [True]  # a registration under a transaction ends with it
    assert space.registered == 1


# ---------------------------------------------------------------- leases and ended transactions


def test_a_transaction_aborts_when_its_lease_runs_out() -> None:
    clock = FakeClock()
    space = make(clock)
    space.write_entries([new("T", n=1)], FOREVER)
    txn, grant = space.begin(5.0)
    assert grant.id == txn.id and grant.granted == 5.0
    find(space, [tpl("T")], take=True, txn=txn)
    outcomes: list[TransactionOutcome] = []
    space.on_transaction_end = outcomes.append
    clock.advance(6.0)
    space.reap()
    assert txn.state is TransactionState.ABORTED and len(outcomes) == 1
    assert space.count([tpl("T")]) == 1
    with pytest.raises(TransactionNotFoundError, match="unknown or has ended"):
        space.transaction(txn.id)


def test_renew_and_cancel_work_on_a_transactions_lease() -> None:
    clock = FakeClock()
    space = make(clock)
    txn, _ = space.begin(5.0)
    space.renew(txn.id, 60.0)
    assert space.lease_expiry(txn.id) == clock.time() + 60.0
    clock.advance(10.0)
    space.reap()
    assert txn.active
    space.cancel(txn.id)  # cancelling a transaction's lease aborts it
    assert txn.state is TransactionState.ABORTED
    with pytest.raises(LeaseNotFoundError):
        space.renew(txn.id, 60.0)


def test_an_ended_transaction_refuses_everything() -> None:
    space = make()
    txn, _ = space.begin(60.0)
    space.commit(txn)
    for call in (
        lambda: space.write_entries([new("T", n=1)], FOREVER, txn),
        lambda: find(space, [tpl("T")], take=False, txn=txn),
        lambda: space.commit(txn),
        lambda: space.abort(txn),
    ):
        with pytest.raises(TransactionNotFoundError):
            call()


def test_an_entry_whose_lease_ends_while_take_locked_is_not_put_back() -> None:
    clock = FakeClock()
    space = make(clock)
    space.write_entries([new("T", n=1)], 5.0)
    txn, _ = space.begin(60.0)
    find(space, [tpl("T")], take=True, txn=txn)
    clock.advance(6.0)
    space.reap()
    assert space.abort(txn).taken == []
    assert space.count([tpl("T")]) == 0 and space.statistics().locked == 0


def test_a_transactions_blocked_calls_end_with_it() -> None:
    space = make()
    txn, _ = space.begin(60.0)
    got = _park(space, take=True, txn=txn)
    space.commit(txn)
    assert got == [[]] and space.waiting == 0
    space.write_entries([new("T", n=1)], FOREVER)  # nothing is handed to (and locked for) it later
    assert space.count([tpl("T")]) == 1 and space.statistics().locked == 0


def test_a_transaction_past_its_lease_is_aborted_when_next_asked_for() -> None:
    clock = FakeClock()
    space = make(clock)
    txn, _ = space.begin(5.0)
    ended: list[TransactionOutcome] = []
    space.on_transaction_end = ended.append
    clock.advance(6.0)  # no reaper pass yet
    with pytest.raises(TransactionNotFoundError):
        space.transaction(txn.id)
    assert txn.state is TransactionState.ABORTED and len(ended) == 1


def _rebuilt(
    space: SpaceEngine, transactions: list[Transaction]
) -> tuple[SpaceEngine, dict[int, Transaction]]:
    """A copy of `space` made as a new owner makes it from the store: every entry loaded, then
    each transaction restored with the holds `held_by` reports on it."""
    copy = make(space._clock)  # type: ignore[arg-type]
    for stored in sorted(space._entries.values(), key=lambda s: s.arrival):
        loaded = NewEntry(stored.lineage[0], stored.lineage[1:], stored.fields, stored.payload, stored.size)
        copy.load(stored.id, stored.arrival, loaded, stored.expires_at)
    rebuilt = {txn.id: copy.restore_transaction(txn.id, txn.expires_at) for txn in transactions}
    for txn in transactions:
        for stored in space._entries.values():
            held = space.held_by(txn, stored)
            if held is not None:
                assert copy.restore_lock(rebuilt[txn.id], stored.id, held)
    return copy, rebuilt


def test_a_transaction_rebuilt_from_its_holds_sees_and_ends_as_the_original() -> None:
    space = make()
    taken, read, free = space.write_entries([new("T", n=1), new("T", n=2), new("T", n=3)], FOREVER)[0]
    txn, _ = space.begin(60.0)
    other, _ = space.begin(30.0)
    (written,) = space.write_entries([new("T", n=4)], FOREVER, txn)[0]
    assert ids(find(space, [tpl("T", n=1)], take=True, txn=txn)) == [taken.id]
    assert ids(find(space, [tpl("T", n=2)], take=False, txn=txn)) == [read.id]
    assert ids(find(space, [tpl("T", n=2)], take=False, txn=other)) == [read.id]
    assert [space.held_by(txn, s) for s in (taken, read, free, written)] == ["take", "read", None, "write"]
    copy, rebuilt = _rebuilt(space, [txn, other])
    assert copy.lease_expiry(txn.id) == txn.expires_at and copy.next_id >= space.next_id
    for engine, mine, theirs in ((space, txn, other), (copy, rebuilt[txn.id], rebuilt[other.id])):
        assert ids(find(engine, [tpl("T")], take=False, max_entries=9)) == [read.id, free.id]
        assert engine.find_or_conflict([tpl("T", n=2)], take=True) == ([], True)  # two readers
        assert sorted(ids(find(engine, [tpl("T")], take=False, max_entries=9, txn=mine))) == sorted(
            [read.id, free.id, written.id]
        )
        assert engine.count([tpl("T")], theirs) == 2
    outcome = copy.commit(rebuilt[txn.id])
    assert ids(outcome.taken) == [taken.id] and ids(outcome.written) == [written.id]
    copy.abort(rebuilt[other.id])
    assert ids(find(copy, [tpl("T")], take=True, max_entries=9)) == [read.id, free.id, written.id]


def test_a_hold_that_another_excludes_is_not_restored() -> None:
    space = make()
    (stored,) = space.write_entries([new("T", n=1)], FOREVER)[0]
    first = space.restore_transaction(100, None)
    second = space.restore_transaction(101, None)
    assert space.restore_lock(first, stored.id, "take")
    assert not space.restore_lock(second, stored.id, "take")
    assert not space.restore_lock(second, stored.id, "read")
    assert not space.restore_lock(second, stored.id, "write")
    assert not space.restore_lock(second, 999, "read")  # not in the space (expired meanwhile)
    assert space.next_id > 101  # a restored id is never handed out again
    space.abort(second)
    assert ids(space.commit(first).taken) == [stored.id]


def test_own_writes_taken_back_are_given_back_to_their_transaction() -> None:
    space = make()
    txn, _ = space.begin(60.0)
    (written,) = space.write_entries([new("T", n=1)], FOREVER, txn)[0]
    (back,) = find(space, [tpl("T")], take=True, txn=txn)
    assert space.held_by(txn, back) is None and space.statistics().entries == 0
    space.rewrite(txn, [back])
    assert space.held_by(txn, back) == "write"
    assert ids(find(space, [tpl("T")], take=False, txn=txn)) == [written.id]
    assert find(space, [tpl("T")], take=False) == []
    assert ids(space.commit(txn).written) == [written.id]
