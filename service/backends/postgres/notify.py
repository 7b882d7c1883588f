"""Notify registrations of the PostgreSQL backend: a row per registration, and on each server the
streams attached to it.

A registration is a row of `outrig_registrations` (space, id, templates, expires_at), so that its
lease can be renewed or cancelled through any server. Events reach a stream two ways:

- the server that made a write offers it at once to its own streams (so an event is there when
  the write returns, as on the embedded backend);
- every other server hears of it through `outrig_changes` (the notification carries the ids, in
  commit order), fetches those rows and offers them to its streams (listener.py). A taken row
  stays fetchable for 60 s (`_TAKEN_KEPT`, reaper.py); a row gone by the time of the fetch is
  skipped, and its event is lost (docs/postgres.md).

Events are buffered up to `notify_queue` per stream; beyond it they are dropped, which shows as a
gap in sequence numbers.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence

from outrig.service.backends.base import Event
from outrig.service.engine.model import LeaseGrant, StoredEntry, Template
from outrig.service.exceptions import ShuttingDownError

__all__ = ["PgSubscription"]


class PgSubscription:
    """One stream of a registration, attached on this server."""

    def __init__(
        self,
        registration_id: int,
        templates: Sequence[Template],
        grant: LeaseGrant,
        *,
        limit: int,
        on_close: Callable[[PgSubscription], None],
        transaction: int = 0,
        sequence: int = 0,
    ) -> None:
        self.id = registration_id
        self.templates = tuple(templates)
        self.grant = grant
        self.expires_at = grant.expires_at
        self.transaction = transaction
        self.sequence = sequence
        self.dropped = 0
        self.shutting_down = False
        self._limit = limit
        self._on_close = on_close
        self._events: deque[Event] = deque()
        self._wake = asyncio.Event()
        self.ended = False

    @property
    def lease(self) -> LeaseGrant:
        return self.grant

    def offer(self, stored: StoredEntry) -> None:
        """An entry written (committed, or under this registration's own transaction)."""
        if self.ended or not any(template.matches(stored) for template in self.templates):
            return
        self.sequence += 1
        if len(self._events) < self._limit:
            self._events.append(Event(self.sequence, stored))
            self._wake.set()
        else:
            self.dropped += 1

    def end(self, *, shutting_down: bool = False) -> None:
        """The registration's lease ended (expired, cancelled, or its transaction ended); or, with
        `shutting_down`, this server is stopping and the registration lives on for a resume."""
        self.shutting_down = shutting_down
        self.ended = True
        self._wake.set()

    def __aiter__(self) -> AsyncIterator[Event]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[Event]:
        while True:
            while self._events:
                yield self._events.popleft()
            if self.ended:
                if self.shutting_down:
                    raise ShuttingDownError(
                        f"the server is shutting down; resume registration {self.id} through another server"
                    )
                return
            self._wake.clear()
            await self._wake.wait()

    def close(self) -> None:
        """The listener went away: the registration ends."""
        if not self.ended:
            self._on_close(self)
        self.end()
