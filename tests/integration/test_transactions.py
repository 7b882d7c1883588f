"""Transactions through the SDK, sync and async, against a real server process."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

import outrig
from outrig.testing import LocalServer

from ..polling import once_parked
from .entries import Task


@pytest.fixture
def space(server, space_name):
    with outrig.connect(server.address, space=space_name) as space:
        yield space


@pytest.fixture
def fake_clock_server() -> Iterator[LocalServer]:
    """An in-process server whose leases follow a clock the test moves (`server.clock.advance`)."""
    with LocalServer(fake_clock=True) as server:
        yield server


def test_a_block_commits_on_a_normal_exit_and_its_writes_appear_only_then(space):
    with space.transaction() as txn:
        txn.write(Task(job="a", n=1))
        txn.write_many([Task(job="a", n=2), Task(job="a", n=3)])
        assert txn.count(Task(job="a")) == 3
        assert space.count(Task(job="a")) == 0
        assert space.read_nowait(Task(job="a")) is None
        assert sorted(t.n for t in txn.contents(Task(job="a"))) == [1, 2, 3]
    assert space.count(Task(job="a")) == 3


def test_a_block_aborts_on_an_exception_and_puts_takes_back(space):
    space.write(Task(job="b", n=1))

    def work() -> None:
        with space.transaction() as txn:
            assert txn.take(Task(job="b")) == Task(job="b", n=1)
            txn.write(Task(job="b", n=2))
            assert space.read_nowait(Task(job="b")) is None  # taken: nobody sees it
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        work()
    assert [t.n for t in space.contents(Task(job="b"))] == [1]


def test_a_read_lock_lets_others_read_but_makes_their_take_wait(space, server):
    space.write(Task(job="c", n=1))
    txn = space.transaction()
    assert txn.read(Task(job="c")) == Task(job="c", n=1)
    assert space.read_nowait(Task(job="c")) == Task(job="c", n=1)
    assert space.take_nowait(Task(job="c")) is None  # read-locked by another
    committed = once_parked(server, space.name, txn.commit)
    assert space.take(Task(job="c"), timeout=10.0) == Task(job="c", n=1)  # once the lock goes
    returned = time.monotonic()
    assert returned >= committed.result()  # it waited, parked, until the commit began


def test_a_blocked_take_gets_a_transactions_write_when_it_commits(space, server):
    txn = space.transaction()
    txn.write(Task(job="d", n=1))
    committed = once_parked(server, space.name, txn.commit)
    assert space.take(Task(job="d"), timeout=10.0) == Task(job="d", n=1)
    committed.result()


def test_if_exists_waits_only_for_locked_entries(space, server):
    assert space.take_if_exists(Task(job="e"), lock_timeout=10.0) is None  # nothing locked: at once
    space.write(Task(job="e", n=1))
    txn = space.transaction()
    txn.take(Task(job="e"))
    assert space.read_nowait(Task(job="e")) is None  # no timeout: no wait
    aborted = once_parked(server, space.name, txn.abort)
    assert space.read_if_exists(Task(job="e"), lock_timeout=10.0) == Task(job="e", n=1)
    aborted.result()


def test_a_call_blocked_under_a_transaction_ends_when_the_transaction_does(space, server):
    txn = space.transaction()
    committed = once_parked(server, space.name, txn.commit)
    assert txn.take(Task(job="d2"), timeout=30.0) is None  # ended empty-handed by the commit
    committed.result()
    space.write(Task(job="d2", n=1))
    assert space.count(Task(job="d2")) == 1  # and nothing was taken for it afterwards


def test_two_transactions_never_take_the_same_entry(space):
    space.write_many([Task(job="f", n=i) for i in range(20)])
    first, second = space.transaction(), space.transaction()
    taken = [first.take_nowait(Task(job="f")) for _ in range(10)] + [
        second.take_nowait(Task(job="f")) for _ in range(10)
    ]
    assert len({t.n for t in taken if t is not None}) == 20
    assert first.take_nowait(Task(job="f")) is None
    first.commit()
    second.abort()
    assert sorted(t.n for t in space.contents(Task(job="f"))) == sorted(t.n for t in taken[10:])


def test_notify_hears_committed_writes_and_a_transactions_own(space):
    with space.notify(Task(job="g"), lease=30.0) as outside:
        txn = space.transaction()
        with txn.notify(Task(job="g"), lease=30.0) as inside:
            txn.write(Task(job="g", n=1))
            assert next(inside).entry == Task(job="g", n=1)  # its own write, at once
            aborted = space.transaction()
            aborted.write(Task(job="g", n=2))
            aborted.abort()
            txn.commit()
            assert list(inside) == []  # a registration under a transaction ends with it
        assert next(outside).entry == Task(job="g", n=1)  # committed: now; the aborted write never
        space.write(Task(job="g", n=3))
        assert next(outside).entry == Task(job="g", n=3)


def test_a_transaction_whose_lease_runs_out_aborts(fake_clock_server):
    with outrig.connect(fake_clock_server.address) as space:
        space.write(Task(job="h", n=1))
        txn = space.transaction(lease=0.5)
        txn.take(Task(job="h"))
        fake_clock_server.clock.advance(0.6)  # the lease runs out; the reaper (every 50 ms) aborts it
        assert space.take(Task(job="h"), timeout=10.0) == Task(job="h", n=1)  # back once it expired
        with pytest.raises(outrig.FailedPreconditionError, match="aborted"):
            txn.commit()


def test_renew_keeps_a_transaction_alive(fake_clock_server):
    with outrig.connect(fake_clock_server.address) as space:
        txn = space.transaction(lease=1.0)
        assert txn.renew(30.0).duration == 30.0
        # Past the first lease: a transaction that had run out would be refused at its next use.
        fake_clock_server.clock.advance(1.3)
        txn.write(Task(job="i", n=1))
        txn.commit()
        assert space.count(Task(job="i")) == 1


def test_commit_and_abort_are_safe_to_repeat_but_not_to_mix(space):
    txn = space.transaction()
    txn.commit()
    txn.commit()  # a retry of a commit that happened: OK
    with pytest.raises(outrig.FailedPreconditionError, match="committed"):
        txn.abort()
    other = space.transaction()
    other.abort()
    other.abort()
    with pytest.raises(outrig.FailedPreconditionError, match="aborted"):
        other.commit()


def test_unknown_transactions_and_other_spaces_are_not_found(space):
    txn = space.transaction()
    with pytest.raises(outrig.NotFoundError, match="transaction"):
        txn._under.with_space(space.name + "-other").write(Task(job="j"))
    with pytest.raises(outrig.NotFoundError, match="transaction"):
        space._under(123456789).write(Task(job="j"))
    txn.abort()


async def test_the_async_twin(server, space_name):
    async with outrig.aio.connect(server.address, space=space_name) as space:
        async with space.transaction() as txn:
            await txn.write(Task(job="k", n=1))
            assert await txn.read_nowait(Task(job="k")) == Task(job="k", n=1)
            assert await space.read_nowait(Task(job="k")) is None
        assert await space.count(Task(job="k")) == 1

        async def work() -> None:
            async with space.transaction() as txn:
                await txn.take(Task(job="k"))
                raise RuntimeError("boom")

        with pytest.raises(RuntimeError, match="boom"):
            await work()
        assert await space.count(Task(job="k")) == 1
        txn = await space.transaction(lease=10.0)
        assert await txn.take_nowait(Task(job="k")) == Task(job="k", n=1)
        assert [entry async for entry in txn.contents(Task(job="k"))] == []
        await txn.commit()
        assert await space.count(Task(job="k")) == 0


# ---------------------------------------------------------------- the lock table, through the SDK

LOCKS = ["write-locked", "take-locked", "read-locked", "read-locked twice"]


def _locked(space, lock: str):
    """An entry Task(job="t") under `lock` by a holder transaction (and a second reader)."""
    holder = space.transaction()
    others: list[outrig.Transaction] = []
    if lock == "write-locked":
        holder.write(Task(job="t", n=1))
        return holder, others
    space.write(Task(job="t", n=1))
    if lock == "take-locked":
        assert holder.take_nowait(Task(job="t")) is not None
    else:
        assert holder.read_nowait(Task(job="t")) is not None
    if lock == "read-locked twice":
        others.append(space.transaction())
        assert others[0].read_nowait(Task(job="t")) is not None
    return holder, others


# lock -> (read by holder, take by holder, read by another, take by another): True when it gets the entry
TABLE = {
    "write-locked": (True, True, False, False),
    "take-locked": (False, False, False, False),
    "read-locked": (True, True, True, False),
    "read-locked twice": (True, False, True, False),
}


@pytest.mark.parametrize("lock", LOCKS)
@pytest.mark.parametrize("asker", ["holder", "other transaction", "no transaction"])
@pytest.mark.parametrize("operation", ["read_nowait", "take_nowait"])
def test_the_lock_table_through_the_sdk(space, lock, asker, operation):
    holder, others = _locked(space, lock)
    expected = TABLE[lock][(0 if asker == "holder" else 2) + (operation == "take_nowait")]
    who = {"holder": holder, "other transaction": space.transaction(), "no transaction": space}[asker]
    got = getattr(who, operation)(Task(job="t"))
    assert (got is not None) == expected, f"{operation} by {asker} of a {lock} entry"
    for txn in [holder, *others]:
        txn.abort()
