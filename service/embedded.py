"""The embedded backend: one in-memory `SpaceEngine` per named space, driven from the event loop.

A read or take that finds nothing parks a future in the engine and awaits it, so a blocked call
holds no thread. A reaper task expires leases in bounded batches, yielding between them, so mass
expiry never stalls request handling.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import AsyncIterator, Sequence

from outrig.service.backend import Event
from outrig.service.config import ServerConfig
from outrig.service.engine.clock import Clock, SystemClock
from outrig.service.engine.model import LeaseGrant, NewEntry, StoredEntry, Template
from outrig.service.engine.space import Registration, SpaceEngine, Waiter
from outrig.service.exceptions import QuotaExceededError, ShuttingDownError, SpaceError

log = logging.getLogger("outrig.service")

_SHUTTING_DOWN = "the server is shutting down"
# Candidates a contents call checks before it lets other requests run.
_SLICE = 1024


class EmbeddedSubscription:
    """Events of one registration, buffered up to a limit; beyond it they are dropped, which the
    consumer sees as a gap in sequence numbers (a slow reader never grows the server's memory)."""

    def __init__(self, engine: SpaceEngine, queue_limit: int) -> None:
        self._engine = engine
        self._limit = queue_limit
        self._events: deque[Event] = deque()
        self._wake = asyncio.Event()
        self._ended = False
        self.dropped = 0
        self._registration: Registration | None = None
        self._lease: LeaseGrant | None = None

    def attach(self, registration: Registration, lease: LeaseGrant) -> None:
        self._registration = registration
        self._lease = lease

    @property
    def lease(self) -> LeaseGrant:
        assert self._lease is not None
        return self._lease

    def on_event(self, sequence: int, entry: StoredEntry) -> None:
        if len(self._events) < self._limit:
            self._events.append(Event(sequence, entry))
            self._wake.set()
        else:
            self.dropped += 1

    def on_end(self) -> None:
        self._ended = True
        self._wake.set()

    def __aiter__(self) -> AsyncIterator[Event]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[Event]:
        while True:
            while self._events:
                yield self._events.popleft()
            if self._ended:
                return
            self._wake.clear()
            await self._wake.wait()

    def close(self) -> None:
        if self._registration is not None:
            self._engine.unregister(self._registration)
        self.on_end()


class EmbeddedBackend:
    """In-memory spaces (durability lands with the SQLite store)."""

    def __init__(self, config: ServerConfig, clock: Clock | None = None) -> None:
        self._config = config
        self._clock = clock or SystemClock()
        self._spaces: dict[str, SpaceEngine] = {}
        self._reaper: asyncio.Task[None] | None = None
        self._closing = False
        self._parked: set[asyncio.Future[list[StoredEntry]]] = set()

    def engine(self, name: str) -> SpaceEngine:
        """The named space, created with its configured settings on first use."""
        engine = self._spaces.get(name)
        if engine is None:
            if self._closing:
                raise ShuttingDownError(_SHUTTING_DOWN)
            limit = self._config.limits.max_spaces
            if len(self._spaces) >= limit:
                raise QuotaExceededError(
                    f"space {name!r} would be space number {limit + 1}; the limit is max_spaces={limit}"
                )
            engine = self._spaces[name] = SpaceEngine(name, self._config.space_settings(name), self._clock)
        return engine

    async def start(self) -> None:
        self._reaper = asyncio.create_task(self._reap_forever(), name="outrig-reaper")

    async def close(self) -> None:
        self._closing = True
        # Blocked reads and takes end now, with UNAVAILABLE, rather than being cut off at the end
        # of the grace period.
        for future in self._parked:
            if not future.done():
                future.set_exception(ShuttingDownError(_SHUTTING_DOWN))
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper
        for engine in self._spaces.values():
            engine.close()

    async def _reap_forever(self) -> None:
        batch = self._config.reap_batch
        while True:
            await asyncio.sleep(self._config.reap_interval)
            for engine in list(self._spaces.values()):
                while engine.reap(batch) >= batch:  # noqa: ASYNC110 - bounded batches, not a wait
                    await asyncio.sleep(0)  # let requests run between batches

    async def write(self, space: str, entries: Sequence[NewEntry], lease: float | None) -> list[LeaseGrant]:
        return self.engine(space).write(entries, lease)

    async def match(
        self,
        space: str,
        templates: Sequence[Template],
        *,
        take: bool,
        max_entries: int,
        timeout: float | None,
        if_exists: bool,
    ) -> list[StoredEntry]:
        engine = self.engine(space)
        found = engine.find(templates, take=take, max_entries=max_entries)
        # Without transactions no entry is ever locked, so *_nowait has nothing to wait for.
        if found or if_exists or timeout == 0:
            return found
        if self._closing:
            raise ShuttingDownError(_SHUTTING_DOWN)
        limit = self._config.limits.max_waiters
        if engine.waiting >= limit:
            raise QuotaExceededError(
                f"space {space!r} has {engine.waiting} blocked reads and takes; "
                f"the limit is max_waiters={limit}"
            )
        future: asyncio.Future[list[StoredEntry]] = asyncio.get_running_loop().create_future()

        def deliver(entries: list[StoredEntry]) -> bool:
            if future.done():
                return False
            future.set_result(entries)
            return True

        waiter = Waiter(engine.new_waiter_seq(), tuple(templates), take, deliver, max_entries)
        engine.park(waiter)
        self._parked.add(future)
        try:
            async with asyncio.timeout(timeout):
                return await future
        except TimeoutError:
            # A delivery may have landed just as the deadline fired: it is ours, return it.
            return future.result() if future.done() and not future.cancelled() else []
        except asyncio.CancelledError:
            delivered = future.done() and not future.cancelled() and future.exception() is None
            if take and delivered:
                engine.restore(future.result())  # the caller is gone: put the entries back
            raise
        finally:
            engine.unpark(waiter)
            self._parked.discard(future)

    async def contents(
        self, space: str, templates: Sequence[Template], max_entries: int
    ) -> AsyncIterator[list[StoredEntry]]:
        engine = self.engine(space)
        candidates = engine.candidates(templates)
        chunk = self._config.limits.contents_chunk
        left = max_entries or len(candidates)
        ready: list[StoredEntry] = []
        for start in range(0, len(candidates), _SLICE):
            for stored in candidates[start : start + _SLICE]:
                if engine.visible(templates, stored):
                    ready.append(stored)
                    left -= 1
                    if len(ready) == chunk or not left:
                        yield ready
                        ready = []
                    if not left:
                        return
            await asyncio.sleep(0)  # a slice at a time: a large space never holds the loop
        if ready:
            yield ready

    async def count(self, space: str, templates: Sequence[Template]) -> int:
        return self.engine(space).count(templates)

    async def subscribe(
        self, space: str, templates: Sequence[Template], lease: float | None
    ) -> EmbeddedSubscription:
        engine = self.engine(space)
        limit = self._config.limits.max_registrations
        if engine.registered >= limit:
            raise QuotaExceededError(
                f"space {space!r} has {engine.registered} notify registrations; "
                f"the limit is max_registrations={limit}"
            )
        subscription = EmbeddedSubscription(engine, self._config.limits.notify_queue)
        registration, grant = engine.register(
            tuple(templates), lease, subscription.on_event, subscription.on_end
        )
        subscription.attach(registration, grant)
        return subscription

    async def renew(
        self, space: str, renewals: Sequence[tuple[int, float | None]]
    ) -> list[LeaseGrant | SpaceError]:
        engine = self.engine(space)
        results: list[LeaseGrant | SpaceError] = []
        for lease_id, duration in renewals:
            try:
                results.append(engine.renew(lease_id, duration))
            except SpaceError as err:
                results.append(err)
        return results

    async def cancel(self, space: str, lease_ids: Sequence[int]) -> list[SpaceError | None]:
        engine = self.engine(space)
        results: list[SpaceError | None] = []
        for lease_id in lease_ids:
            try:
                engine.cancel(lease_id)
                results.append(None)
            except SpaceError as err:
                results.append(err)
        return results
