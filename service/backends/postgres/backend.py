"""The postgres backend: the spaces this server owns, served from memory and recorded in
PostgreSQL; every other space is somebody else's, and a call on it is forwarded (by the
transport, which asks `locate`).

Each operation first makes sure this server owns its space (`_ensure`): a space it serves and
can prove it owns goes straight to the memory backend; a space with no live owner is claimed
(ownership.py) and loaded (loading.py) first; a space another server owns is refused with
NotOwnerError naming that server, which the transport turns into UNAVAILABLE/NOT_OWNER (a call
forwarded here is never forwarded again). Between a call's check and its change, nothing
waits: the change is made in memory and fenced by the journal (journal.py) when it is recorded.

Background work, every third of the owner lease: renew the ownership of every space served here
(a space found lost is dropped at once), heartbeat, and claim spaces nobody serves (their owner
died, or stopped and released them), when this server is the least loaded live one or they have
waited two leases.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import gc
import hmac
import json
import logging
import math
import socket
import time
import uuid
import weakref
from collections.abc import AsyncIterator, Sequence
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict
from psycopg_pool import AsyncConnectionPool

from outrig.service.backends.base import Placement, TierFigures
from outrig.service.backends.memory.backend import MemoryBackend
from outrig.service.backends.memory.changes import MemoryChangeFeed
from outrig.service.backends.memory.journal import Record
from outrig.service.backends.memory.subscription import MemorySubscription
from outrig.service.backends.postgres import dead_letters
from outrig.service.backends.postgres.deadlines import within
from outrig.service.backends.postgres.journal import PgJournal
from outrig.service.backends.postgres.loading import SpaceRows, load_space, log_changes
from outrig.service.backends.postgres.ownership import LiveServer, Ownership
from outrig.service.backends.postgres.schema import migrate
from outrig.service.config import ServerConfig
from outrig.service.engine.changes import Change
from outrig.service.engine.clock import Clock
from outrig.service.engine.inspection import SpaceDescription
from outrig.service.engine.model import (
    Delivery,
    LeaseGrant,
    NewEntry,
    Returned,
    StoredEntry,
    Template,
    TransactionState,
)
from outrig.service.engine.space import SpaceEngine
from outrig.service.exceptions import (
    DeliveryExpiredError,
    InvalidArgumentError,
    NoOtherServerError,
    NotOwnerError,
    ShuttingDownError,
    SpaceError,
    StoreError,
    StoreUnavailableError,
)
from outrig.service.protocol import codec

log = logging.getLogger("outrig.service.backends.postgres")

# Seconds a server waits for PostgreSQL at start before it gives up.
CONNECT_TIMEOUT = 10
# Entries decoded between two looks at the event loop, loading a space.
_LOAD_SLICE = 5000
# Leases a space stays where it was claimed before rebalancing may move it.
REBALANCE_AFTER = 4
# Seconds a remote owner found in the database is remembered before it is looked up again.
_LOCATION_TTL = 0.5


def _retrieve(future: asyncio.Future[None]) -> None:
    if not future.cancelled():
        future.exception()


def database_named(dsn: str) -> str:
    """The database a DSN names, for messages: host, port and database, never the password."""
    try:
        parts = conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        return "(an unreadable DSN)"
    host = parts.get("host") or parts.get("hostaddr") or "localhost"
    port = parts.get("port") or "5432"
    return f"{host}:{port}/{parts.get('dbname') or parts.get('user') or ''}"


class PostgresBackend(MemoryBackend):
    """`outrig serve --backend postgres --dsn ...`: one server of a tier (see the module docstring)."""

    keeps_transactions = True  # a space moves: its new owner rebuilds its open transactions

    def __init__(self, config: ServerConfig, dsn: str, clock: Clock | None = None) -> None:
        super().__init__(config, clock)
        self.dsn = dsn
        self.where = database_named(dsn)
        self.lease = config.owner_lease
        self.server_id = f"{socket.gethostname()}-{uuid.uuid4().hex[:8]}"
        lease_ms = int(self.lease * 1000)
        self._connect_kwargs: dict[str, Any] = {
            "autocommit": True,
            "connect_timeout": CONNECT_TIMEOUT,
            # A cut link is noticed within a lease, not after TCP's minutes; and PostgreSQL
            # itself ends a transaction of this server left open (its fence locks would hold
            # up another server's claim) once it has idled for a lease.
            "keepalives": 1,
            "keepalives_idle": max(1, int(self.lease)),
            "keepalives_interval": 1,
            "keepalives_count": 3,
            "tcp_user_timeout": lease_ms,
            # standard_conforming_strings: the journal inlines its values (journal.literal).
            "options": f"-c idle_in_transaction_session_timeout={lease_ms} -c standard_conforming_strings=on",
        }
        self._pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
            dsn, min_size=2, max_size=6, open=False, kwargs=self._connect_kwargs, timeout=self.lease
        )
        self.owners = Ownership(self._pool, self.server_id, self.lease)
        self._pg_journal: PgJournal | None = None
        self._secret = ""
        self._located: dict[str, tuple[float, str]] = {}
        self._tending: asyncio.Task[None] | None = None
        self._renewed_at = time.monotonic()  # when the last renewal got its answer
        self._started_at = time.monotonic()
        self._draining = False
        self._moving: dict[str, str] = {}  # space -> the address of the server it goes to
        self._claiming: dict[str, asyncio.Task[None]] = {}  # claims under way
        self._claimed_at: dict[str, float] = {}
        # For the metrics (TierFigures): claims, the seconds their loads took, drops by reason.
        self._claims = 0
        self._load_seconds = 0.0
        self._dropped: collections.Counter[str] = collections.Counter()
        self._arrivals = dead_letters.Arrivals()
        # Dead-letter moves: being made (see `note`), and the last one each task made.
        self._in_move = False
        self._moves: weakref.WeakKeyDictionary[asyncio.Task[Any], asyncio.Future[None]] = (
            weakref.WeakKeyDictionary()
        )

    # ------------------------------------------------------------------ life cycle

    def serving_at(self, address: str) -> None:
        self.owners.address = address

    async def _connect(self) -> psycopg.AsyncConnection[Any]:
        """A connection of the journal's own. Its batches are simple queries, each unique: psycopg
        would otherwise keep the last hundred (tens of KB each) to count how often it saw them."""
        return await psycopg.AsyncConnection.connect(self.dsn, prepare_threshold=None, **self._connect_kwargs)

    async def _query(self, sql: str, parameters: Sequence[Any]) -> list[tuple[Any, ...]]:
        async with self._pool.connection() as connection:
            cursor = await connection.execute(sql, parameters)
            return list(await cursor.fetchall())

    async def open_store(self) -> None:
        try:
            probe = await self._connect()
        except psycopg.Error as err:
            raise StoreError(f"PostgreSQL at {self.where} is unreachable: {err}".strip()) from None
        try:
            applied = await migrate(probe)
            cursor = await probe.execute("SELECT value FROM outrig_tier WHERE key = 'peer_secret'")
            row = await cursor.fetchone()
        finally:
            await probe.close()
        if applied:
            log.info("PostgreSQL schema: applied migrations %s", applied)
        assert row is not None, "migration 2 stores the tier's peer secret"
        self._secret = str(row[0])
        await self._pool.open(wait=True, timeout=CONNECT_TIMEOUT)
        journal = PgJournal(
            self._connect,
            self._query,
            self.server_id,
            self.owners.epochs,
            codec.entry_bytes,
            self.where,
            deadline=self.lease,
        )
        journal.on_lost = functools.partial(self._lost, reason="fenced")
        journal.on_uncertain = self._uncertain
        await journal.start()
        self._pg_journal = journal
        self.use_journal(journal)
        await self.owners.heartbeat(0)
        self._tending = asyncio.create_task(self._tend_forever(), name="outrig-ownership")
        log.info(
            "server %s in the tier on PostgreSQL at %s, reached at %s; owner lease %.1f s",
            self.server_id,
            self.where,
            self.owners.address,
            self.lease,
        )

    async def close(self) -> None:
        if self._tending is not None:
            self._tending.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._tending
        await super().close()

    async def shutdown(self) -> None:
        """Write what is queued, then give every space up so that others claim it at once."""
        await super().shutdown()
        with contextlib.suppress(psycopg.Error, OSError):
            await self.owners.release(sorted(self.owners.epochs))
        await self._pool.close()

    @property
    def healthy(self) -> bool:
        """Whether this server can record changes (its link to PostgreSQL works)."""
        return self._pg_journal is not None and self._pg_journal.healthy

    @property
    def serving(self) -> bool:
        """Whether this server can record changes and a renewal got through within a lease."""
        return self.healthy and time.monotonic() - self._renewed_at < self.lease

    # ------------------------------------------------------------------ ownership

    def _lost(self, spaces: set[str], reason: str) -> None:
        for space in spaces:
            log.warning("space %r: ownership lost to another server; dropped", space)
            self._drop(space, NotOwnerError(f"space {space!r} is now served by another server"), reason)

    def _uncertain(self) -> None:
        for space in list(self._spaces):
            self._drop(
                space,
                StoreUnavailableError(
                    f"PostgreSQL at {self.where} is unreachable: space {space!r} is not served until "
                    "it is back"
                ),
                "unreachable",
            )

    def _drop(self, space: str, error: SpaceError, reason: str) -> None:
        if space in self._spaces:
            self._dropped[reason] += 1
        self.drop_space(space, error)
        self.owners.forget(space)
        self._located.pop(space, None)
        self._claimed_at.pop(space, None)

    def engine(self, name: str) -> SpaceEngine:
        """The space, if this server serves it and can prove it still owns it."""
        engine = self._spaces.get(name)
        if engine is None:
            raise NotOwnerError(f"space {name!r} is not served by this server")
        if not self.owners.trusted(name):
            raise NotOwnerError(
                f"space {name!r}: this server cannot prove it still owns it (PostgreSQL at "
                f"{self.where} has not confirmed it lately); nothing was done"
            )
        return engine

    async def _ensure(self, space: str) -> None:
        """Make sure this server serves `space`, claiming and loading it if nobody does."""
        if space in self._spaces and self.owners.trusted(space):
            return
        if self.closing:
            raise ShuttingDownError("the server is shutting down")
        moving = self._moving.get(space)
        if moving is not None:
            raise NotOwnerError(f"space {space!r} is moving to {moving}", moving)
        assert self._pg_journal is not None
        self._pg_journal.check()
        if space in self._spaces:
            self.engine(space)  # loaded, but not provably ours: refused
            return
        # One claim per space at a time, in a task of its own: a caller that gives up (a call
        # cancelled or past its deadline) must not cancel a claim that others wait for too, or
        # each new call would claim again, under a new epoch, and load the space again.
        await asyncio.shield(self._start_claim(space))

    def _start_claim(self, space: str) -> asyncio.Task[None]:
        """The claim of `space` under way, or a new one."""
        task = self._claiming.get(space)
        if task is None:
            task = asyncio.create_task(self._claim_once(space), name=f"outrig-claim-{space}")
            self._claiming[space] = task
            task.add_done_callback(lambda done: self._claimed(space, done))
        return task

    def _claimed(self, space: str, task: asyncio.Task[None]) -> None:
        if self._claiming.get(space) is task:
            del self._claiming[space]
        if not task.cancelled() and (error := task.exception()) is not None:
            log.info("space %r: not claimed (%s)", space, error)

    async def _claim_once(self, space: str) -> None:
        try:
            await within(2 * self.lease, self._claim(space))
        except (psycopg.Error, OSError, TimeoutError) as err:
            self.owners.forget(space)
            raise StoreUnavailableError(
                f"space {space!r}: PostgreSQL at {self.where} did not answer a claim ({err})"
            ) from None

    async def _claim(self, space: str) -> None:
        epoch = await self.owners.claim(space)
        if epoch is None:
            owner = await self.owners.owner_of(space)
            address = owner.address if owner is not None else ""
            raise NotOwnerError(f"space {space!r} is served by {address or 'another server'}", address)
        await self._load(space, epoch)

    async def _load(self, space: str, epoch: int) -> None:
        # Loading builds an object graph that all lives on; the cyclic collector would walk the
        # growing heap again and again meanwhile (a 100,000-entry space: 1.95 s decoding with it,
        # 0.57 s without). It pauses for the load (the rows read, decoded a slice at a time so
        # that other spaces' calls run between slices, then installed at once) and is put back as
        # it was.
        collecting = gc.isenabled()
        gc.disable()
        started = time.perf_counter()
        try:
            await self._load_paused(space, epoch)
        finally:
            if collecting:
                gc.enable()
        self._claims += 1
        self._load_seconds += time.perf_counter() - started

    async def _load_paused(self, space: str, epoch: int) -> None:
        now = self.clock.time()
        keeps_log = self.config.space_settings(space).changes
        async with self._pool.connection() as connection:
            rows = await load_space(connection, space, self.server_id, epoch, now, keeps_log=keeps_log)
        decoded = []
        for start in range(0, len(rows.entries), _LOAD_SLICE):
            decoded += [codec.stored_entry(row[3]) for row in rows.entries[start : start + _LOAD_SLICE]]
            await asyncio.sleep(0)
        loaded = {row[0]: (new, row[2]) for row, new in zip(rows.entries, decoded, strict=True)}
        changes = await log_changes(space, rows, loaded)
        if space in self._spaces:
            return
        if self.owners.epochs.get(space) != epoch:
            raise NotOwnerError(f"space {space!r} was claimed by another server while this one loaded it")
        engine = MemoryBackend.engine(self, space)  # creates it (max_spaces applies)
        engine.resume_ids(rows.next_id)
        self.reserve_ids(space, rows.next_id)
        for name, supertypes in rows.types:
            engine.declare(name, tuple(supertypes))
        for row, new in zip(rows.entries, decoded, strict=True):
            entry_id, arrival, expires_at, _, _, hidden_until, receipt, deliveries, reason, limit = row
            engine.load(
                entry_id,
                arrival,
                new,
                expires_at,
                hidden_until=hidden_until,
                receipt=receipt,
                deliveries=deliveries,
                dead_letter_reason=reason or "",
                max_deliveries=limit,
            )
        # Open transactions, as their last owner left them: their writes, takes and read locks.
        transactions = {
            transaction: engine.restore_transaction(transaction, expires_at)
            for transaction, expires_at in rows.transactions
        }
        holds = [(row[4], row[0], "write") for row in rows.entries if row[4] is not None]
        for transaction, entry_id, mode in [*holds, *rows.locks]:
            txn = transactions.get(transaction)
            if txn is None or not engine.restore_lock(txn, entry_id, mode):
                log.warning(
                    "space %r: transaction %d's %s hold on entry %d was not restored",
                    space,
                    transaction,
                    mode,
                    entry_id,
                )
        for registration_id, expires_at, templates, sequence in rows.registrations:
            self.restore_subscription(
                space, registration_id, codec.stored_templates(templates), expires_at, sequence
            )
        for request_id, kind, expires_at in rows.requests:
            self.restore_request(request_id, space, kind, expires_at)
        for transaction in rows.aborted:
            self._ended(space, transaction, TransactionState.ABORTED)
        self._restore_log(space, engine, rows, changes)
        self._take_in(space, rows.dead_letters, loading=True)
        self._located.pop(space, None)
        self._claimed_at[space] = time.monotonic()
        log.info(
            "space %r claimed (epoch %d): %d entries, %d registrations, %d open transactions, "
            "%d request ids, %d dead letters, %d changes loaded in %.2f s (%d expired)",
            space,
            epoch,
            len(rows.entries),
            len(rows.registrations),
            len(rows.transactions),
            len(rows.requests),
            len(rows.dead_letters),
            len(changes),
            rows.seconds,
            rows.expired,
        )

    def _restore_log(self, space: str, engine: SpaceEngine, rows: SpaceRows, changes: list[Change]) -> None:
        """Put the space's change log back as the database holds it (its epoch, head, changes and
        durable subscriptions), so that cursors and durable subscriptions of the last owner stay
        valid here; a log the database holds no epoch of yet gets the engine's, recorded at once
        (a cursor handed out before its first change stays valid across a takeover too)."""
        log = engine.changes
        if log is None:
            return
        if rows.change_epoch is None:
            self.restore_changes(space, log.epoch, [], 0)
            self.note([("change_epoch", space, log.epoch)])
        else:
            self.restore_changes(space, rows.change_epoch, changes, rows.change_head)
        for name, position in rows.subscriptions:
            self.restore_durable(space, name, position)

    async def _tend_forever(self) -> None:
        """Renew, heartbeat and claim orphans, every third of the lease."""
        while True:
            await asyncio.sleep(self.lease / 3)
            try:
                await self._tend()
            except (psycopg.Error, OSError, TimeoutError) as err:
                log.warning("renewing ownership at PostgreSQL %s failed: %s", self.where, err)
            except Exception:  # a bug must not stop the renewals
                log.exception("tending ownership failed")

    async def _tend(self) -> None:
        """Renew every space claimed here (loaded or loading); claim orphans; rebalance."""
        if self._pg_journal is not None:
            self._pg_journal.keepalive()
        lost = await within(self.lease / 2, self.owners.renew(sorted(self.owners.epochs)))
        self._renewed_at = time.monotonic()
        self._located.clear()  # where others' spaces are: looked up afresh, at most a tend old
        if lost:
            self._lost(lost, "renewal")
        if self.closing or not self.healthy:
            return
        await self._take_in_waiting()
        orphans = await within(self.lease / 2, self.owners.orphans())
        servers = await within(self.lease / 2, self.owners.live_servers())
        others = [server for server in servers if server.server != self.server_id]
        least = min((server.spaces for server in others), default=None)
        draining = self._draining
        for space, since, given in orphans:
            mine = len(self.owners.epochs)
            if space in self._claiming or (draining and not given):
                continue
            # A space handed to this server is claimed; one nobody serves, by the least loaded
            # server, or by anyone once it has waited two leases.
            if given or least is None or mine <= least or since > 2 * self.lease:
                self._start_claim(space)
        if not self._claiming and not draining and others:
            await self._rebalance(others)

    async def _take_in_waiting(self) -> None:
        """Take in the dead letters waiting for spaces served here (their source's owner is
        another server, or was when it sent them)."""
        served = sorted(space for space in self._spaces if self.owners.trusted(space))
        if not served:
            return
        sent = time.monotonic()
        rows = await within(self.lease / 2, self._query(dead_letters.WAITING, (served,)))
        waiting: dict[str, list[dead_letters.Letter]] = {}
        for dead, *letter in rows:
            source, source_id, expires_at, payload, deliveries, reason = letter
            waiting.setdefault(dead, []).append(
                (source, source_id, expires_at, bytes(payload), deliveries, reason)
            )
        for dead, letters in waiting.items():
            self._take_in(dead, letters)
        self._arrivals.forget_before(sent)

    def _take_in(self, dead: str, letters: Sequence[dead_letters.Letter], *, loading: bool = False) -> None:
        """Put `letters` into `dead`, a space served here, each under a new id with its delivery
        count and reason, in a change that deletes its row of outrig_dead_letters (fenced by
        `dead`'s ownership). `loading`: read by this claim's load, which knows better than what
        was taken in under an earlier one."""
        engine = self._spaces.get(dead)
        journal = self._pg_journal
        if engine is None or journal is None or not letters:
            return
        journal.check()
        now = self.clock.time()
        for source, source_id, expires_at, payload, deliveries, reason in letters:
            key = (source, source_id)
            if not loading and not self._arrivals.fresh(key):
                continue
            records: list[Record] = []
            if expires_at is None or expires_at > now:  # else its lease ran out on the way
                try:
                    records += self._received(
                        dead, engine, codec.stored_entry(payload), expires_at, deliveries, reason
                    )
                except SpaceError as err:  # its quota: the letter waits for the next look
                    log.warning("space %r: dead letter %s/%d not taken in: %s", dead, source, source_id, err)
                    continue
            records.append(("dead_letter_taken", dead, source, source_id))
            _, waiter = journal.submit(records)  # its own future: told of a refusal too
            assert waiter is not None
            self._arrivals.watch(key, waiter)

    def _move_dead_letter(self, space: str, engine: SpaceEngine, stored: StoredEntry, reason: str) -> None:
        """`stored` (removed from `space`'s engine) goes to the dead-letter space, in one change:
        straight into it when this server serves it (the memory backend's move: a change of both
        spaces, fenced by both), else through a row of outrig_dead_letters that its owner takes
        in (dead_letters.py); nobody owns it yet: this server claims it, and its load takes the
        entry in."""
        journal = self._pg_journal
        assert journal is not None
        journal.check()
        dead = engine.dead_letter_space
        self._in_move = True  # its records go through `note`: see there
        try:
            if dead in self._spaces and self.owners.trusted(dead):
                super()._move_dead_letter(space, engine, stored, reason)
                return
            self._moved = None  # nothing here for a failed nack to take back
            self.note(dead_letters.leaving(space, stored, dead, reason, self.clock.time()))
        finally:
            self._in_move = False
        # Claimed once the letter's row has committed: a claim whose load read the table before
        # then would miss the row and take it in only at its next look (a third of a lease later),
        # and a read of the dead-letter space right after the nack would find it empty.
        task = asyncio.current_task()
        committed = None if task is None else self._moves.get(task)
        if committed is None or committed.done():
            self._claim_dead_letter_space(dead)
        else:
            committed.add_done_callback(lambda _: self._claim_dead_letter_space(dead))

    def _claim_dead_letter_space(self, dead: str) -> None:
        if dead not in self._spaces and dead not in self._moving and not (self._draining or self.closing):
            self._start_claim(dead)  # refused (and logged) if another server owns it

    def note(self, records: Sequence[Record]) -> None:
        """Bookkeeping nobody waits for; but a dead letter's move is a change a nack answers for:
        its own future is kept for the task that made it (`nack` looks at it), as the move may be
        refused on its own (a change of other spaces than the nack's) when a space was lost."""
        if not self._in_move or self._pg_journal is None:
            super().note(records)
            return
        _, moved = self._pg_journal.submit(records)
        assert moved is not None
        moved.add_done_callback(_retrieve)
        task = asyncio.current_task()
        if task is not None:
            self._moves[task] = moved

    def _received(
        self,
        dead: str,
        engine: SpaceEngine,
        entry: NewEntry,
        expires_at: float | None,
        deliveries: int,
        reason: str,
    ) -> list[Record]:
        """Write a dead letter into `dead` (served here): a new id, what remains of its lease,
        its delivery count and reason; the records of it."""
        now = self.clock.time()
        lease = math.inf if expires_at is None else max(expires_at - now, 0.0)
        (stored,), _ = engine.write_entries([entry], lease, carried=(deliveries, reason))
        records: list[Record] = [
            ("put", dead, stored.id, stored.arrival, stored.expires_at, stored.payload),
            ("visibility", dead, stored.id, None, None, deliveries, reason, 0),
        ]
        records += [
            ("type", dead, name, json.dumps(list(parents))) for name, parents in engine.declared.items()
        ]
        if self._recorder is not None:
            records += self._recorder.id_records(dead, engine)
        return records

    async def _rebalance(self, others: list[LiveServer]) -> None:
        """Move one space to the least loaded server when this one serves two more than it: a
        server that joins gets its share, a space at a time (each move is a short pause for that
        space's clients, whose retries carry them to the new owner)."""
        target = min(others, key=lambda server: (server.spaces, server.server))
        now = time.monotonic()
        settled = now - self._started_at > 2 * self.lease
        if not settled or len(self.owners.epochs) <= target.spaces + 1 or not target.address:
            return
        movable = [
            space
            for space in self._spaces
            if now - self._claimed_at.get(space, 0.0) > REBALANCE_AFTER * self.lease
        ]
        if movable:
            space = min(movable, key=lambda name: self._spaces[name].statistics().entries)
            log.info("rebalancing: space %r to %s (%s)", space, target.server, target.address)
            await self._hand_over(space, target)

    async def _hand_over(self, space: str, target: LiveServer) -> None:
        """Stop serving `space` here and give it to `target`: new calls are refused (naming the
        target) at once; what is already in the journal commits; then the ownership passes under
        a new epoch, so that nothing later from here can commit."""
        self._moving[space] = target.address
        epoch = self.owners.epochs.get(space)
        try:
            # Dropped from memory, but still this server's in the database (and renewed) until
            # the changes already journaled have committed under its epoch.
            if space in self._spaces:
                self._dropped["moved"] += 1
            self.drop_space(
                space, NotOwnerError(f"space {space!r} moved to {target.address}", target.address)
            )
            self._claimed_at.pop(space, None)
            if self._recorder is not None:
                await self._recorder.caught_up()
            if epoch is not None:
                await within(self.lease, self.owners.hand_over(space, target.server, epoch))
        finally:
            self._located[space] = (asyncio.get_running_loop().time() + self.lease, target.address)
            self._moving.pop(space, None)

    def tier_figures(self) -> TierFigures:
        return TierFigures(
            owned=len(self._spaces),
            serving=self.serving,
            claims=self._claims,
            load_seconds=self._load_seconds,
            dropped=dict(self._dropped),
        )

    async def move(self, space: str, to: str) -> str:
        """Hand `space` over to the server `to` names (its id or address; empty: the least loaded
        other live server): the address it moves to."""
        await self._ensure(space)
        if to:
            target = await self.owners.server_named(to)
            if target is None:
                raise InvalidArgumentError(f"to: no live server of the tier is {to!r} (see `outrig spaces`)")
        else:
            others = [s for s in await self.owners.live_servers() if s.server != self.server_id]
            if not others:
                raise NoOtherServerError("to: the tier has no other live server to move the space to")
            target = others[0]
        if target.server == self.server_id:
            return self.owners.address  # already here
        await self._hand_over(space, target)
        return target.address

    async def drain(self) -> list[tuple[str, str]]:
        """Take no new spaces, and hand every space served here to the others, least loaded
        first: (space, address) per space moved."""
        self._draining = True
        await self.owners.set_draining(True)
        moved = []
        for space in sorted(self._spaces):
            others = [s for s in await self.owners.live_servers() if s.server != self.server_id]
            if not others:
                raise NoOtherServerError("drain: the tier has no other live server to hand the spaces to")
            await self._hand_over(space, others[0])
            moved.append((space, others[0].address))
        return moved

    async def locate(self, space: str) -> str | None:
        """None when this server serves `space` (claiming it first if nobody does and this
        server is the least loaded), else the address of the server to forward the call to."""
        if space in self._spaces or self.closing:
            return None  # here (refused here if it cannot be proved: see engine())
        if space in self._moving:
            return self._moving[space]
        cached = self._located.get(space)
        loop = asyncio.get_running_loop()
        if cached is not None and cached[0] > loop.time():
            return cached[1]
        try:
            owner = await within(self.lease, self.owners.owner_of(space))
            if owner is not None and owner.expires_in > 0 and owner.server != self.server_id:
                self._located[space] = (loop.time() + min(_LOCATION_TTL, owner.expires_in), owner.address)
                return owner.address
            if owner is None or owner.server != self.server_id:
                servers = await within(self.lease, self.owners.live_servers())
                least = servers[0] if servers else None
                if (
                    least
                    and least.server != self.server_id
                    and least.address
                    and (self._draining or len(self._spaces) > least.spaces)
                ):
                    return least.address  # a less loaded (or not draining) server claims it
        except (psycopg.Error, OSError, TimeoutError) as err:
            raise StoreUnavailableError(f"PostgreSQL at {self.where} is unreachable: {err}") from None
        try:
            await self._ensure(space)  # this server claims it
        except NotOwnerError as lost:
            if lost.owner:
                return lost.owner  # another server claimed it first: forward there
            raise
        return None

    async def placements(self) -> list[Placement]:
        try:
            return await within(self.lease, self.owners.placements())
        except (psycopg.Error, OSError, TimeoutError) as err:
            raise StoreUnavailableError(f"PostgreSQL at {self.where} is unreachable: {err}") from None

    @property
    def peer_secret(self) -> str:
        return self._secret

    def accepts_peer(self, secret: str) -> bool:
        return bool(self._secret) and hmac.compare_digest(secret.encode(), self._secret.encode())

    # ------------------------------------------------------------------ operations

    async def write(
        self,
        space: str,
        entries: Sequence[NewEntry],
        lease: float | None,
        *,
        request_id: str = "",
        transaction: int = 0,
        visible_at: float | None = None,
    ) -> list[LeaseGrant]:
        await self._ensure(space)
        return await super().write(
            space, entries, lease, request_id=request_id, transaction=transaction, visible_at=visible_at
        )

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
        await self._ensure(space)
        return await super().match(
            space,
            templates,
            take=take,
            max_entries=max_entries,
            timeout=timeout,
            if_exists=if_exists,
            request_id=request_id,
            transaction=transaction,
        )

    async def deliver(
        self,
        space: str,
        templates: Sequence[Template],
        *,
        max_entries: int,
        timeout: float | None,
        ack: float,
        max_deliveries: int = 0,
        request_id: str = "",
        settle: Sequence[int] = (),
    ) -> list[Delivery]:
        await self._ensure(space)
        return await super().deliver(
            space,
            templates,
            max_entries=max_entries,
            timeout=timeout,
            ack=ack,
            max_deliveries=max_deliveries,
            request_id=request_id,
            settle=settle,
        )

    async def ack(self, space: str, receipt: int, *, request_id: str = "") -> None:
        await self._ensure(space)
        await super().ack(space, receipt, request_id=request_id)

    async def ack_many(
        self, space: str, receipts: Sequence[int], *, request_id: str = ""
    ) -> list[DeliveryExpiredError | None]:
        await self._ensure(space)
        return await super().ack_many(space, receipts, request_id=request_id)

    async def nack(self, space: str, receipt: int, delay: float | None, *, request_id: str = "") -> Returned:
        await self._ensure(space)
        task = asyncio.current_task()
        assert task is not None
        self._moves.pop(task, None)  # an earlier call's (a deadline found past): not this one's
        returned = await super().nack(space, receipt, delay, request_id=request_id)
        moved = self._moves.pop(task, None)
        if moved is not None and returned.dead_letter:
            await moved  # as a rule settled with the nack's batch: NotOwnerError if refused
        return returned

    async def extend(self, space: str, receipt: int, seconds: float, *, request_id: str = "") -> float:
        await self._ensure(space)
        return await super().extend(space, receipt, seconds, request_id=request_id)

    async def replay(self, space: str, request_id: str) -> list[StoredEntry]:
        await self._ensure(space)
        return await super().replay(space, request_id)

    async def contents(
        self, space: str, templates: Sequence[Template], max_entries: int, transaction: int = 0
    ) -> AsyncIterator[list[StoredEntry]]:
        await self._ensure(space)
        async for chunk in super().contents(space, templates, max_entries, transaction):
            yield chunk

    async def count(self, space: str, templates: Sequence[Template], transaction: int = 0) -> int:
        await self._ensure(space)
        return await super().count(space, templates, transaction)

    async def subscribe(
        self,
        space: str,
        templates: Sequence[Template],
        lease: float | None,
        *,
        resume: int | None = None,
        transaction: int = 0,
    ) -> MemorySubscription:
        await self._ensure(space)
        return await super().subscribe(space, templates, lease, resume=resume, transaction=transaction)

    async def changes(
        self,
        space: str,
        templates: Sequence[Template],
        kinds: frozenset[str],
        *,
        since: tuple[int, int] | None,
        durable: str = "",
    ) -> MemoryChangeFeed:
        """A feed of the space's log; it ends (NotOwnerError, StoreUnavailableError: UNAVAILABLE)
        when this server drops the space, and the client resumes through the new owner."""
        await self._ensure(space)
        return await super().changes(space, templates, kinds, since=since, durable=durable)

    async def ack_changes(self, space: str, durable: str, position: int) -> None:
        await self._ensure(space)
        await super().ack_changes(space, durable, position)

    async def delete_subscription(self, space: str, durable: str) -> None:
        await self._ensure(space)
        await super().delete_subscription(space, durable)

    async def renew(
        self, space: str, renewals: Sequence[tuple[int, float | None]]
    ) -> list[LeaseGrant | SpaceError]:
        await self._ensure(space)
        return await super().renew(space, renewals)

    async def cancel(self, space: str, lease_ids: Sequence[int]) -> list[SpaceError | None]:
        await self._ensure(space)
        return await super().cancel(space, lease_ids)

    async def begin(self, space: str, lease: float | None) -> LeaseGrant:
        await self._ensure(space)
        return await super().begin(space, lease)

    async def commit(self, space: str, transaction: int) -> None:
        await self._ensure(space)
        await super().commit(space, transaction)

    async def abort(self, space: str, transaction: int) -> None:
        await self._ensure(space)
        await super().abort(space, transaction)

    async def describe(self, space: str) -> SpaceDescription:
        await self._ensure(space)
        return await super().describe(space)

    async def browse(
        self, space: str, templates: Sequence[Template], after: int, max_entries: int
    ) -> tuple[list[StoredEntry], int]:
        await self._ensure(space)
        return await super().browse(space, templates, after, max_entries)

    async def purge(
        self, space: str, templates: Sequence[Template], *, dry_run: bool, max_entries: int
    ) -> int:
        await self._ensure(space)
        return await super().purge(space, templates, dry_run=dry_run, max_entries=max_entries)

    async def cancel_registration(self, space: str, registration_id: int) -> None:
        await self._ensure(space)
        await super().cancel_registration(space, registration_id)
