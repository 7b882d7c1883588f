"""The PostgreSQL backend: spaces as rows in one database that several outrig servers share
(docs/postgres.md).

Every operation is one database transaction, never held open across client calls. Matching is a
containment query on two GIN indexes, `lineage @> ARRAY[type]` and `fields @> {field: key}`
(schema.py, queries.py), in arrival order; each candidate is then checked with the engine's own
`Template.matches`, which compares large values in full. A take locks the rows it chose with
`FOR UPDATE SKIP LOCKED`, so concurrent takes through any number of servers never return the same
entry and never wait on each other, and marks them taken in the same transaction (the reaper,
reaper.py, purges them later; meanwhile other servers can still fetch them for notify events).

Blocked calls are woken by LISTEN/NOTIFY on `outrig_changes` (one listening connection per
server, listener.py) and look again every second, because notifications are not replayed.
Transactions are columns and a read-lock table; request ids (idempotency.py), registrations
(notify.py) and quota counts (16 shards per space, queries.py) are rows shared by all servers.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool

from outrig.service.backends.base import SpaceFigures, Subscription
from outrig.service.backends.postgres.idempotency import PgRequestLog, _Replay
from outrig.service.backends.postgres.listener import Listener, _notify
from outrig.service.backends.postgres.notify import PgSubscription
from outrig.service.backends.postgres.queries import (
    _LOCKED_FOR_READ,
    _LOCKED_FOR_TAKE,
    _READABLE,
    _TAKEABLE,
    _charge,
    _delete,
    _named,
    _retire,
    _stored,
)
from outrig.service.backends.postgres.reaper import Reaper
from outrig.service.backends.postgres.schema import field_key, migrate
from outrig.service.config import ServerConfig
from outrig.service.engine.clock import Clock, SystemClock
from outrig.service.engine.leases import check_lease_duration
from outrig.service.engine.model import LeaseGrant, NewEntry, StoredEntry, Template
from outrig.service.engine.values import FULL_KEY_LIMIT
from outrig.service.exceptions import (
    LeaseNotFoundError,
    RegistrationBusyError,
    ShuttingDownError,
    SpaceError,
    TransactionAbortedError,
    TransactionNotFoundError,
    TypeConflictError,
)
from outrig.service.protocol import codec

__all__ = ["PostgresBackend"]

log = logging.getLogger("outrig.service.backends.postgres")

_SEQUENCE_JUMP = 1 << 31  # as the embedded backend's restart: numbers never repeat
_RECHECK = 1.0  # seconds between re-checks of a blocked call: notifications are not replayed
_ACTIVE, _COMMITTED, _ABORTED = 0, 1, 2  # outrig_transactions.state


class PostgresBackend:
    """Spaces in a PostgreSQL database: `outrig serve --backend postgres --dsn ...`."""

    def __init__(
        self, config: ServerConfig, dsn: str, clock: Clock | None = None, pool_size: int = 10
    ) -> None:
        self.config = config
        self.dsn = dsn
        self.clock = clock or SystemClock()
        self._pool = AsyncConnectionPool(dsn, min_size=1, max_size=pool_size, open=False)
        self._listener = Listener(dsn, self._pool)
        self._reaper = Reaper(
            config.reap_interval,
            self.clock,
            self._pool,
            self._listener,
            lambda space, txn: self._end(space, txn, commit=False),
        )
        self._requests = PgRequestLog(config.request_window, self.clock, self._pool)
        self._waiting: dict[str, int] = {}  # blocked calls parked on this server, per space
        self._types: dict[str, dict[str, list[str]]] = {}  # declarations seen in the database
        self._listen_task: asyncio.Task[None] | None = None
        self._reap_task: asyncio.Task[None] | None = None
        self.closing = False
        self._background: set[asyncio.Task[Any]] = set()

    async def start(self) -> None:
        await self._pool.open(wait=True)
        async with self._pool.connection() as connection:
            applied = await migrate(connection)
        if applied:
            log.info("PostgreSQL schema: applied migrations %s", applied)
        self._listen_task = asyncio.create_task(self._listener.listen())
        await asyncio.wait_for(self._listener.listening.wait(), 30)  # no notification missed from the start
        self._reap_task = asyncio.create_task(self._reaper.reap_forever())

    async def close(self) -> None:
        self.closing = True
        for task in (self._listen_task, self._reap_task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        for event in self._listener.changed.values():
            event.set()
        for streams in self._listener.streams.values():
            for stream in list(streams.values()):
                stream.end(shutting_down=True)  # the registration stays: its client resumes elsewhere
        self._listener.streams.clear()

    async def shutdown(self) -> None:
        await self._pool.close()

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
        if request_id and (earlier := await self._requests.replay(request_id, space, "write")) is not None:
            return earlier
        try:
            return await self._write(space, entries, lease, request_id, transaction)
        except _Replay:
            replayed = await self._requests.replay(request_id, space, "write")
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
                await self._requests.claim(connection, request_id, space, "write")
            declared = await self._declare(connection, space, entries)
            await _charge(
                connection,
                self.config.space_settings(space),
                space,
                len(entries),
                sum(new.size for new in entries),
                now,
            )
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
            self._listener.mark_delivered(ids)  # before the commit: this server's listener must skip them
            await _notify(connection, space, [] if transaction else ids)
        self._types.setdefault(space, {}).update(declared)  # committed: the database holds them
        written = [StoredEntry(entry_id, new, expires_at) for entry_id, new in zip(ids, entries, strict=True)]
        self._listener.offer(space, written, transaction)
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
        if request_id and (earlier := await self._requests.replay(request_id, space, "take")) is not None:
            return earlier
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        event = self._listener.event(space)
        while True:
            event.clear()  # before looking: a change after this moment wakes us
            try:
                found, conflicted = await self._find(
                    space, templates, take, max_entries, transaction, if_exists, request_id
                )
            except _Replay:
                replayed = await self._requests.replay(request_id, space, "take")
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
                await self._requests.claim(connection, request_id, space, "take")
                await connection.execute(
                    "UPDATE outrig_requests SET result = %s::jsonb, payloads = %s WHERE id = %s",
                    (
                        json.dumps([[s.id, s.arrival, s.expires_at] for s in found]),
                        [bytes(codec.entry_bytes(s.payload)) for s in found],
                        request_id,
                    ),
                )
            if take and found and not txn:
                await _retire(connection, self.clock.time(), "space = %s AND id = ANY(%s)", (space, ids))
            elif take and found:
                own = [i for i in ids if i in mine]  # its own writes, taken back: as if never written
                if own:
                    await _delete(connection, "space = %s AND id = ANY(%s)", (space, own))
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
        self._listener.streams.setdefault(space, {})[registration_id] = stream
        return stream

    async def _resume(self, space: str, registration_id: int) -> Subscription:
        """Attach a stream here to a registration made through any server (whose server stopped)."""
        if registration_id in self._listener.streams.get(space, {}):
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
        self._listener.streams.setdefault(space, {})[registration_id] = stream
        return stream

    def _forget(self, space: str, stream: PgSubscription) -> None:
        """A stream's listener went away: its registration ends."""
        self._listener.streams.get(space, {}).pop(stream.id, None)
        task = asyncio.get_running_loop().create_task(self._delete_registration(space, stream.id))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _delete_registration(self, space: str, registration_id: int) -> int:
        async with self._pool.connection() as connection:
            cursor = await connection.execute(
                "DELETE FROM outrig_registrations WHERE space = %s AND id = %s", (space, registration_id)
            )
            return cursor.rowcount

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
                    stream = self._listener.streams.get(space, {}).get(lease_id)
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
                gone = await _delete(
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
                    self._listener.end_streams(space, [lease_id])
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
        for space, streams in self._listener.streams.items():
            figures.setdefault(space, SpaceFigures()).registrations = len(streams)
        for space, expired in self._reaper.expired.items():
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
            await _retire(connection, self.clock.time(), "space = %s AND taken_by = %s", (space, txn))
        else:
            await _delete(connection, "space = %s AND written_by = %s", (space, txn))
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
        self._listener.mark_delivered([stored.id for stored in committed])
        await _notify(connection, space, [stored.id for stored in committed])
        self._listener.end_streams(space, transaction=txn)  # a registration under a transaction ends with it
        self._listener.pending_offers.append((space, committed))

    async def commit(self, space: str, transaction: int) -> None:
        await self._end(space, transaction, commit=True)
        self._listener.flush_offers()

    async def abort(self, space: str, transaction: int) -> None:
        await self._end(space, transaction, commit=False)
        self._listener.flush_offers()
