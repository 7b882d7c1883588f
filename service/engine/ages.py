"""When the entries of a space were written, to about a second, without a timestamp per entry.

Entry ids grow with every write, so a list of (first id, time) checkpoints, one at most every
`granularity` seconds of writing, says when any entry was written: at or after the time of the
last checkpoint at or below its id, and less than `granularity` later. That is what an operator's
"age of the oldest entry" needs (`SpaceEngine.oldest_written`), for one clock reading per write
call and two list items per second of writing, pruned below the oldest entry still there.
"""

from __future__ import annotations

from bisect import bisect_right

__all__ = ["WriteTimes"]

#: Checkpoints kept before the oldest are pruned (`WriteTimes.prune`).
PRUNE_AT = 65_536


class WriteTimes:
    """(first id, time) checkpoints of a space's writes, oldest first."""

    __slots__ = ("_granularity", "_ids", "_times")

    def __init__(self, granularity: float = 1.0) -> None:
        self._granularity = granularity
        self._ids: list[int] = []
        self._times: list[float] = []

    def __len__(self) -> int:
        return len(self._ids)

    def note(self, first_id: int, now: float) -> None:
        """Entries from `first_id` on were written at `now` or later."""
        times = self._times
        if times and now - times[-1] < self._granularity:
            return
        self._ids.append(first_id)
        times.append(now)

    def written_at(self, entry_id: int) -> float | None:
        """A time at most `granularity` before the entry was written; None if no checkpoint is
        at or below its id (one pruned away)."""
        at = bisect_right(self._ids, entry_id) - 1
        return self._times[at] if at >= 0 else None

    def prune(self, oldest_id: int) -> None:
        """Forget the checkpoints no entry from `oldest_id` on needs."""
        at = bisect_right(self._ids, oldest_id) - 1
        if at > 0:
            del self._ids[:at]
            del self._times[:at]
