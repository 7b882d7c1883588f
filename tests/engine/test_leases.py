"""LeaseQueue: soonest first, stale items skipped, bounded batches, compaction keeps the live ones."""

from __future__ import annotations

from outrig.service.engine.leases import LeaseQueue


def test_empty_queue() -> None:
    queue = LeaseQueue()
    assert len(queue) == 0
    assert queue.next_expiry() is None
    assert queue.pop_due(1e18, 10, lambda _: 0.0) == []


def test_pop_due_returns_due_ids_soonest_first() -> None:
    queue = LeaseQueue()
    live = {1: 30.0, 2: 10.0, 3: 20.0, 4: 50.0}
    for lease_id, expires_at in live.items():
        queue.push(expires_at, lease_id)
    assert queue.next_expiry() == 10.0
    assert queue.pop_due(30.0, 10, live.get) == [2, 3, 1]
    assert queue.next_expiry() == 50.0
    assert queue.pop_due(49.0, 10, live.get) == []
    assert queue.pop_due(50.0, 10, live.get) == [4]


def test_pop_due_respects_the_limit_and_keeps_the_rest() -> None:
    queue = LeaseQueue()
    live = {i: float(i) for i in range(1, 11)}
    for lease_id, expires_at in live.items():
        queue.push(expires_at, lease_id)
    assert queue.pop_due(100.0, 3, live.get) == [1, 2, 3]
    assert queue.pop_due(100.0, 3, live.get) == [4, 5, 6]
    assert queue.pop_due(100.0, 100, live.get) == [7, 8, 9, 10]


def test_stale_items_are_skipped_and_do_not_count_against_the_limit() -> None:
    queue = LeaseQueue()
    current: dict[int, float] = {}
    for lease_id in range(1, 6):
        queue.push(1.0, lease_id)
        current[lease_id] = 1.0
    # Renewed: the old item is stale, the new one is live.
    current[1] = 8.0
    queue.push(8.0, 1)
    # Gone (taken, cancelled): no current expiry at all.
    del current[2]
    del current[3]
    assert queue.pop_due(5.0, 2, current.get) == [4, 5]
    assert queue.pop_due(7.9, 10, current.get) == []
    assert queue.pop_due(8.0, 10, current.get) == [1]
    assert len(queue) == 0


def test_an_item_due_twice_at_the_same_time_is_returned_once() -> None:
    queue = LeaseQueue()
    queue.push(3.0, 7)
    queue.push(3.0, 7)  # renewed to the same instant
    current = {7: 3.0}

    def once(lease_id: int) -> float | None:
        return current.pop(lease_id, None)

    assert queue.pop_due(3.0, 10, once) == [7]


def test_compact_does_nothing_while_the_heap_is_small() -> None:
    queue = LeaseQueue()
    for lease_id in range(100):
        queue.push(float(lease_id), lease_id)
    queue.compact({})
    assert len(queue) == 100


def test_compact_rebuilds_from_live_leases_when_stale_items_dominate() -> None:
    queue = LeaseQueue()
    for lease_id in range(3000):
        queue.push(1000.0 + lease_id, lease_id)
    live = {5: 1005.0, 2999: 3999.0, 42: 1.0}  # 42 was renewed to a sooner time
    queue.compact(live)
    assert len(queue) == 3
    assert queue.next_expiry() == 1.0
    assert queue.pop_due(1e9, 10, live.get) == [42, 5, 2999]


def test_compact_keeps_everything_when_most_items_are_live() -> None:
    queue = LeaseQueue()
    live = {lease_id: float(lease_id) for lease_id in range(2000)}
    for lease_id, expires_at in live.items():
        queue.push(expires_at, lease_id)
    for lease_id in range(500):  # a quarter stale
        del live[lease_id]
    queue.compact(live)
    assert len(queue) == 2000
    assert queue.pop_due(1e9, 10_000, live.get) == list(range(500, 2000))
