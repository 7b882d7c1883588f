"""Dead letters between spaces of a tier that different servers may own (docs/postgres.md, "Dead
letters in a tier").

An entry that reached its max_deliveries leaves its space for the space's dead-letter space. When
this server serves that space too, the memory backend puts the entry there in the same change
(one batch, fenced by both spaces). Otherwise the change that deletes the entry's row writes a
row of `outrig_dead_letters` instead (`leaving`: fenced by the source space alone), and the
dead-letter space's owner, whoever it is, takes the entry in (a new id of its own) in one change
that deletes that row (fenced by the dead-letter space alone): at its load (loading.py), or at
its next look (every third of a lease, `WAITING`). Each row is taken in once: only the owner takes
it in, under the fence of its epoch, and `Arrivals` keeps this server from taking in twice a row
whose deletion has committed but which a look that started before then still saw.
"""

from __future__ import annotations

import asyncio
import math
import time
from typing import Final

from outrig.service.backends.memory.journal import Record
from outrig.service.engine.model import StoredEntry

# The dead letters waiting for spaces this server serves, oldest first.
WAITING: Final = (
    "SELECT dead_space, source, id, expires_at, payload, deliveries, reason FROM outrig_dead_letters "
    "WHERE dead_space = ANY(%s) ORDER BY moved_at, source, id"
)

Letter = tuple[str, int, float | None, bytes, int, str]
"""A dead letter on its way: source space, its id there, expiry, payload, deliveries, reason."""


def leaving(space: str, entry: StoredEntry, dead_space: str, reason: str, now: float) -> list[Record]:
    """The records of `entry` leaving `space` for `dead_space`, served by another server (or none
    yet): its row goes, and a dead letter's row holds it until it is taken in."""
    return [
        ("delete", space, entry.id),
        (
            "dead_letter",
            space,
            entry.id,
            dead_space,
            entry.expires_at,
            entry.payload,
            entry.deliveries,
            reason,
            now,
        ),
    ]


class Arrivals:
    """The dead letters this server is taking in or took in lately: (source, id) -> when the
    change that took it in committed (time.monotonic; inf: not yet), in a list of its own (the
    taking's token: a late word on an earlier taking of the same letter changes nothing)."""

    def __init__(self) -> None:
        self._taken: dict[tuple[str, int], list[float]] = {}

    def fresh(self, key: tuple[str, int]) -> bool:
        """Whether the letter still has to be taken in (by this server)."""
        return key not in self._taken

    def watch(self, key: tuple[str, int], committed: asyncio.Future[None]) -> None:
        """The letter is being taken in by the change whose future is `committed`."""
        token = self._taken[key] = [math.inf]
        committed.add_done_callback(
            lambda done: self.settled(key, token, not done.cancelled() and done.exception() is None)
        )

    def settled(self, key: tuple[str, int], token: list[float], committed: bool) -> None:
        """The change that took the letter in committed, or failed (then the space was dropped,
        and whoever loads it next finds the row if it is still there)."""
        if self._taken.get(key) is not token:
            return
        if committed:
            token[0] = time.monotonic()
        else:
            del self._taken[key]

    def forget_before(self, started: float) -> None:
        """A look at the waiting letters sent at `started` sees every deletion committed before
        it: those need no remembering any more."""
        self._taken = {key: token for key, token in self._taken.items() if token[0] >= started}
