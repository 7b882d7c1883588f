"""A notify registration of the memory backend, and the stream of its events.

Events are buffered up to a limit; beyond it they are dropped, which the consumer sees as a gap
in sequence numbers, so a slow reader never grows the server's memory. On a durable server a
registration outlives a restart; until a listener resumes it, its events are buffered the same
way, and an event waits for its entry's write to be durable before it is sent.

A stream waiting for events is woken on the loop's turn after the write's: the write's own answer
(a Mux stream's writer, woken after the write's step) goes out before its subscribers' events,
so the writer does not wait for every subscriber's send (docs/performance.md, "Notify fan-out").
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from outrig.service.backends.base import Event
from outrig.service.engine.model import LeaseGrant, Registration, StoredEntry
from outrig.service.engine.space import SpaceEngine
from outrig.service.exceptions import ShuttingDownError, SpaceError

if TYPE_CHECKING:
    from outrig.service.backends.memory.backend import MemoryBackend

SHUTTING_DOWN = "the server is shutting down"
# A registration's sequence number is stored again once it has moved this far, so that after a
# crash, restarting it at the stored number + 2**31 (recovery.SEQUENCE_JUMP) never reuses a number.
_SEQUENCE_STEP = 1 << 30


class MemorySubscription:
    """The events of one registration (see the module docstring)."""

    def __init__(self, backend: MemoryBackend, space: str, engine: SpaceEngine) -> None:
        self._backend = backend
        self._space = space
        self._engine = engine
        self._limit = backend.config.limits.notify_queue
        self._events: deque[Event] = deque()
        self._wake = asyncio.Event()
        # While the stream waits for events: its loop, to wake it from (see `on_event`).
        self._parked: asyncio.AbstractEventLoop | None = None
        self._ended = False
        self._error: SpaceError | None = None  # what the stream ends with, if not its lease
        self.dropped = 0
        self.attached = False
        self.stored_sequence = 0
        self.registration: Registration | None = None
        self.grant: LeaseGrant | None = None  # as granted when registered in this process

    @property
    def lease(self) -> LeaseGrant:
        registration = self.registration
        assert registration is not None
        if self.grant is not None and self.grant.expires_at == registration.expires_at:
            return self.grant
        expires_at = registration.expires_at
        granted = None if expires_at is None else max(0.0, expires_at - self._backend.clock.time())
        return LeaseGrant(registration.seq, expires_at, granted)

    @property
    def waiting(self) -> bool:
        """Whether the stream is waiting for events (it has sent every one it had)."""
        return self._parked is not None

    def on_event(self, sequence: int, entry: StoredEntry) -> None:
        if len(self._events) < self._limit:
            self._events.append(Event(sequence, entry))
            parked, self._parked = self._parked, None
            if parked is not None:
                # Woken from the loop's next turn: the write that made this event is answered
                # first (a Mux stream's writer is woken after this: it would wait for every
                # subscriber's send), and its subscribers' sends follow.
                parked.call_soon(self._wake.set)
        else:
            self.dropped += 1
        if sequence - self.stored_sequence >= _SEQUENCE_STEP and self.registration is not None:
            self.stored_sequence = sequence
            self._backend.note([("sequence", self._space, self.registration.seq, sequence)])

    def on_end(self) -> None:
        self._ended = True
        self._wake.set()
        registration = self.registration
        if registration is not None:
            self._backend.forget_subscription(self._space, registration.seq)

    def __aiter__(self) -> AsyncIterator[Event]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[Event]:
        loop = asyncio.get_running_loop()
        while True:
            while self._events:
                event = self._events.popleft()
                if await self._backend.settled([event.entry]):
                    yield event
            if self._ended:
                if self._error is not None:
                    raise self._error
                if self._backend.keeps_registrations and self._backend.closing:
                    raise ShuttingDownError(
                        f"{SHUTTING_DOWN}; resume registration {self.lease.id} after the restart"
                    )
                return
            self._wake.clear()
            self._parked = loop
            try:
                await self._wake.wait()
            finally:
                self._parked = None

    def end(self, error: SpaceError) -> None:
        """The space is no longer served here: the stream ends with `error`, the registration
        stays in the store for its listener to resume where the space is served now."""
        self._error = error
        self._ended = True
        self._wake.set()

    def close(self) -> None:
        """The listener went away: the registration ends (unless the server is stopping, when a
        durable server keeps it for a resume after the restart)."""
        registration = self.registration
        if registration is not None and not self._ended:
            self._engine.unregister(registration)
            self._backend.forget_subscription(self._space, registration.seq)
        self._ended = True
        self._wake.set()
