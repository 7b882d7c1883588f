"""LeaseQueue: due leases come out in bounded batches, soonest bucket first; moves and removals are exact."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from outrig.service.engine.leases import LeaseQueue


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
