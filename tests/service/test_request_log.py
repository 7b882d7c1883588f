"""The request log (backends/memory/idempotency.py): a retry that arrives while the first call is
in flight waits for it, and learns whether it acted; a call nobody waits for makes no future."""

from __future__ import annotations

import asyncio
import gc

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from outrig.service.backends.memory.idempotency import Outcome, RequestLog
from outrig.service.engine.clock import FakeClock
from outrig.service.engine.model import LeaseGrant, NewEntry, StoredEntry
from outrig.service.engine.values import FieldValue
from outrig.service.exceptions import RequestConflictError


async def _retry_waits(settle: str) -> tuple[bool, bool]:
    """(whether the waiting retry was still waiting before the first call ended, what it learnt)."""
    log = RequestLog(60.0, FakeClock())
    first = log.begin("id-1", "default", "write")
    found = log.find("id-1", "default", "write")
    assert found is first
    done = found.done
    assert done is not None  # made now, by the retry that asks while the call is in flight
    waiting = asyncio.ensure_future(asyncio.shield(done))
    await asyncio.sleep(0)
    still_waiting = not waiting.done()
    if settle == "finish":
        log.finish(first, "leases")
    else:
        log.abandon(first)
    return still_waiting, await waiting


async def test_a_retry_waits_for_the_first_call_and_learns_it_acted() -> None:
    assert await _retry_waits("finish") == (True, True)


async def test_a_retry_learns_that_the_first_call_failed_without_acting() -> None:
    assert await _retry_waits("abandon") == (True, False)


async def test_a_call_nobody_waits_for_makes_no_future() -> None:
    log = RequestLog(60.0, FakeClock())
    outcome = log.begin("id-2", "default", "take")
    log.finish(outcome, ["entry"])
    # Asked once the call is over, it says so: nothing to wait for, the result is there.
    assert outcome.done is None
    found = log.find("id-2", "default", "take")
    assert found is not None and found.done is None and found.result == ["entry"]


async def test_forgetting_a_space_ends_its_waits() -> None:
    log = RequestLog(60.0, FakeClock())
    outcome = log.begin("id-3", "jobs", "write")
    done = outcome.done
    assert done is not None
    log.forget_space("jobs")
    assert done.done() and done.result() is False
    assert log.find("id-3", "jobs", "write") is None


def test_an_id_recovered_from_the_store_has_nothing_to_wait_for() -> None:
    log = RequestLog(60.0, FakeClock())
    log.restore("id-4", "default", "write", expires_at=2_000_000.0)
    found = log.find("id-4", "default", "write")
    assert isinstance(found, Outcome) and found.done is None


@pytest.mark.parametrize(
    ("kind", "result"),
    [
        ("write", [LeaseGrant(7, 1_000.5, 300.0), LeaseGrant(9, None, None)]),
        ("write", [LeaseGrant(7, 1_000.5, 300.0)]),  # one member: the pair's fast path
        ("write", [LeaseGrant(7, None, None), "not a grant"]),
        ("take", ["entry-1", "entry-2"]),
        ("deliver", (12, 1, None, None)),
        ("commit", None),
        ("take", []),
    ],
)
def test_a_retry_gets_the_result_the_first_call_returned(kind: str, result: object) -> None:
    log = RequestLog(60.0, FakeClock())
    log.finish(log.begin("id", "jobs", kind), result)
    found = log.find("id", "jobs", kind)
    assert found is not None and found.done is None
    assert found.result == result and type(found.result) is type(result)
    assert (found.space, found.kind) == ("jobs", kind)
    with pytest.raises(RequestConflictError):
        log.find("id", "other", kind)


def test_a_finished_write_leaves_nothing_for_the_collector_to_walk() -> None:
    log = RequestLog(60.0, FakeClock())
    for number in range(100):
        log.finish(log.begin(f"id-{number}", "jobs", "write"), [LeaseGrant(number, 1_000.0, 60.0)])
    gc.collect()  # untracks tuples of atomic values
    records = list(log._outcomes.values()) + list(log._order)
    assert len(records) == 200 and not any(gc.is_tracked(record) for record in records)


def test_an_id_abandoned_after_it_finished_is_forgotten() -> None:
    # A durable server under `interval`: the call answered (finish), then its batch failed.
    log = RequestLog(60.0, FakeClock())
    outcome = log.begin("id", "jobs", "write")
    log.finish(outcome, None)
    log.abandon(outcome, store_failed=True)
    assert log.find("id", "jobs", "write") is None and len(log) == 0


def test_an_abandoned_call_does_not_forget_a_later_call_with_its_id() -> None:
    log = RequestLog(60.0, FakeClock())
    first = log.begin("id", "jobs", "write")
    log.abandon(first)
    second = log.begin("id", "jobs", "write")
    log.finish(second, [LeaseGrant(1, None, None)])
    log.abandon(first)
    found = log.find("id", "jobs", "write")
    assert found is not None and found.result == [LeaseGrant(1, None, None)]


def test_ids_are_forgotten_once_their_window_has_passed() -> None:
    clock = FakeClock()
    log = RequestLog(60.0, clock)
    log.finish(log.begin("a", "jobs", "write"), [LeaseGrant(1, None, None)])
    clock.advance(30.0)
    log.restore("b", "jobs", "take", expires_at=clock.time() + 60.0)
    in_flight = log.begin("c", "jobs", "take")
    clock.advance(30.0)
    assert log.prune() == 1 and log.find("a", "jobs", "write") is None and len(log) == 2
    clock.advance(60.0)
    assert log.prune() == 2 and len(log) == 0
    log.finish(in_flight, ["late"])  # the window passed while it acted: nothing kept
    assert len(log) == 0


def test_forgetting_a_space_forgets_its_finished_ids_only() -> None:
    log = RequestLog(60.0, FakeClock())
    log.finish(log.begin("a", "jobs", "write"), [LeaseGrant(1, None, None)])
    log.finish(log.begin("b", "other", "write"), [LeaseGrant(2, None, None)])
    log.restore("c", "jobs", "take", expires_at=2_000_000.0)
    log.forget_space("jobs")
    assert log.find("a", "jobs", "write") is None and log.find("c", "jobs", "take") is None
    assert log.find("b", "other", "write") is not None


def _taken(number: int) -> StoredEntry:
    fields = {"n": FieldValue("int", number), "name": FieldValue("string", f"job-{number}")}
    return StoredEntry(number, NewEntry("Job", ("Task",), fields, b"payload-%d" % number, 12), None)


def test_a_take_s_retry_gets_its_entries_back_and_the_record_keeps_nothing_tracked() -> None:
    log = RequestLog(60.0, FakeClock())
    for number in range(100):
        log.finish(log.begin(f"id-{number}", "jobs", "take"), [_taken(number), _taken(number + 1_000)])
    # A collection untracks one level of tuples: the frozen entries, then the records holding them.
    gc.collect()
    gc.collect()
    records = list(log._outcomes.values()) + list(log._order)
    assert len(records) == 200 and not any(gc.is_tracked(record) for record in records)
    found = log.find("id-7", "jobs", "take")
    assert found is not None and [entry.__class__ for entry in found.result] == [StoredEntry] * 2
    assert [(entry.id, entry.payload, entry.lineage, dict(entry.fields)) for entry in found.result] == [
        (entry.id, entry.payload, entry.lineage, dict(entry.fields)) for entry in (_taken(7), _taken(1_007))
    ]


def _shown(result: list[object]) -> list[object]:
    """A result as a retry compares it: a taken entry by its attributes and fields."""
    return [
        (each.id, each.payload, each.lineage, dict(each.fields)) if isinstance(each, StoredEntry) else each
        for each in result
    ]


_MEMBERS = st.one_of(
    st.builds(
        LeaseGrant, st.integers(1, 1 << 40), st.none() | st.floats(0, 1e10), st.none() | st.floats(0, 1e6)
    ),
    st.builds(_taken, st.integers(0, 1 << 20)),
    st.integers(),
    st.text(max_size=5),
)


@settings(max_examples=200, deadline=None)
@given(result=st.lists(_MEMBERS, max_size=4))
def test_a_retry_gets_any_list_back_as_the_first_call_returned_it(result: list[object]) -> None:
    # lists of one member, of grants or entries only, and mixed lists take different forms
    log = RequestLog(60.0, FakeClock())
    log.finish(log.begin("id", "jobs", "take"), result)
    found = log.find("id", "jobs", "take")
    assert found is not None and found.result.__class__ is list
    assert [each.__class__ for each in found.result] == [each.__class__ for each in result]
    assert _shown(found.result) == _shown(result)
