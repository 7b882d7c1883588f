"""Changes between the servers that share a database: NOTIFY on `outrig_changes` at commit, and
on each server one LISTEN connection that wakes its parked calls and offers new entries to the
notify streams attached there.

A notification carries its space and, after `_SEPARATOR`, the ids of the entries that appeared, in
base 36 and in commit order (`_notify`); one with no ids only wakes the space's parked calls (a
write under a transaction, an abort). The `Listener` keeps one wake-up event per space, the
streams attached on this server, and the ids it offered them itself, so that an entry this server
wrote or committed is not offered twice when its own notification comes back. Offers made inside
a database transaction wait in `pending_offers` until it has committed (`flush_offers`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool

from outrig.service.backends.postgres.notify import PgSubscription
from outrig.service.backends.postgres.queries import _stored
from outrig.service.engine.model import StoredEntry

__all__ = ["Listener"]

log = logging.getLogger("outrig.service.backends.postgres")

_CHANNEL = "outrig_changes"
_SEPARATOR = "\x1f"  # between the space and the ids a notification carries
_IDS_PER_NOTIFICATION = 500  # base-36 ids: well under PostgreSQL's 8,000-byte payload limit
_DELIVERED_REMEMBERED = 100_000


def _base36(number: int) -> str:
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    text = ""
    while True:
        number, rest = divmod(number, 36)
        text = digits[rest] + text
        if not number:
            return text


async def _notify(connection: AsyncConnection[Any], space: str, ids: Sequence[int]) -> None:
    """Tell every server (at commit, in commit order) that these entries of `space` appeared."""
    if not ids:
        await connection.execute("SELECT pg_notify(%s, %s)", (_CHANNEL, space))
        return
    listed = [_base36(entry_id) for entry_id in ids]
    for start in range(0, len(listed), _IDS_PER_NOTIFICATION):
        payload = space + _SEPARATOR + ",".join(listed[start : start + _IDS_PER_NOTIFICATION])
        await connection.execute("SELECT pg_notify(%s, %s)", (_CHANNEL, payload))


class Listener:
    """This server's end of `outrig_changes`: wake-ups for its parked calls, offers to its streams."""

    def __init__(self, dsn: str, pool: AsyncConnectionPool[AsyncConnection[Any]]) -> None:
        self.dsn = dsn
        self._pool = pool
        self.changed: dict[str, asyncio.Event] = {}
        self.streams: dict[str, dict[int, PgSubscription]] = {}  # attached here, by space and id
        self._delivered: dict[int, None] = {}  # ids this server offered its streams itself (recent)
        self.pending_offers: list[tuple[str, list[StoredEntry]]] = []
        self.listening = asyncio.Event()

    async def listen(self) -> None:
        """One listening connection per server fans notifications out to its own waiters."""
        while True:
            try:
                async with await AsyncConnection.connect(self.dsn, autocommit=True) as connection:
                    await connection.execute(f"LISTEN {_CHANNEL}")
                    self.listening.set()
                    for event in self.changed.values():
                        event.set()  # anything may have changed while not listening
                    async for notification in connection.notifies():
                        space, _, listed = notification.payload.partition(_SEPARATOR)
                        woken = self.changed.get(space)
                        if woken is not None:
                            woken.set()
                        if listed and self.streams.get(space):
                            await self._fan_out(space, [int(x, 36) for x in listed.split(",")])
            except asyncio.CancelledError:
                raise
            except Exception as err:  # the database went away: listen again shortly
                log.warning("PostgreSQL listener: %s; reconnecting", err)
                await asyncio.sleep(0.5)

    async def _fan_out(self, space: str, ids: list[int]) -> None:
        """Offer entries another server wrote (or committed) to the streams attached here."""
        wanted = [entry_id for entry_id in ids if entry_id not in self._delivered]
        if not wanted:
            return
        async with self._pool.connection() as connection:
            cursor = await connection.execute(
                "SELECT id, arrival, payload, expires_at FROM outrig_entries "
                "WHERE space = %s AND id = ANY(%s) "
                "ORDER BY arrival",
                (space, wanted),
            )
            rows = await cursor.fetchall()
        # Offered here meanwhile (this server's own write or commit)? Then not again.
        fresh = [_stored(row) for row in rows if row[0] not in self._delivered]
        self.offer(space, fresh, transaction=0)

    def offer(self, space: str, entries: Sequence[StoredEntry], transaction: int) -> None:
        """Offer entries to the streams attached here: committed ones to all, a transaction's own
        writes only to the streams registered under it."""
        streams = self.streams.get(space)
        if not streams:
            return
        self.mark_delivered([stored.id for stored in entries])
        for stored in entries:
            for stream in list(streams.values()):
                if transaction and stream.transaction != transaction:
                    continue
                stream.offer(stored)

    def mark_delivered(self, ids: Sequence[int]) -> None:
        for entry_id in ids:
            self._delivered[entry_id] = None
        while len(self._delivered) > _DELIVERED_REMEMBERED:
            del self._delivered[next(iter(self._delivered))]

    def event(self, space: str) -> asyncio.Event:
        event = self.changed.get(space)
        if event is None:
            event = self.changed[space] = asyncio.Event()
        return event

    def flush_offers(self) -> None:
        """Offer what commits made visible to the streams here, once their database transaction
        has committed."""
        pending, self.pending_offers = self.pending_offers, []
        for space, entries in pending:
            self.offer(space, entries, transaction=0)

    def end_streams(self, space: str, ids: Sequence[int] | None = None, transaction: int = 0) -> None:
        streams = self.streams.get(space, {})
        for stream in list(streams.values()):
            if (ids is not None and stream.id in ids) or (transaction and stream.transaction == transaction):
                streams.pop(stream.id, None)
                stream.end()
