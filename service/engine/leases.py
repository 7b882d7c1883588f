"""Lease expiry without stalls: leases filed in time buckets, expired in bounded batches.

Each lease is filed in the bucket of its expiry time (`granularity` seconds wide): filing, moving
(renew) and removing (take, cancel) are O(1) dict operations, so nothing stale piles up and no
rebuild ever stops the loop. A heap holds the bucket numbers in use, so finding the next due
bucket is O(log b) in the number of buckets. `pop_due` returns at most `limit` ids per call, and
the caller yields between calls: a mass expiry ("lease storm") is spread over many small steps.
"""

from __future__ import annotations

import heapq
import itertools
import math


class LeaseQueue:
    """Expiry times of leased things (entries, registrations), by id."""

    def __init__(self, granularity: float = 0.1) -> None:
        self._granularity = granularity
        self._buckets: dict[int, dict[int, float]] = {}
        self._heap: list[int] = []  # bucket numbers; each one at most once
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def _bucket_of(self, expires_at: float) -> int:
        return math.floor(expires_at / self._granularity)

    def add(self, lease_id: int, expires_at: float) -> None:
        number = self._bucket_of(expires_at)
        bucket = self._buckets.get(number)
        if bucket is None:
            bucket = self._buckets[number] = {}
            heapq.heappush(self._heap, number)
        if lease_id not in bucket:
            self._count += 1
        bucket[lease_id] = expires_at

    def discard(self, lease_id: int, expires_at: float) -> None:
        """Forget a lease filed at `expires_at` (doing nothing if it is not there)."""
        number = self._bucket_of(expires_at)
        bucket = self._buckets.get(number)
        if bucket is not None and bucket.pop(lease_id, None) is not None:
            self._count -= 1
            if not bucket:
                del self._buckets[number]  # its heap item is dropped when it comes up

    def _first_bucket(self) -> tuple[int, dict[int, float]] | None:
        heap = self._heap
        while heap:
            bucket = self._buckets.get(heap[0])
            if bucket is not None:
                return heap[0], bucket
            heapq.heappop(heap)
        return None

    def next_expiry(self) -> float | None:
        """A time at or before the soonest expiry, or None when nothing is leased."""
        first = self._first_bucket()
        return None if first is None else first[0] * self._granularity

    def pop_due(self, now: float, limit: int) -> list[int]:
        """Remove and return up to `limit` ids whose lease ran out by `now`, soonest bucket first."""
        due: list[int] = []
        while len(due) < limit:
            first = self._first_bucket()
            if first is None or first[0] * self._granularity > now:
                break
            number, bucket = first
            whole = (number + 1) * self._granularity <= now
            expired = bucket if whole else {i: t for i, t in bucket.items() if t <= now}
            taken = sorted(itertools.islice(expired.items(), limit - len(due)), key=lambda item: item[1])
            for lease_id, _ in taken:
                del bucket[lease_id]
            self._count -= len(taken)
            due.extend(lease_id for lease_id, _ in taken)
            if not bucket:
                del self._buckets[number]
                heapq.heappop(self._heap)
            elif not whole:
                break  # the rest of this bucket is not due yet
        return due
