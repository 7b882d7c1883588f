"""Lease expiry without stalls: leases filed in time buckets, expired in bounded batches; and the
limit on what a lease may be.

Each lease is filed in the bucket of its expiry time (`granularity` seconds wide): filing, moving
(renew) and removing (take, cancel) are O(1) dict operations, so nothing stale piles up and no
rebuild ever stops the loop. A heap holds the bucket numbers in use, so finding the next due
bucket is O(log b) in the number of buckets. `pop_due` returns at most `limit` ids per call, and
the caller yields between calls: a mass expiry ("lease storm") is spread over many small steps.

Every duration a client asks for passes `check_lease_duration` before anything is granted:
a finite lease is at most `MAX_LEASE_SECONDS`, so every expiry time the engine files is an
ordinary float. The queue does not rely on that: it files any finite time (the far past and far
future share an end bucket each) and refuses a non-finite one before changing anything.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Iterable, Sequence
from typing import Final

from outrig.service.exceptions import InvalidArgumentError

__all__ = ["MAX_LEASE_SECONDS", "LeaseQueue", "check_lease_duration"]

MAX_LEASE_SECONDS: Final = 3_155_760_000
"""The longest finite lease anyone may ask for: 100 years of 365.25 days, in seconds.

A longer finite request is refused (InvalidArgumentError), not cut to it or taken for FOREVER:
the client asked for something else than it would get. A client that means "never" asks for
FOREVER. A space's `max_lease` may cut a request further; this limit holds whatever it is."""

# Bucket numbers are clamped to +-this (2**62 buckets of 0.1 s are 14.6 billion years): an expiry
# beyond it, however large, is filed in the end bucket rather than overflowing the arithmetic.
_END_BUCKET: Final = 1 << 62
_floor = math.floor


def check_lease_duration(seconds: float | None, field: str = "lease") -> None:
    """Refuse a requested lease the engine cannot grant, naming `field`: NaN, -inf, or a finite
    duration beyond MAX_LEASE_SECONDS. None (the space's default) and math.inf (FOREVER) pass.

    Every backend calls it before it grants or changes anything, and so can an adapter at its
    boundary: one rule, one message, wherever a duration comes in."""
    if seconds is None or seconds == math.inf:
        return
    if math.isnan(seconds) or seconds == -math.inf:
        raise InvalidArgumentError(f"{field}.seconds: must be a number of seconds, got {seconds}")
    if seconds > MAX_LEASE_SECONDS:
        raise InvalidArgumentError(
            f"{field}.seconds: {seconds!r} exceeds the maximum of {MAX_LEASE_SECONDS} seconds "
            "(100 years); ask for FOREVER instead"
        )


class LeaseQueue:
    """Expiry times of leased things (entries, registrations, transactions), by id."""

    def __init__(self, granularity: float = 0.1) -> None:
        if not (math.isfinite(granularity) and granularity > 0):
            raise ValueError(f"granularity: must be a finite number of seconds > 0, got {granularity!r}")
        self._granularity = granularity
        self._buckets: dict[int, dict[int, float]] = {}
        self._heap: list[int] = []  # bucket numbers; each one at most once
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def _bucket_of(self, expires_at: float) -> int | None:
        """The bucket of a time; None if it is not finite. The division may overflow to +-inf
        (1e308 / 0.1): such a quotient is clamped, never given to `floor`, which cannot take it."""
        quotient = expires_at / self._granularity
        if -_END_BUCKET < quotient < _END_BUCKET:  # all but the ends (and NaN): one test
            return _floor(quotient)
        if not math.isfinite(expires_at):
            return None
        return _END_BUCKET if quotient > 0 else -_END_BUCKET

    def _bucket_at(self, expires_at: float, lease_id: int | None) -> dict[int, float]:
        """The bucket of leases ending at `expires_at`, made if need be; ValueError (naming
        `lease_id`, None: a batch's), with nothing changed, if that is no finite time."""
        number = self._bucket_of(expires_at)
        if number is None:
            what = "leases" if lease_id is None else f"lease {lease_id}"
            raise ValueError(f"{what}: cannot file an expiry at {expires_at!r}, it must be finite")
        bucket = self._buckets.get(number)
        if bucket is None:
            bucket = self._buckets[number] = {}
            heapq.heappush(self._heap, number)
        return bucket

    def add(self, lease_id: int, expires_at: float) -> None:
        """File a lease ending at `expires_at`; ValueError, with nothing changed, if that is no
        finite time (FOREVER is not filed: it never expires)."""
        quotient = expires_at / self._granularity
        # a bucket that is there already (a pair's write: the previous write's, as a rule) is
        # found without `_bucket_at`'s and `_bucket_of`'s frames
        bucket = self._buckets.get(_floor(quotient)) if -_END_BUCKET < quotient < _END_BUCKET else None
        if bucket is None:
            bucket = self._bucket_at(expires_at, lease_id)
        if lease_id not in bucket:
            self._count += 1
        bucket[lease_id] = expires_at

    def add_many(self, lease_ids: Sequence[int], expires_at: float) -> None:
        """`add` of leases that end together (a batch's): one bucket found for all of them."""
        bucket = self._bucket_at(expires_at, None)
        before = len(bucket)
        bucket.update(dict.fromkeys(lease_ids, expires_at))
        self._count += len(bucket) - before

    def discard(self, lease_id: int, expires_at: float) -> None:
        """Forget a lease filed at `expires_at` (doing nothing if it is not there)."""
        quotient = expires_at / self._granularity
        if -_END_BUCKET < quotient < _END_BUCKET:  # `_bucket_of`'s first case, inline
            number: int | None = _floor(quotient)
        else:
            number = self._bucket_of(expires_at)
        if number is None:
            return  # not a finite time: never filed (`add` refuses it)
        bucket = self._buckets.get(number)
        if bucket is not None and bucket.pop(lease_id, None) is not None:
            self._count -= 1
            if not bucket:
                del self._buckets[number]  # its heap item is dropped when it comes up

    def discard_many(self, lease_ids: Iterable[int], expires_at: float) -> None:
        """`discard` of leases filed at the same `expires_at` (a batch's): one bucket for all."""
        number = self._bucket_of(expires_at)
        bucket = None if number is None else self._buckets.get(number)
        if bucket is None:
            return
        pop, before = bucket.pop, len(bucket)
        for lease_id in lease_ids:
            pop(lease_id, None)
        self._count -= before - len(bucket)
        if not bucket:
            del self._buckets[number]  # type: ignore[arg-type]  # not None: it had a bucket

    def _first_bucket(self) -> tuple[int, dict[int, float]] | None:
        heap = self._heap
        while heap:
            bucket = self._buckets.get(heap[0])
            if bucket is not None:
                return heap[0], bucket
            heapq.heappop(heap)
        return None

    def next_expiry(self) -> float | None:
        """The soonest expiry, or None when nothing is leased (a look through its bucket: the
        bucket's start would do for most times, not for the end buckets or tiny ones that round)."""
        first = self._first_bucket()
        return None if first is None else min(first[1].values())

    def pop_due(self, now: float, limit: int) -> list[int]:
        """Remove and return up to `limit` ids whose lease ran out by `now`, soonest bucket first."""
        # Buckets before now's hold only due leases, those after it none (bucket numbers never
        # decrease with time): only now's own bucket is looked into. No float arithmetic on
        # bucket numbers, so nothing is taken early or left behind by rounding.
        current = self._bucket_of(now)
        if current is None:  # +inf: everything is due; -inf or NaN: nothing is
            if now != math.inf:
                return []
            current = _END_BUCKET
        due: list[int] = []
        while len(due) < limit:
            first = self._first_bucket()
            if first is None or first[0] > current:
                break
            number, bucket = first
            whole = number < current
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
