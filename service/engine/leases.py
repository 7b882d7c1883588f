"""Lease expiry: a heap of (expires_at, id), O(log n) per lease, popped in bounded batches.

Renewals push a fresh item and leave the old one behind; takes and cancels leave theirs too.
Popped items whose id is gone or whose expiry moved are skipped, and when stale items outnumber
live ones the heap is rebuilt, so churn with long leases does not grow it without bound.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable

_MIN_REBUILD = 1024


class LeaseQueue:
    """Expiry times of leased things (entries, registrations), soonest first."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int]] = []

    def __len__(self) -> int:
        return len(self._heap)

    def push(self, expires_at: float, lease_id: int) -> None:
        heapq.heappush(self._heap, (expires_at, lease_id))

    def next_expiry(self) -> float | None:
        return self._heap[0][0] if self._heap else None

    def pop_due(self, now: float, limit: int, current: Callable[[int], float | None]) -> list[int]:
        """Pop up to `limit` ids whose lease ran out by `now`.

        `current(id)` gives the id's present expiry (None if it is gone or has none); items that
        no longer agree with it are stale and dropped.
        """
        due: list[int] = []
        heap = self._heap
        while heap and heap[0][0] <= now and len(due) < limit:
            expires_at, lease_id = heapq.heappop(heap)
            if current(lease_id) == expires_at:
                due.append(lease_id)
        return due

    def compact(self, live: dict[int, float]) -> None:
        """Rebuild from the live expiries when stale items are more than half the heap."""
        if len(self._heap) > max(_MIN_REBUILD, 2 * len(live)):
            self._heap = [(expires_at, lease_id) for lease_id, expires_at in live.items()]
            heapq.heapify(self._heap)
