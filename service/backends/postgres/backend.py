"""The PostgreSQL backend: spaces as rows in one database that several outrig servers share
(docs/postgres.md).

Every operation is one database transaction, never held open across client calls. Matching is a
containment query on two GIN indexes, `lineage @> ARRAY[type]` and `fields @> {field: key}`
(schema.py), in arrival order; each candidate is then checked with the engine's own
`Template.matches`, which compares large values in full. A take locks the rows it chose with
`FOR UPDATE SKIP LOCKED`, so concurrent takes through any number of servers never return the same
entry and never wait on each other, and marks them taken in the same transaction (the reaper
purges them later; meanwhile other servers can still fetch them for notify events).

Blocked calls are woken by LISTEN/NOTIFY on `outrig_changes` (one listening connection per
server) and look again every second, because notifications are not replayed. Transactions are
columns and a read-lock table; request ids, registrations and quota counts (16 shards per space)
are rows shared by all servers.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import random
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool

from outrig.service import codec
from outrig.service.backends.base import SpaceFigures, Subscription
from outrig.service.backends.postgres.notify import PgSubscription
from outrig.service.backends.postgres.schema import field_key, migrate
from outrig.service.config import ServerConfig
from outrig.service.engine.clock import Clock, SystemClock
from outrig.service.engine.leases import check_lease_duration
from outrig.service.engine.model import LeaseGrant, NewEntry, StoredEntry, Template
from outrig.service.engine.values import FULL_KEY_LIMIT
from outrig.service.exceptions import (
    LeaseNotFoundError,
    QuotaExceededError,
    RegistrationBusyError,
    RequestConflictError,
    ShuttingDownError,
    SpaceError,
    TransactionAbortedError,
    TransactionNotFoundError,
    TypeConflictError,
)

__all__ = ["PostgresBackend"]

log = logging.getLogger("outrig.service.backends.postgres")

_CHANNEL = "outrig_changes"
_SEPARATOR = "\x1f"  # between the space and the ids a notification carries
_IDS_PER_NOTIFICATION = 500  # base-36 ids: well under PostgreSQL's 8,000-byte payload limit
_DELIVERED_REMEMBERED = 100_000
_SEQUENCE_JUMP = 1 << 31  # as the embedded backend's restart: numbers never repeat
_TAKEN_KEPT = 60.0  # seconds a taken entry stays fetchable for other servers' notify events
_RECHECK = 1.0  # seconds between re-checks of a blocked call: notifications are not replayed
_REAP_BATCH = 1000
_SHARDS = 16  # quota count rows per space


def _base36(number: int) -> str:
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    text = ""
    while True:
        number, rest = divmod(number, 36)
        text = digits[rest] + text
        if not number:
            return text


# Rows a caller under transaction %(txn)s (0: none) may read, and may take.
_READABLE = "taken_at IS NULL AND taken_by IS NULL AND (written_by IS NULL OR written_by = %(txn)s)"
_TAKEABLE = (
    _READABLE + " AND NOT EXISTS (SELECT 1 FROM outrig_read_locks r WHERE r.space = e.space "
    "AND r.entry_id = e.id AND r.txn <> %(txn)s)"
)
# Rows it skipped for another transaction's lock: they may become usable when that one ends.
_LOCKED_FOR_READ = (
    "(taken_by IS NOT NULL AND taken_by <> %(txn)s) OR (written_by IS NOT NULL AND written_by <> %(txn)s)"
)
_LOCKED_FOR_TAKE = (
    "(" + _LOCKED_FOR_READ + ") OR EXISTS (SELECT 1 FROM outrig_read_locks r WHERE r.space = e.space "
    "AND r.entry_id = e.id AND r.txn <> %(txn)s)"
)
_ACTIVE, _COMMITTED, _ABORTED = 0, 1, 2


def _named(templates: Sequence[Template]) -> tuple[str, dict[str, Any]]:
    """The template condition with named parameters (t0, f0, t1, f1, ...)."""
    clauses, params = [], {}
    for i, template in enumerate(templates):
        fields = {name: field_key(value) for name, value in template.fields}
        clauses.append(f"(lineage @> ARRAY[%(t{i})s]::text[] AND fields @> %(f{i})s::jsonb)")
        params[f"t{i}"], params[f"f{i}"] = template.type_name, json.dumps(fields)
    return "(" + " OR ".join(clauses) + ")", params


class _Replay(Exception):  # noqa: N818 - a signal within this module, not an error
    """Another call with the same request id acted first: roll back and answer with its reply."""


async def _uncount(connection: AsyncConnection[Any], rows: Sequence[tuple[Any, ...]]) -> dict[str, int]:
    """Take (space, size) rows off their spaces' counts; how many rows per space."""
    gone: dict[str, list[int]] = {}
    for space, size in rows:
        tally = gone.setdefault(space, [0, 0])
        tally[0] += 1
        tally[1] += size
    for space, (count, size) in gone.items():
        await _add_to_counts(connection, space, -count, -size)
    return {space: count for space, (count, _) in gone.items()}


async def _add_to_counts(connection: AsyncConnection[Any], space: str, count: int, size: int) -> None:
    """Add to a random shard of the space's counts (only their sum means anything)."""
    await connection.execute(
        "INSERT INTO outrig_space_counts (space, shard, entries, bytes) VALUES (%s, %s, %s, %s) "
        "ON CONFLICT (space, shard) DO UPDATE SET entries = outrig_space_counts.entries + excluded.entries, "
        "bytes = outrig_space_counts.bytes + excluded.bytes",
        (space, random.randrange(_SHARDS), count, size),
    )


def _stored(row: tuple[Any, ...]) -> StoredEntry:
    entry_id, arrival, payload, expires_at = row
    stored = StoredEntry(entry_id, codec.stored_entry(bytes(payload)), expires_at)
    stored.arrival = arrival
    return stored


class PostgresBackend:
    """Spaces in a PostgreSQL database: `outrig serve --backend postgres --dsn ...` (to come)."""

    def __init__(
        self, config: ServerConfig, dsn: str, clock: Clock | None = None, pool_size: int = 10
    ) -> None:
        self.config = config
        self.dsn = dsn
        self.clock = clock or SystemClock()
        self._pool = AsyncConnectionPool(dsn, min_size=1, max_size=pool_size, open=False)
        self._changed: dict[str, asyncio.Event] = {}
        self._streams: dict[str, dict[int, PgSubscription]] = {}  # attached here, by space and id
        self._expired: dict[str, int] = {}  # entries this server's reaper expired, per space
        self._waiting: dict[str, int] = {}  # blocked calls parked on this server, per space
        self._types: dict[str, dict[str, list[str]]] = {}  # declarations seen in the database
        self._delivered: dict[int, None] = {}  # ids this server offered its streams itself (recent)
        self._listener: asyncio.Task[None] | None = None
        self._reaper: asyncio.Task[None] | None = None
        self.closing = False
        self._background: set[asyncio.Task[Any]] = set()
        self._pending_offers: list[tuple[str, list[StoredEntry]]] = []
        self._listening = asyncio.Event()

    async def start(self) -> None:
        await self._pool.open(wait=True)
        async with self._pool.connection() as connection:
            applied = await migrate(connection)
        if applied:
            log.info("PostgreSQL schema: applied migrations %s", applied)
        self._listener = asyncio.create_task(self._listen())
        await asyncio.wait_for(self._listening.wait(), 30)  # no notification missed from the start
        self._reaper = asyncio.create_task(self._reap_forever())

    async def close(self) -> None:
        self.closing = True
        for task in (self._listener, self._reaper):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        for event in self._changed.values():
            event.set()
        for streams in self._streams.values():
            for stream in list(streams.values()):
                stream.end(shutting_down=True)  # the registration stays: its client resumes elsewhere
        self._streams.clear()

    async def shutdown(self) -> None:
        await self._pool.close()

    # ------------------------------------------------------------------ wake-ups

    async def _listen(self) -> None:
        """One listening connection per server fans notifications out to its own waiters."""
        while True:
            try:
                async with await AsyncConnection.connect(self.dsn, autocommit=True) as connection:
                    await connection.execute(f"LISTEN {_CHANNEL}")
                    self._listening.set()
                    for event in self._changed.values():
                        event.set()  # anything may have changed while not listening
                    async for notification in connection.notifies():
                        space, _, listed = notification.payload.partition(_SEPARATOR)
                        woken = self._changed.get(space)
                        if woken is not None:
                            woken.set()
                        if listed and self._streams.get(space):
                            await self._fan_out(space, [int(x, 36) for x in listed.split(",")])
            except asyncio.CancelledError:
                raise
            except Exception as err:  # the database went away: listen again shortly
                log.warning("PostgreSQL listener: %s; reconnecting", err)
                await asyncio.sleep(0.5)

    async def _reap_registrations(self) -> None:
        """End the streams here whose registration's lease ran out, and drop the expired rows."""
        now = self.clock.time()
        for space, streams in self._streams.items():
            expired = [s.id for s in streams.values() if s.expires_at is not None and s.expires_at <= now]
            if expired:
                self._end_streams(space, expired)
        async with self._pool.connection() as connection:
            await connection.execute("DELETE FROM outrig_registrations WHERE expires_at <= %s", (now,))

    async def _claim(self, connection: AsyncConnection[Any], request_id: str, space: str, kind: str) -> None:
        """Record a request id in the caller's database transaction; `_Replay` if a call with it got
        there first (waiting for that call's transaction, if it is still open)."""
        cursor = await connection.execute(
            "INSERT INTO outrig_requests (id, space, kind, expires_at, result) "
            "VALUES (%s, %s, %s, %s, 'null') ON CONFLICT DO NOTHING RETURNING id",
            (request_id, space, kind, self.clock.time() + self.config.request_window),
        )
        if await cursor.fetchone() is None:
            raise _Replay

    async def _replay(self, request_id: str, space: str, kind: str) -> list[Any] | None:
        """The first reply to a request id, or None if there was no first call (in the window)."""
        async with self._pool.connection() as connection:
            cursor = await connection.execute(
                "SELECT space, kind, result, payloads FROM outrig_requests WHERE id = %s AND expires_at > %s",
                (request_id, self.clock.time()),
            )
            row = await cursor.fetchone()
        if row is None:
            return None
        first_space, first_kind, result, payloads = row
        if (first_space, first_kind) != (space, kind):
            raise RequestConflictError(
                f"request_id: {request_id!r} was used for a {first_kind} in space {first_space!r}; "
                f"a retry must repeat the same call (this is a {kind} in space {space!r})"
            )
        if kind == "write":
            return [LeaseGrant(i, result["expires_at"], result["granted"]) for i in result["ids"]]
        return [
            _stored((entry_id, arrival, payload, expires_at))
            for (entry_id, arrival, expires_at), payload in zip(result, payloads or [], strict=True)
        ]

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
        self._offer(space, fresh, transaction=0)

    def _offer(self, space: str, entries: Sequence[StoredEntry], transaction: int) -> None:
        """Offer entries to the streams attached here: committed ones to all, a transaction's own
        writes only to the streams registered under it."""
        streams = self._streams.get(space)
        if not streams:
            return
        self._mark_delivered([stored.id for stored in entries])
        for stored in entries:
            for stream in list(streams.values()):
                if transaction and stream.transaction != transaction:
                    continue
                stream.offer(stored)

    def _mark_delivered(self, ids: Sequence[int]) -> None:
        for entry_id in ids:
            self._delivered[entry_id] = None
        while len(self._delivered) > _DELIVERED_REMEMBERED:
            del self._delivered[next(iter(self._delivered))]

    async def _notify(self, connection: AsyncConnection[Any], space: str, ids: Sequence[int]) -> None:
        """Tell every server (at commit, in commit order) that these entries of `space` appeared."""
        if not ids:
            await connection.execute("SELECT pg_notify(%s, %s)", (_CHANNEL, space))
            return
        listed = [_base36(entry_id) for entry_id in ids]
        for start in range(0, len(listed), _IDS_PER_NOTIFICATION):
            payload = space + _SEPARATOR + ",".join(listed[start : start + _IDS_PER_NOTIFICATION])
            await connection.execute("SELECT pg_notify(%s, %s)", (_CHANNEL, payload))

    def _event(self, space: str) -> asyncio.Event:
        event = self._changed.get(space)
        if event is None:
            event = self._changed[space] = asyncio.Event()
        return event

    async def _reap_forever(self) -> None:
        while True:
            await asyncio.sleep(self.config.reap_interval)
            try:
                async with self._pool.connection() as connection:
                    cursor = await connection.execute(
                        "DELETE FROM outrig_entries WHERE ctid IN (SELECT ctid FROM outrig_entries "
                        "WHERE expires_at <= %s AND taken_at IS NULL LIMIT %s) RETURNING space, size",
                        (self.clock.time(), _REAP_BATCH),
                    )
                    for space, count in (await _uncount(connection, await cursor.fetchall())).items():
                        self._expired[space] = self._expired.get(space, 0) + count
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
                        await self._end(space, txn, commit=False)
                self._flush_offers()
                await self._reap_registrations()
                async with self._pool.connection() as connection:
                    await connection.execute(
                        "DELETE FROM outrig_requests WHERE expires_at <= %s", (self.clock.time(),)
                    )
            except asyncio.CancelledError:
                raise
            except Exception as err:
                log.warning("PostgreSQL reaper: %s", err)

    # ------------------------------------------------------------------ operations

    async def write(
        self,
        space: str,
        entries: Sequence[NewEntry],
        lease: float | None,
        *,
        request_id: str = "",
        transaction: int = 0,
    ) -> list[LeaseGrant]:
        if request_id and (earlier := await self._replay(request_id, space, "write")) is not None:
            return earlier
        try:
            return await self._write(space, entries, lease, request_id, transaction)
        except _Replay:
            replayed = await self._replay(request_id, space, "write")
            assert replayed is not None
            return replayed

    async def _write(
        self, space: str, entries: Sequence[NewEntry], lease: float | None, request_id: str, transaction: int
    ) -> list[LeaseGrant]:
        now = self.clock.time()
        expires_at, granted = self._grant(space, lease, now)
        async with self._pool.connection() as connection, connection.transaction():
            if transaction:
                await self._active(connection, space, transaction)
            if request_id:
                await self._claim(connection, request_id, space, "write")
            declared = await self._declare(connection, space, entries)
            await self._charge(connection, space, len(entries), sum(new.size for new in entries), now)
            cursor = await connection.execute(
                "SELECT nextval('outrig_ids') FROM generate_series(1, %s)", (len(entries),)
            )
            ids = [row[0] for row in await cursor.fetchall()]
            async with connection.cursor() as insert:
                await insert.executemany(
                    "INSERT INTO outrig_entries (space, id, arrival, lineage, fields, payload, size, "
                    "expires_at, written_by) VALUES (%s, %s, %s, %s, %s::jsonb, %s, %s, %s, %s)",
                    [
                        (
                            space,
                            entry_id,
                            entry_id,
                            [new.type_name, *new.supertypes],
                            json.dumps({name: field_key(value) for name, value in new.fields.items()}),
                            bytes(codec.entry_bytes(new.payload)),
                            new.size,
                            expires_at,
                            transaction or None,
                        )
                        for entry_id, new in zip(ids, entries, strict=True)
                    ],
                )
            if request_id:
                await connection.execute(
                    "UPDATE outrig_requests SET result = %s::jsonb WHERE id = %s",
                    (json.dumps({"ids": ids, "expires_at": expires_at, "granted": granted}), request_id),
                )
            self._mark_delivered(ids)  # before the commit: this server's listener must skip them
            await self._notify(connection, space, [] if transaction else ids)
        self._types.setdefault(space, {}).update(declared)  # committed: the database holds them
        written = [StoredEntry(entry_id, new, expires_at) for entry_id, new in zip(ids, entries, strict=True)]
        self._offer(space, written, transaction)
        return [LeaseGrant(entry_id, expires_at, granted) for entry_id in ids]

    def _grant(
        self, space: str, requested: float | None, now: float, field: str = "lease"
    ) -> tuple[float | None, float | None]:
        """(expires_at, granted seconds) for a requested lease, as the engine grants one: None asks
        for the space's default, math.inf for FOREVER (None, None), cut to the space's max_lease.
        A duration nobody may ask for is refused by the engine's own rule, before anything is done."""
        check_lease_duration(requested, field)
        settings = self.config.space_settings(space)
        duration = min(settings.default_lease if requested is None else requested, settings.max_lease)
        return (None, None) if math.isinf(duration) else (now + duration, duration)

    async def _charge(
        self, connection: AsyncConnection[Any], space: str, count: int, size: int, now: float
    ) -> None:
        """Count a write against the space's quotas (rolled back with the write if it fails).
        Expired entries the reaper has not deleted yet do not count: they are deleted first.

        The counts are summed over shards, and writes racing on other shards are not seen until
        they commit: concurrent writes can overshoot a quota by what they write together."""
        settings = self.config.space_settings(space)
        await _add_to_counts(connection, space, count, size)
        entries = held = 0
        for attempt in range(2):
            cursor = await connection.execute(
                "SELECT coalesce(sum(entries), 0), coalesce(sum(bytes), 0) FROM outrig_space_counts "
                "WHERE space = %s",
                (space,),
            )
            row = await cursor.fetchone()
            assert row is not None
            entries, held = int(row[0]), int(row[1])
            if entries <= settings.max_entries and held <= settings.max_bytes:
                return
            if attempt == 0:
                await self._delete(
                    connection, "space = %s AND expires_at <= %s AND taken_at IS NULL", (space, now)
                )
        if entries > settings.max_entries:
            raise QuotaExceededError(
                f"space {space!r} holds {entries - count} entries; writing {count} more exceeds its quota "
                f"max_entries={settings.max_entries}"
            )
        raise QuotaExceededError(
            f"space {space!r} holds {held - size} bytes; writing {size} more exceeds its quota "
            f"max_bytes={settings.max_bytes}"
        )

    @staticmethod
    async def _delete(connection: AsyncConnection[Any], where: str, params: Sequence[Any]) -> int:
        """Delete live entries (expired, cancelled, never committed) and take them off their
        spaces' counts; how many went."""
        cursor = await connection.execute(
            "DELETE FROM outrig_entries WHERE taken_at IS NULL AND (" + where + ") RETURNING space, size",
            params,
        )
        return sum((await _uncount(connection, await cursor.fetchall())).values())

    async def _retire(self, connection: AsyncConnection[Any], where: str, params: Sequence[Any]) -> int:
        """Mark entries taken: gone for every match, off their spaces' counts, but kept for
        `_TAKEN_KEPT` seconds so that other servers can still fetch them for their notify events."""
        cursor = await connection.execute(
            "UPDATE outrig_entries SET taken_at = %s WHERE taken_at IS NULL AND (" + where + ") "
            "RETURNING space, size",
            (self.clock.time(), *params),
        )
        return sum((await _uncount(connection, await cursor.fetchall())).values())

    async def _declare(
        self, connection: AsyncConnection[Any], space: str, entries: Sequence[NewEntry]
    ) -> dict[str, list[str]]:
        """Declare the entries' types, refusing one that was declared with other supertypes; the
        declarations the database holds, to remember once the write has committed."""
        wanted: dict[str, list[str]] = {}
        for new in entries:
            lineage = [new.type_name, *new.supertypes]
            for depth, name in enumerate(lineage):
                parents = wanted.setdefault(name, lineage[depth + 1 :])
                if parents != lineage[depth + 1 :]:
                    raise TypeConflictError(
                        f"type {name!r} is declared with supertypes {parents} and {lineage[depth + 1 :]} "
                        f"in one write to space {space!r}"
                    )
        known = self._types.setdefault(space, {})
        if all(known.get(name) == parents for name, parents in wanted.items()):
            return {}  # declared before, as now: a declaration never changes, so no round trip
        async with connection.cursor() as cursor:
            await cursor.executemany(
                "INSERT INTO outrig_types (space, name, supertypes) VALUES (%s, %s, %s) "
                "ON CONFLICT DO NOTHING",
                [(space, name, parents) for name, parents in wanted.items()],
            )
        cursor = await connection.execute(
            "SELECT name, supertypes FROM outrig_types WHERE space = %s AND name = ANY(%s)",
            (space, list(wanted)),
        )
        declared = {name: list(parents) for name, parents in await cursor.fetchall()}
        for name, parents in declared.items():
            if parents != wanted[name]:
                raise TypeConflictError(
                    f"type {name!r} has supertypes {parents} in space {space!r}; "
                    f"an entry declares {wanted[name]}"
                )
        return declared

    async def match(
        self,
        space: str,
        templates: Sequence[Template],
        *,
        take: bool,
        max_entries: int,
        timeout: float | None,
        if_exists: bool,
        request_id: str = "",
        transaction: int = 0,
    ) -> list[StoredEntry]:
        request_id = request_id if take else ""
        if request_id and (earlier := await self._replay(request_id, space, "take")) is not None:
            return earlier
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        event = self._event(space)
        while True:
            event.clear()  # before looking: a change after this moment wakes us
            try:
                found, conflicted = await self._find(
                    space, templates, take, max_entries, transaction, if_exists, request_id
                )
            except _Replay:
                replayed = await self._replay(request_id, space, "take")
                assert replayed is not None
                return replayed
            if found or (if_exists and not conflicted) or (deadline is not None and loop.time() >= deadline):
                return found
            if self.closing:
                raise ShuttingDownError("the server is shutting down")
            wait = _RECHECK if deadline is None else min(_RECHECK, deadline - loop.time())
            self._waiting[space] = self._waiting.get(space, 0) + 1
            try:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(event.wait(), max(wait, 0.0))
            finally:
                self._waiting[space] -= 1

    async def _find(
        self,
        space: str,
        templates: Sequence[Template],
        take: bool,
        limit: int,
        txn: int,
        if_exists: bool,
        request_id: str = "",
    ) -> tuple[list[StoredEntry], bool]:
        """Up to `limit` matches `txn` (0: none) may use, locked or taken for it; and, when nothing
        was found for an `if_exists` call, whether some match is locked by another transaction."""
        where, params = _named(templates)
        params.update(space=space, now=self.clock.time(), limit=limit, txn=txn)
        usable = _TAKEABLE if take else _READABLE
        query = (
            "SELECT id, arrival, payload, expires_at, written_by FROM outrig_entries e "
            "WHERE space = %(space)s "
            f"AND {where} AND (expires_at IS NULL OR expires_at > %(now)s) AND {usable} "
            "ORDER BY arrival LIMIT %(limit)s"
        )
        async with self._pool.connection() as connection, connection.transaction():
            if txn:
                await self._active(connection, space, txn)
            cursor = await connection.execute(query + (" FOR UPDATE SKIP LOCKED" if take else ""), params)
            rows = await cursor.fetchall()
            mine = {row[0] for row in rows if row[4] == txn and txn}
            found = [s for s in (_stored(row[:4]) for row in rows) if any(t.matches(s) for t in templates)]
            ids = [s.id for s in found]
            if request_id and found:  # a take with an id records what it took, or replays
                await self._claim(connection, request_id, space, "take")
                await connection.execute(
                    "UPDATE outrig_requests SET result = %s::jsonb, payloads = %s WHERE id = %s",
                    (
                        json.dumps([[s.id, s.arrival, s.expires_at] for s in found]),
                        [bytes(codec.entry_bytes(s.payload)) for s in found],
                        request_id,
                    ),
                )
            if take and found and not txn:
                await self._retire(connection, "space = %s AND id = ANY(%s)", (space, ids))
            elif take and found:
                own = [i for i in ids if i in mine]  # its own writes, taken back: as if never written
                if own:
                    await self._delete(connection, "space = %s AND id = ANY(%s)", (space, own))
                await connection.execute(
                    "UPDATE outrig_entries SET taken_by = %s WHERE space = %s AND id = ANY(%s)",
                    (txn, space, [i for i in ids if i not in mine]),
                )
                await connection.execute(
                    "DELETE FROM outrig_read_locks WHERE space = %s AND txn = %s AND entry_id = ANY(%s)",
                    (space, txn, ids),
                )
            elif found and txn:
                async with connection.cursor() as lock:
                    await lock.executemany(
                        "INSERT INTO outrig_read_locks (space, entry_id, txn) VALUES (%s, %s, %s) "
                        "ON CONFLICT DO NOTHING",
                        [(space, i, txn) for i in ids if i not in mine],
                    )
            conflicted = False
            if not found and if_exists:
                locked = "taken_at IS NULL AND (" + (_LOCKED_FOR_TAKE if take else _LOCKED_FOR_READ) + ")"
                cursor = await connection.execute(
                    f"SELECT EXISTS (SELECT 1 FROM outrig_entries e WHERE space = %(space)s AND {where} "
                    f"AND (expires_at IS NULL OR expires_at > %(now)s) AND ({locked}))",
                    params,
                )
                row = await cursor.fetchone()
                conflicted = bool(row and row[0])
        return found, conflicted

    async def contents(
        self, space: str, templates: Sequence[Template], max_entries: int, transaction: int = 0
    ) -> AsyncIterator[list[StoredEntry]]:
        where, params = _named(templates)
        chunk = self.config.limits.contents_chunk
        left = max_entries or math.inf
        after = -1
        while left > 0:
            params.update(
                space=space, now=self.clock.time(), after=after, limit=int(min(chunk, left)), txn=transaction
            )
            async with self._pool.connection() as connection:
                cursor = await connection.execute(
                    "SELECT id, arrival, payload, expires_at FROM outrig_entries e "
                    "WHERE space = %(space)s AND "
                    f"{where} AND (expires_at IS NULL OR expires_at > %(now)s) AND {_READABLE} "
                    "AND arrival > %(after)s ORDER BY arrival LIMIT %(limit)s",
                    params,
                )
                rows = await cursor.fetchall()
            if not rows:
                return
            after = rows[-1][1]
            ready = [s for s in map(_stored, rows) if any(t.matches(s) for t in templates)]
            left -= len(ready)
            if ready:
                yield ready

    async def count(self, space: str, templates: Sequence[Template], transaction: int = 0) -> int:
        if any(value.size > FULL_KEY_LIMIT for template in templates for _, value in template.fields):
            # A large value's index key is a sample: compare the candidates in full.
            return sum([len(chunk) async for chunk in self.contents(space, templates, 0, transaction)])
        where, params = _named(templates)
        params.update(space=space, now=self.clock.time(), txn=transaction)
        async with self._pool.connection() as connection:
            cursor = await connection.execute(
                f"SELECT count(*) FROM outrig_entries e WHERE space = %(space)s AND {where} "
                f"AND (expires_at IS NULL OR expires_at > %(now)s) AND {_READABLE}",
                params,
            )
            row = await cursor.fetchone()
        return int(row[0]) if row else 0

    async def subscribe(
        self,
        space: str,
        templates: Sequence[Template],
        lease: float | None,
        *,
        resume: int | None = None,
        transaction: int = 0,
    ) -> Subscription:
        if resume is not None:
            return await self._resume(space, resume)
        now = self.clock.time()
        expires_at, granted = self._grant(space, lease, now)
        async with self._pool.connection() as connection:
            if transaction:
                await self._active(connection, space, transaction)
            cursor = await connection.execute(
                "INSERT INTO outrig_registrations (space, id, expires_at, templates, transaction) "
                "VALUES (%s, nextval('outrig_ids'), %s, %s, %s) RETURNING id",
                (space, expires_at, codec.templates_bytes(templates), transaction or None),
            )
            row = await cursor.fetchone()
        assert row is not None
        registration_id = int(row[0])
        stream = PgSubscription(
            registration_id,
            templates,
            LeaseGrant(registration_id, expires_at, granted),
            limit=self.config.limits.notify_queue,
            on_close=lambda closed: self._forget(space, closed),
            transaction=transaction,
        )
        self._streams.setdefault(space, {})[registration_id] = stream
        return stream

    async def _resume(self, space: str, registration_id: int) -> Subscription:
        """Attach a stream here to a registration made through any server (whose server stopped)."""
        if registration_id in self._streams.get(space, {}):
            raise RegistrationBusyError(
                f"resume: registration {registration_id} in space {space!r} already has a listener"
            )
        now = self.clock.time()
        async with self._pool.connection() as connection:
            cursor = await connection.execute(
                "SELECT expires_at, templates, sequence, transaction FROM outrig_registrations "
                "WHERE space = %s AND id = %s AND (expires_at IS NULL OR expires_at > %s)",
                (space, registration_id, now),
            )
            row = await cursor.fetchone()
        if row is None:
            raise LeaseNotFoundError(
                f"resume: registration {registration_id} in space {space!r} is unknown or has ended"
            )
        expires_at, templates, sequence, transaction = row
        granted = None if expires_at is None else max(0.0, expires_at - now)
        stream = PgSubscription(
            registration_id,
            codec.stored_templates(bytes(templates)),
            LeaseGrant(registration_id, expires_at, granted),
            limit=self.config.limits.notify_queue,
            on_close=lambda closed: self._forget(space, closed),
            transaction=transaction or 0,
            sequence=int(sequence) + _SEQUENCE_JUMP,  # a gap says events may have been missed
        )
        self._streams.setdefault(space, {})[registration_id] = stream
        return stream

    def _forget(self, space: str, stream: PgSubscription) -> None:
        """A stream's listener went away: its registration ends."""
        self._streams.get(space, {}).pop(stream.id, None)
        task = asyncio.get_running_loop().create_task(self._delete_registration(space, stream.id))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _delete_registration(self, space: str, registration_id: int) -> int:
        async with self._pool.connection() as connection:
            cursor = await connection.execute(
                "DELETE FROM outrig_registrations WHERE space = %s AND id = %s", (space, registration_id)
            )
            return cursor.rowcount

    def _end_streams(self, space: str, ids: Sequence[int] | None = None, transaction: int = 0) -> None:
        streams = self._streams.get(space, {})
        for stream in list(streams.values()):
            if (ids is not None and stream.id in ids) or (transaction and stream.transaction == transaction):
                streams.pop(stream.id, None)
                stream.end()

    async def renew(
        self, space: str, renewals: Sequence[tuple[int, float | None]]
    ) -> list[LeaseGrant | SpaceError]:
        results: list[LeaseGrant | SpaceError] = []
        now = self.clock.time()
        grants = [self._grant(space, requested, now, "duration") for _, requested in renewals]  # all, first
        async with self._pool.connection() as connection:
            for (lease_id, _), (expires_at, granted) in zip(renewals, grants, strict=True):
                cursor = await connection.execute(
                    "UPDATE outrig_entries SET expires_at = %s WHERE space = %s AND id = %s "
                    "AND taken_at IS NULL AND (expires_at IS NULL OR expires_at > %s)",
                    (expires_at, space, lease_id, now),
                )
                if not cursor.rowcount:
                    cursor = await connection.execute(
                        "UPDATE outrig_registrations SET expires_at = %s WHERE space = %s AND id = %s "
                        "AND (expires_at IS NULL OR expires_at > %s)",
                        (expires_at, space, lease_id, now),
                    )
                    stream = self._streams.get(space, {}).get(lease_id)
                    if cursor.rowcount and stream is not None:
                        stream.expires_at = expires_at
                if cursor.rowcount:
                    results.append(LeaseGrant(lease_id, expires_at, granted))
                else:
                    results.append(
                        LeaseNotFoundError(f"lease {lease_id} in space {space!r} is unknown or has ended")
                    )
        return results

    async def cancel(self, space: str, lease_ids: Sequence[int]) -> list[SpaceError | None]:
        results: list[SpaceError | None] = []
        now = self.clock.time()
        async with self._pool.connection() as connection:
            for lease_id in lease_ids:
                gone = await self._delete(
                    connection,
                    "space = %s AND id = %s AND (expires_at IS NULL OR expires_at > %s)",
                    (space, lease_id, now),
                )
                if not gone:
                    cursor = await connection.execute(
                        "DELETE FROM outrig_registrations WHERE space = %s AND id = %s "
                        "AND (expires_at IS NULL OR expires_at > %s)",
                        (space, lease_id, now),
                    )
                    gone = cursor.rowcount
                    self._end_streams(space, [lease_id])
                results.append(
                    None
                    if gone
                    else LeaseNotFoundError(f"lease {lease_id} in space {space!r} is unknown or has ended")
                )
        return results

    def observe_commits(self, observe: Callable[[float, int], None]) -> None:
        """Nothing to observe: durability is PostgreSQL's, which has no group commit of ours."""

    async def space_figures(self) -> dict[str, SpaceFigures]:
        """What each space holds, for the metrics: the database's counts, and this server's own
        parked calls, attached streams and reaped leases."""
        async with self._pool.connection() as connection:
            cursor = await connection.execute(
                "SELECT space, sum(entries), sum(bytes) FROM outrig_space_counts GROUP BY space"
            )
            figures = {space: SpaceFigures(int(n), int(b)) for space, n, b in await cursor.fetchall()}
            cursor = await connection.execute(
                "SELECT space, count(*) FROM outrig_transactions WHERE state = 0 GROUP BY space"
            )
            for space, open_count in await cursor.fetchall():
                figures.setdefault(space, SpaceFigures()).transactions = int(open_count)
        for space, waiting in self._waiting.items():
            figures.setdefault(space, SpaceFigures()).waiters = waiting
        for space, streams in self._streams.items():
            figures.setdefault(space, SpaceFigures()).registrations = len(streams)
        for space, expired in self._expired.items():
            figures.setdefault(space, SpaceFigures()).expired = expired
        return figures

    async def begin(self, space: str, lease: float | None) -> LeaseGrant:
        expires_at, granted = self._grant(space, lease, self.clock.time())
        async with self._pool.connection() as connection:
            cursor = await connection.execute(
                "INSERT INTO outrig_transactions (space, id, expires_at) "
                "VALUES (%s, nextval('outrig_ids'), %s) "
                "RETURNING id",
                (space, expires_at),
            )
            row = await cursor.fetchone()
        assert row is not None
        return LeaseGrant(int(row[0]), expires_at, granted)

    async def _active(self, connection: AsyncConnection[Any], space: str, txn: int) -> None:
        """Raise unless `txn` is active (aborting it first if its lease ran out)."""
        cursor = await connection.execute(
            "SELECT state, expires_at FROM outrig_transactions WHERE space = %s AND id = %s FOR SHARE",
            (space, txn),
        )
        row = await cursor.fetchone()
        if row is None or row[0] != _ACTIVE:
            raise TransactionNotFoundError(f"transaction {txn} in space {space!r} is unknown or has ended")
        if row[1] is not None and row[1] <= self.clock.time():
            raise TransactionNotFoundError(f"transaction {txn} in space {space!r} ran out of lease")

    async def _end(self, space: str, txn: int, commit: bool) -> None:
        async with self._pool.connection() as connection, connection.transaction():
            cursor = await connection.execute(
                "SELECT state, expires_at FROM outrig_transactions WHERE space = %s AND id = %s FOR UPDATE",
                (space, txn),
            )
            row = await cursor.fetchone()
            if row is None:
                raise TransactionNotFoundError(
                    f"transaction {txn} in space {space!r} is unknown or has ended"
                )
            state, expires_at = row
            if state == _ACTIVE and expires_at is not None and expires_at <= self.clock.time():
                await self._finish(connection, space, txn, commit=False)  # its lease ran out: it aborted
                state = _ABORTED
            wanted = _COMMITTED if commit else _ABORTED
            if state == wanted:
                return  # a repeated commit or abort
            if state != _ACTIVE:
                ended = "aborted" if state == _ABORTED else "committed"
                raise TransactionAbortedError(f"transaction {txn} in space {space!r} has {ended}")
            await self._finish(connection, space, txn, commit=commit)

    async def _finish(self, connection: AsyncConnection[Any], space: str, txn: int, *, commit: bool) -> None:
        """Commit or abort `txn` inside the caller's database transaction."""
        committed: list[StoredEntry] = []
        if commit:
            cursor = await connection.execute(
                "UPDATE outrig_entries SET written_by = NULL WHERE space = %s AND written_by = %s "
                "RETURNING id, arrival, payload, expires_at",
                (space, txn),
            )
            committed = sorted(map(_stored, await cursor.fetchall()), key=lambda s: s.arrival)
            await self._retire(connection, "space = %s AND taken_by = %s", (space, txn))
        else:
            await self._delete(connection, "space = %s AND written_by = %s", (space, txn))
            await connection.execute(
                "UPDATE outrig_entries SET taken_by = NULL WHERE space = %s AND taken_by = %s", (space, txn)
            )
        await connection.execute("DELETE FROM outrig_read_locks WHERE space = %s AND txn = %s", (space, txn))
        await connection.execute(
            "UPDATE outrig_transactions SET state = %s, ended_at = %s WHERE space = %s AND id = %s",
            (_COMMITTED if commit else _ABORTED, self.clock.time(), space, txn),
        )
        await connection.execute(
            "DELETE FROM outrig_registrations WHERE space = %s AND transaction = %s", (space, txn)
        )
        self._mark_delivered([stored.id for stored in committed])
        await self._notify(connection, space, [stored.id for stored in committed])
        self._end_streams(space, transaction=txn)  # a registration under a transaction ends with it
        self._pending_offers.append((space, committed))

    async def commit(self, space: str, transaction: int) -> None:
        await self._end(space, transaction, commit=True)
        self._flush_offers()

    def _flush_offers(self) -> None:
        """Offer what commits made visible to the streams here, once their database transaction
        has committed."""
        pending, self._pending_offers = self._pending_offers, []
        for space, entries in pending:
            self._offer(space, entries, transaction=0)

    async def abort(self, space: str, transaction: int) -> None:
        await self._end(space, transaction, commit=False)
        self._flush_offers()
