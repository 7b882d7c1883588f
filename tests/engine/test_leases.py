"""LeaseQueue: due leases come out in bounded batches, soonest bucket first; moves and removals are
exact; any finite time can be filed. And the longest lease anyone may ask for."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from outrig.service.engine import FakeClock, NewEntry, SpaceEngine, SpaceSettings, Template
from outrig.service.engine.leases import MAX_LEASE_SECONDS, LeaseQueue, check_lease_duration
from outrig.service.exceptions import InvalidArgumentError

from .test_space import find


def test_empty_queue() -> None:
    queue = LeaseQueue()
    assert len(queue) == 0
    assert queue.next_expiry() is None
    assert queue.pop_due(1e18, 10) == []


def test_pop_due_returns_due_ids_soonest_first() -> None:
    queue = LeaseQueue(granularity=1.0)
    for lease_id, expires_at in {1: 30.0, 2: 10.0, 3: 20.5, 4: 50.0}.items():
        queue.add(lease_id, expires_at)
    assert queue.next_expiry() == 10.0
    assert queue.pop_due(30.0, 10) == [2, 3, 1]
    assert queue.pop_due(49.9, 10) == []
    assert queue.pop_due(50.0, 10) == [4]
    assert len(queue) == 0


def test_a_partly_due_bucket_gives_only_what_is_due() -> None:
    queue = LeaseQueue(granularity=10.0)
    queue.add(1, 101.0)
    queue.add(2, 105.0)
    queue.add(3, 109.0)
    assert queue.pop_due(105.0, 10) == [1, 2]
    assert len(queue) == 1
    assert queue.pop_due(108.9, 10) == []
    assert queue.pop_due(109.0, 10) == [3]


def test_pop_due_respects_the_limit_and_keeps_the_rest() -> None:
    queue = LeaseQueue()
    for lease_id in range(1, 11):
        queue.add(lease_id, 5.0)  # one bucket: a lease storm
    assert len(queue.pop_due(100.0, 3)) == 3
    assert len(queue.pop_due(100.0, 3)) == 3
    assert len(queue.pop_due(100.0, 100)) == 4
    assert len(queue) == 0


def test_discard_and_move() -> None:
    queue = LeaseQueue()
    queue.add(1, 5.0)
    queue.add(2, 5.0)
    queue.discard(1, 5.0)
    queue.discard(1, 5.0)  # twice: nothing more happens
    queue.discard(3, 5.0)  # never filed
    queue.discard(2, 6.0)  # filed at another time: not this one
    assert len(queue) == 1
    queue.discard(2, 5.0)
    queue.add(2, 8.0)  # renewed
    assert queue.pop_due(7.0, 10) == []
    assert queue.pop_due(8.0, 10) == [2]


def test_adding_the_same_lease_twice_counts_once() -> None:
    queue = LeaseQueue()
    queue.add(7, 3.0)
    queue.add(7, 3.0)
    assert len(queue) == 1
    assert queue.pop_due(3.0, 10) == [7]


def test_emptied_buckets_leave_nothing_behind() -> None:
    queue = LeaseQueue()
    for lease_id in range(1000):
        queue.add(lease_id, 1000.0 + lease_id)
        queue.discard(lease_id, 1000.0 + lease_id)  # write then take, over and over
    assert len(queue) == 0
    assert queue.next_expiry() is None
    assert queue.pop_due(1e9, 10) == []


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["add", "discard", "pop"]),
            st.integers(0, 20),
            st.floats(0, 50, allow_nan=False),
            st.integers(1, 5),
        ),
        max_size=60,
    ),
    st.sampled_from([0.1, 1.0, 7.0]),
)
def test_matches_a_naive_reference(ops: list[tuple[str, int, float, int]], granularity: float) -> None:
    queue = LeaseQueue(granularity)
    reference: dict[int, float] = {}
    for op, lease_id, time, limit in ops:
        if op == "add":
            if lease_id in reference:
                queue.discard(lease_id, reference[lease_id])
            queue.add(lease_id, time)
            reference[lease_id] = time
        elif op == "discard":
            if lease_id in reference:
                queue.discard(lease_id, reference.pop(lease_id))
        else:
            popped = queue.pop_due(time, limit)
            due = {i for i, t in reference.items() if t <= time}
            assert len(popped) == min(limit, len(due))
            assert set(popped) <= due
            for i in popped:
                del reference[i]
        assert len(queue) == len(reference)
    assert sorted(queue.pop_due(1e9, 1000)) == sorted(reference)


@pytest.mark.parametrize("granularity", [0.1, 1.0])
def test_next_expiry_is_never_after_the_soonest_lease(granularity: float) -> None:
    queue = LeaseQueue(granularity)
    queue.add(1, 12.34)
    queue.add(2, 99.0)
    first = queue.next_expiry()
    assert first is not None and first <= 12.34


# ---------------------------------------------------------------- any float (issue 17)


def test_a_time_beyond_any_bucket_is_filed_and_never_due_early() -> None:
    queue = LeaseQueue()
    queue.add(1, 1e308)  # 1e308 / 0.1 overflowed to inf, and math.floor(inf) raised
    queue.add(2, 5.0)
    assert len(queue) == 2
    assert queue.next_expiry() == 5.0
    assert queue.pop_due(1e300, 10) == [2]  # the far future's bucket is never due as a whole
    assert queue.next_expiry() == 1e308
    assert queue.pop_due(1e308, 10) == [1]
    queue.add(3, 1.7e308)
    queue.discard(3, 1.7e308)
    assert len(queue) == 0 and queue.next_expiry() is None


def test_a_time_before_any_bucket_is_due_at_once() -> None:
    queue = LeaseQueue()
    queue.add(1, -1e308)
    queue.add(2, -5.0)
    assert queue.next_expiry() == -1e308
    assert queue.pop_due(0.0, 10) == [1, 2]


@pytest.mark.parametrize("expires_at", [math.inf, -math.inf, math.nan])
def test_a_time_that_is_no_time_is_refused_before_anything_changes(expires_at: float) -> None:
    queue = LeaseQueue()
    queue.add(1, 5.0)
    with pytest.raises(ValueError, match="must be finite"):
        queue.add(2, expires_at)
    queue.discard(1, expires_at)  # never filed there: nothing happens
    assert len(queue) == 1
    assert queue.pop_due(10.0, 10) == [1]


@pytest.mark.parametrize("granularity", [0.0, -1.0, math.inf, math.nan])
def test_a_granularity_that_is_no_width_is_refused(granularity: float) -> None:
    with pytest.raises(ValueError, match="granularity"):
        LeaseQueue(granularity)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 10), st.floats(allow_nan=False, allow_infinity=False)), max_size=30),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([1e-300, 0.1, 7.0, 1e300]),
)
def test_any_finite_time_is_filed_and_comes_due_exactly(
    leases: list[tuple[int, float]], now: float, granularity: float
) -> None:
    queue = LeaseQueue(granularity)
    reference: dict[int, float] = {}
    for lease_id, expires_at in leases:
        if lease_id in reference:
            queue.discard(lease_id, reference[lease_id])
        queue.add(lease_id, expires_at)
        reference[lease_id] = expires_at
    assert len(queue) == len(reference)
    assert queue.next_expiry() == (min(reference.values()) if reference else None)
    assert sorted(queue.pop_due(now, 100)) == sorted(i for i, t in reference.items() if t <= now)
    assert sorted(queue.pop_due(math.inf, 100)) == sorted(i for i, t in reference.items() if t > now)


# ---------------------------------------------------------------- the longest lease (issue 17)


@pytest.mark.parametrize("seconds", [None, math.inf, 0.5, float(MAX_LEASE_SECONDS), MAX_LEASE_SECONDS])
def test_durations_up_to_the_maximum_and_forever_pass(seconds: float | None) -> None:
    check_lease_duration(seconds)


def test_a_finite_duration_beyond_the_maximum_is_refused_naming_the_field_and_the_limit() -> None:
    with pytest.raises(InvalidArgumentError) as refused:
        check_lease_duration(1e308)
    assert str(refused.value) == (
        "lease.seconds: 1e+308 exceeds the maximum of 3155760000 seconds (100 years); ask for FOREVER instead"
    )
    with pytest.raises(InvalidArgumentError, match=r"^duration\.seconds: 3155760000\.5 exceeds"):
        check_lease_duration(MAX_LEASE_SECONDS + 0.5, "duration")
    for nonsense in (math.nan, -math.inf):
        with pytest.raises(InvalidArgumentError, match=r"^lease\.seconds: must be a number"):
            check_lease_duration(nonsense)
    assert MAX_LEASE_SECONDS == 100 * 365.25 * 24 * 3600


def test_the_engine_refuses_it_everywhere_and_changes_nothing() -> None:
    clock = FakeClock()
    space = SpaceEngine("limits", SpaceSettings(), clock)
    entry = NewEntry("Task", (), {}, None, 1)
    with pytest.raises(InvalidArgumentError, match="exceeds the maximum"):
        space.write([entry], 1e308)
    assert space.statistics().entries == 0 and space.next_id == 1
    assert find(space, [Template("Task", {})], take=True) == []
    (grant,) = space.write([entry], 60.0)
    txn, _ = space.begin(60.0)
    registration, _ = space.register(
        (Template("Task", {}),), 60.0, lambda _sequence, _entry: None, lambda: None
    )
    for lease_id in (grant.id, txn.id, registration.seq):
        with pytest.raises(InvalidArgumentError, match=r"duration\.seconds"):
            space.renew(lease_id, 1e308)
        assert space.lease_expiry(lease_id) == clock.time() + 60
    with pytest.raises(InvalidArgumentError):
        space.begin(1e308)
    with pytest.raises(InvalidArgumentError):
        space.register((Template("Task", {}),), 1e308, lambda _sequence, _entry: None, lambda: None)
    with pytest.raises(InvalidArgumentError):
        space.write_entries([entry], MAX_LEASE_SECONDS + 1, txn)
    assert space.statistics().transactions == 1 and space.statistics().registrations == 1
    (longest,) = space.write([entry], MAX_LEASE_SECONDS)
    assert longest.granted == MAX_LEASE_SECONDS
    assert [s.id for s in find(space, [Template("Task", {})], take=True, max_entries=5)] == [
        grant.id,
        longest.id,
    ]
    assert find(space, [Template("Task", {})], take=True) == []
