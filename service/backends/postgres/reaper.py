"""The PostgreSQL backend's reaper, run every `reap_interval` by each server on the shared database.

Each round deletes up to `_REAP_BATCH` expired entries (taking them off their spaces' counts) and
as many taken entries that have been kept `_TAKEN_KEPT` seconds for other servers' notify events;
aborts up to `_REAP_BATCH` transactions whose lease ran out; ends the streams attached here whose
registration's lease ran out; and deletes expired registrations and request ids past their window.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool

from outrig.service.backends.postgres.listener import Listener
from outrig.service.backends.postgres.queries import _uncount
from outrig.service.engine.clock import Clock
from outrig.service.exceptions import SpaceError

__all__ = ["Reaper"]

log = logging.getLogger("outrig.service.backends.postgres")

_TAKEN_KEPT = 60.0  # seconds a taken entry stays fetchable for other servers' notify events
_REAP_BATCH = 1000


class Reaper:
    """Lease expiry on this server; `expired` counts the entries it expired, per space."""

    def __init__(
        self,
        interval: float,
        clock: Clock,
        pool: AsyncConnectionPool[AsyncConnection[Any]],
        listener: Listener,
        abort: Callable[[str, int], Awaitable[None]],
    ) -> None:
        self.interval = interval
        self.clock = clock
        self._pool = pool
        self._listener = listener
        self._abort = abort  # ends a transaction as aborted, in a database transaction of its own
        self.expired: dict[str, int] = {}  # entries this server's reaper expired, per space

    async def reap_forever(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                async with self._pool.connection() as connection:
                    cursor = await connection.execute(
                        "DELETE FROM outrig_entries WHERE ctid IN (SELECT ctid FROM outrig_entries "
                        "WHERE expires_at <= %s AND taken_at IS NULL LIMIT %s) RETURNING space, size",
                        (self.clock.time(), _REAP_BATCH),
                    )
                    for space, count in (await _uncount(connection, await cursor.fetchall())).items():
                        self.expired[space] = self.expired.get(space, 0) + count
                    await connection.execute(
                        "DELETE FROM outrig_entries WHERE ctid IN (SELECT ctid FROM outrig_entries "
                        "WHERE taken_at <= %s LIMIT %s)",
                        (self.clock.time() - _TAKEN_KEPT, _REAP_BATCH),
                    )
                    cursor = await connection.execute(
                        "SELECT space, id FROM outrig_transactions WHERE state = 0 AND expires_at <= %s "
                        "LIMIT %s",
                        (self.clock.time(), _REAP_BATCH),
                    )
                    due = await cursor.fetchall()
                for space, txn in due:  # a transaction whose lease runs out aborts
                    with contextlib.suppress(SpaceError):
                        await self._abort(space, txn)
                self._listener.flush_offers()
                await self._reap_registrations()
                async with self._pool.connection() as connection:
                    await connection.execute(
                        "DELETE FROM outrig_requests WHERE expires_at <= %s", (self.clock.time(),)
                    )
            except asyncio.CancelledError:
                raise
            except Exception as err:
                log.warning("PostgreSQL reaper: %s", err)

    async def _reap_registrations(self) -> None:
        """End the streams here whose registration's lease ran out, and drop the expired rows."""
        now = self.clock.time()
        for space, streams in self._listener.streams.items():
            expired = [s.id for s in streams.values() if s.expires_at is not None and s.expires_at <= now]
            if expired:
                self._listener.end_streams(space, expired)
        async with self._pool.connection() as connection:
            await connection.execute("DELETE FROM outrig_registrations WHERE expires_at <= %s", (now,))
