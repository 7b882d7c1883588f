"""Group commit to PostgreSQL, fenced by ownership: the owner backend's `Journal`.

Changes applied in memory arrive as records (backends/memory/journal.py); those that arrive while
a batch is being written join the next one, so one database transaction serves every change that
arrived meanwhile. A batch's records are first folded into their net effect per row (a write and
the take of the same entry in one batch become one DELETE), then sent as a few `executemany`
statements in one pipeline, then committed; every caller of the batch is answered only after
the COMMIT returned.

Fencing: a batch's first statement locks the `outrig_spaces` rows of the spaces it changes
FOR SHARE and reads their owner and epoch. A change of a space whose epoch is no longer this
server's is not written: its callers get NotOwnerError and the backend drops the space. A claim
by another server is an UPDATE of that row, so it waits for a batch that passed the check to
commit, and every batch after the claim fails the check: nothing is acknowledged by a server
that has lost a space, and the new owner, loading after its claim, sees every acknowledged
change.

Failure: if a batch fails in any other way (the connection lost, a statement refused, no answer
within the owner lease) its outcome may be unknown (a COMMIT sent whose answer never came), so
memory cannot be trusted to equal the database any more: every caller of the batch and of the
open one gets UNAVAILABLE, and `on_uncertain` has the backend drop every space it serves, to load
them again from the database once it is reachable (then a retry with a request id gets the
first call's answer, whichever way the COMMIT went). No undo runs: what is dropped is forgotten.
Until a probe reconnects, `check()` refuses changes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any

import psycopg

from outrig.service.backends.memory.journal import Record, TakenRow, WriteAnswer
from outrig.service.backends.postgres.deadlines import within
from outrig.service.exceptions import NotOwnerError, StoreUnavailableError

log = logging.getLogger("outrig.service.backends.postgres")

# The SQLSTATE outrig_fence fails a batch with (schema.py).
FENCED = "OR001"
# Request ids deleted per batch at most (their window has passed).
PRUNE_LIMIT = 5000


def record_spaces(record: Record) -> str | None:
    """The space a record changes (None for the tier-wide prune)."""
    kind = record[0]
    if kind == "prune_requests":
        return None
    if kind == "request":
        return str(record[2])
    return str(record[1])


class Changes:
    """A batch's records folded into their net effect: per entry and per registration the last
    state (a full row, a deletion, or columns to update), the rest as sets."""

    def __init__(self, dump: Callable[[object], bytes | memoryview]) -> None:
        self._dump = dump
        # (space, id) -> ["put", row] | ["delete"] | ["update", {column: value}]
        self.entries: dict[tuple[str, int], list[Any]] = {}
        self.registrations: dict[tuple[str, int], list[Any]] = {}
        self.types: dict[tuple[str, str], list[str]] = {}
        self.next_ids: dict[str, int] = {}
        self.requests: dict[str, tuple[Any, ...]] = {}
        self.transactions: dict[tuple[str, int], bool] = {}  # True: open, False: ended
        self.prune_before: float | None = None

    def add(self, records: Iterable[Record]) -> None:
        for kind, *args in records:
            getattr(self, "_" + kind)(*args)

    @staticmethod
    def _update(
        table: dict[tuple[str, int], list[Any]], key: tuple[str, int], column: str, value: Any
    ) -> None:
        state = table.get(key)
        if state is None:
            table[key] = ["update", {column: value}]
        elif state[0] in ("put", "update"):
            state[1][column] = value
        # after a deletion: nothing to update

    def _put(
        self, space: str, entry_id: int, arrival: int, expires_at: float | None, payload: object
    ) -> None:
        row = {"arrival": arrival, "expires_at": expires_at, "payload": self._dump(payload)}
        self.entries[(space, entry_id)] = ["put", row]

    def _delete(self, space: str, entry_id: int) -> None:
        self.entries[(space, entry_id)] = ["delete"]

    def _entry_expiry(self, space: str, entry_id: int, expires_at: float | None) -> None:
        self._update(self.entries, (space, entry_id), "expires_at", expires_at)

    def _take(self, space: str, entry_id: int, request_id: str, position: int) -> None:
        self._update(self.entries, (space, entry_id), "taken", (request_id, position))

    def _next_id(self, space: str, mark: int) -> None:
        self.next_ids[space] = max(mark, self.next_ids.get(space, 0))

    def _type(self, space: str, name: str, supertypes: str) -> None:
        self.types.setdefault((space, name), list(json.loads(supertypes)))  # the first, as stored

    def _register(
        self, space: str, registration_id: int, expires_at: float | None, templates: bytes, sequence: int
    ) -> None:
        row = {"expires_at": expires_at, "templates": templates, "sequence": sequence}
        self.registrations[(space, registration_id)] = ["put", row]

    def _unregister(self, space: str, registration_id: int) -> None:
        self.registrations[(space, registration_id)] = ["delete"]

    def _registration_expiry(self, space: str, registration_id: int, expires_at: float | None) -> None:
        self._update(self.registrations, (space, registration_id), "expires_at", expires_at)

    def _sequence(self, space: str, registration_id: int, sequence: int) -> None:
        state = self.registrations.get((space, registration_id))
        if state is not None and state[0] != "delete" and "sequence" in state[1]:
            sequence = max(sequence, state[1]["sequence"])  # numbers only grow
        self._update(self.registrations, (space, registration_id), "sequence", sequence)

    def _request(self, request_id: str, space: str, kind: str, *answer: Any) -> None:
        self.requests[request_id] = (request_id, space, kind, *answer)

    def _transaction(self, space: str, transaction: int) -> None:
        self.transactions[(space, transaction)] = True

    def _transaction_end(self, space: str, transaction: int) -> None:
        self.transactions[(space, transaction)] = False

    def _prune_requests(self, now: float) -> None:
        self.prune_before = now

    def script(self, spaces: Sequence[str]) -> list[str]:
        """The statements that apply the changes, values inlined (see `literal`): a batch goes to
        PostgreSQL as one simple query, one round trip however many changes it holds. `spaces`:
        those this server owns (a prune touches only theirs)."""
        out: list[str] = []
        deleted: dict[str, list[int]] = {}
        puts: list[str] = []
        expiries: list[str] = []
        takes: list[str] = []
        for (space, entry_id), state in self.entries.items():
            if state[0] == "delete":
                deleted.setdefault(space, []).append(entry_id)
            elif state[0] == "put":
                row = state[1]
                taken_by, position = row.get("taken", (None, None))
                puts.append(
                    _row(
                        space, entry_id, row["arrival"], row["expires_at"], row["payload"], taken_by, position
                    )
                )
            else:
                columns = state[1]
                if "expires_at" in columns:
                    expiries.append(_row(space, entry_id, columns["expires_at"]))
                if "taken" in columns:
                    request_id, position = columns["taken"]
                    takes.append(_row(space, entry_id, request_id, position))
        for space, ids in deleted.items():
            out.append(
                f"DELETE FROM outrig_entries WHERE space = {literal(space)} "
                f"AND id IN ({', '.join(map(str, ids))})"
            )
        if puts:
            out.append(
                "INSERT INTO outrig_entries "
                "(space, id, arrival, expires_at, payload, taken_by, taken_position) "
                f"VALUES {', '.join(puts)} ON CONFLICT (space, id) DO UPDATE SET arrival = EXCLUDED.arrival, "
                "expires_at = EXCLUDED.expires_at, payload = EXCLUDED.payload, taken_by = EXCLUDED.taken_by, "
                "taken_position = EXCLUDED.taken_position"
            )
        if expiries:
            out.append(
                "UPDATE outrig_entries AS e SET expires_at = v.x::float8 FROM (VALUES "
                f"{', '.join(expiries)}) AS v (space, id, x) WHERE e.space = v.space AND e.id = v.id"
            )
        if takes:
            out.append(
                "UPDATE outrig_entries AS e SET taken_by = v.r, taken_position = v.p::integer FROM (VALUES "
                f"{', '.join(takes)}) AS v (space, id, r, p) WHERE e.space = v.space AND e.id = v.id"
            )
        deleted_registrations: list[str] = []
        put_registrations: list[str] = []
        registration_updates: list[str] = []
        for (space, registration_id), state in self.registrations.items():
            if state[0] == "delete":
                deleted_registrations.append(_row(space, registration_id))
            elif state[0] == "put":
                row = state[1]
                put_registrations.append(
                    _row(space, registration_id, row["expires_at"], row["templates"], row["sequence"])
                )
            else:
                columns = state[1]
                registration_updates.append(
                    _row(
                        space,
                        registration_id,
                        "expires_at" in columns,
                        columns.get("expires_at"),
                        columns.get("sequence", 0),
                    )
                )
        if deleted_registrations:
            out.append(
                "DELETE FROM outrig_registrations AS g USING (VALUES "
                f"{', '.join(deleted_registrations)}) AS v (space, id) "
                "WHERE g.space = v.space AND g.id = v.id"
            )
        if put_registrations:
            out.append(
                "INSERT INTO outrig_registrations (space, id, expires_at, templates, sequence) VALUES "
                f"{', '.join(put_registrations)} ON CONFLICT (space, id) DO UPDATE SET "
                "expires_at = EXCLUDED.expires_at, templates = EXCLUDED.templates, "
                "sequence = EXCLUDED.sequence"
            )
        if registration_updates:
            out.append(
                "UPDATE outrig_registrations AS g SET "
                "expires_at = CASE WHEN v.e THEN v.x::float8 ELSE g.expires_at END, "
                "sequence = greatest(g.sequence, v.q) FROM (VALUES "
                f"{', '.join(registration_updates)}) AS v (space, id, e, x, q) "
                "WHERE g.space = v.space AND g.id = v.id"
            )
        if self.types:
            rows = ", ".join(
                _row(space, name, supertypes) for (space, name), supertypes in self.types.items()
            )
            out.append(
                f"INSERT INTO outrig_types (space, name, supertypes) VALUES {rows} "
                "ON CONFLICT (space, name) DO NOTHING"
            )
        if self.next_ids:
            rows = ", ".join(_row(space, mark) for space, mark in self.next_ids.items())
            out.append(
                f"UPDATE outrig_spaces AS s SET next_id = greatest(s.next_id, v.n) FROM (VALUES {rows}) "
                "AS v (space, n) WHERE s.space = v.space"
            )
        if self.requests:
            rows = ", ".join(_row(*answer) for answer in self.requests.values())
            out.append(
                "INSERT INTO outrig_requests "
                "(id, space, kind, expires_at, first_id, count, lease_expires_at, granted) "
                f"VALUES {rows} ON CONFLICT (id) DO UPDATE SET space = EXCLUDED.space, "
                "kind = EXCLUDED.kind, expires_at = EXCLUDED.expires_at, first_id = EXCLUDED.first_id, "
                "count = EXCLUDED.count, lease_expires_at = EXCLUDED.lease_expires_at, "
                "granted = EXCLUDED.granted"
            )
        opened = [_row(*key) for key, open_ in self.transactions.items() if open_]
        ended = [_row(*key) for key, open_ in self.transactions.items() if not open_]
        if opened:
            out.append(
                f"INSERT INTO outrig_open_transactions (space, id) VALUES {', '.join(opened)} "
                "ON CONFLICT DO NOTHING"
            )
        if ended:
            out.append(
                "DELETE FROM outrig_open_transactions AS t USING "
                f"(VALUES {', '.join(ended)}) AS v (space, id) "
                "WHERE t.space = v.space AND t.id = v.id"
            )
        if self.prune_before is not None and spaces:
            expired = (
                f"SELECT id FROM outrig_requests WHERE space = ANY({literal(list(spaces))}) "
                f"AND expires_at <= {literal(self.prune_before)} ORDER BY expires_at LIMIT {PRUNE_LIMIT}"
            )
            out.append(f"DELETE FROM outrig_entries WHERE taken_by IN ({expired})")
            out.append(f"DELETE FROM outrig_requests WHERE id IN ({expired})")
        return out


def literal(value: Any) -> str:
    """`value` as an SQL literal. Strings are quoted as standard strings (the connection sets
    standard_conforming_strings, so a backslash is itself; a quote is doubled) and never hold a NUL
    (text cannot: protocol/codec refuses one in a request id; names are checked); bytes go as hex."""
    if value is None:
        return "NULL"
    if value is True:
        return "TRUE"
    if value is False:
        return "FALSE"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isfinite(value):
            return repr(value)
        return (
            "'NaN'::float8"
            if math.isnan(value)
            else ("'Infinity'::float8" if value > 0 else "'-Infinity'::float8")
        )
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    if isinstance(value, bytes | bytearray | memoryview):
        return "'\\x" + bytes(value).hex() + "'::bytea"
    if isinstance(value, list | tuple):
        return "ARRAY[" + ", ".join(literal(item) for item in value) + "]::text[]"
    raise TypeError(f"no SQL literal for {type(value).__name__}")


def _row(*values: Any) -> str:
    return "(" + ", ".join(literal(value) for value in values) + ")"


class _Change:
    """One operation's records, its space, the epoch of this server's ownership of the space when
    the change was made, and its caller's future."""

    __slots__ = ("epoch", "records", "space", "waiter")

    def __init__(
        self, records: Sequence[Record], waiter: asyncio.Future[None] | None, epochs: dict[str, int]
    ) -> None:
        self.records = records
        spaces = {record_spaces(record) for record in records}
        spaces.discard(None)
        # An operation changes one space (a prune: none).
        self.space: str | None = next(iter(spaces)) if len(spaces) == 1 else None
        assert len(spaces) <= 1, f"one operation changed several spaces: {sorted(map(str, spaces))}"
        self.epoch = None if self.space is None else epochs.get(self.space)
        self.waiter = waiter


class _Batch:
    __slots__ = ("changes", "future")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.changes: list[_Change] = []
        self.future: asyncio.Future[None] = loop.create_future()
        self.future.add_done_callback(_retrieve)


def _retrieve(future: asyncio.Future[None]) -> None:
    if not future.cancelled():
        future.exception()


def _resolve(future: asyncio.Future[None] | None, error: BaseException | None) -> None:
    if future is None or future.done():
        return
    if error is None:
        future.set_result(None)
    else:
        future.set_exception(error)


class PgJournal:
    """The group committer of one owner server (see the module docstring)."""

    waits = True  # a server that may lose a space acknowledges only what is committed

    def __init__(
        self,
        connect: Callable[[], Awaitable[psycopg.AsyncConnection[Any]]],
        query: Callable[[str, Sequence[Any]], Awaitable[list[tuple[Any, ...]]]],
        server_id: str,
        epochs: dict[str, int],
        dump: Callable[[object], bytes | memoryview],
        where: str,
        *,
        deadline: float,
        probe_interval: float = 1.0,
    ) -> None:
        """`connect()` opens the journal's own connection; `query` runs a read elsewhere;
        `epochs` is the live map of the spaces this server owns to the epoch of each; `where`
        names the database in messages (host and port, never a password); a batch that takes
        longer than `deadline` seconds counts as failed."""
        self._connect = connect
        self._query = query
        self._server_id = server_id
        self._epochs = epochs
        self._dump = dump
        self._where = where
        self._deadline = deadline
        self._probe_interval = probe_interval
        self._connection: psycopg.AsyncConnection[Any] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._open: _Batch | None = None
        self._writing: _Batch | None = None
        self._task: asyncio.Task[None] | None = None
        self._overdue: asyncio.TimerHandle | None = None
        self._idle = asyncio.Event()
        self._idle.set()
        self._failure: StoreUnavailableError | None = None
        self._probing: asyncio.Task[None] | None = None
        self._closing = False
        self.batches = 0
        self.operations = 0
        self.commit_seconds = 0.0
        self.on_batch: Callable[[float, int], None] | None = None
        # Told of spaces whose epoch moved on (lost), and of a failure after which memory cannot
        # be trusted (every space must be dropped).
        self.on_lost: Callable[[set[str]], None] = lambda spaces: None
        self.on_uncertain: Callable[[], None] = lambda: None
        self.on_recovered: Callable[[], None] = lambda: None

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._connection = await self._connect()

    @property
    def healthy(self) -> bool:
        return self._failure is None

    # ------------------------------------------------------------------ the loop side

    def check(self) -> None:
        if self._failure is not None:
            raise self._failure

    def submit(
        self, records: Sequence[Record], undo: Callable[[], None] | None = None, *, own: bool = True
    ) -> tuple[asyncio.Future[None], asyncio.Future[None] | None]:
        self.check()
        loop = self._loop
        assert loop is not None, "start() the journal first"
        batch = self._open
        if batch is None:
            batch = self._open = _Batch(loop)
            self._idle.clear()
            if self._writing is None:
                loop.call_soon(self._begin)
        waiter: asyncio.Future[None] | None = loop.create_future() if own else None
        batch.changes.append(_Change(records, waiter, self._epochs))
        return batch.future, waiter

    def note(self, records: Sequence[Record]) -> None:
        if self._failure is None:
            self.submit(records, own=False)

    def keepalive(self) -> None:
        """While idle, send an empty batch: a connection that died while nothing was written is
        noticed (and replaced) before a change depends on it."""
        if self._failure is None and self._open is None and self._writing is None and self._loop:
            self.submit([], own=False)

    @property
    def pending(self) -> asyncio.Future[None] | None:
        batch = self._open or self._writing
        return None if batch is None else batch.future

    def discard(self, spaces: set[str], error: BaseException) -> None:
        """Changes of `spaces` not yet being written fail with `error` (the spaces are dropped)."""
        batch = self._open
        if batch is None:
            return
        kept = []
        for change in batch.changes:
            if change.space in spaces:
                _resolve(change.waiter, error)
            else:
                kept.append(change)
        batch.changes = kept

    def _begin(self) -> None:
        batch = self._open
        if batch is None or self._writing is not None or self._failure is not None:
            return
        self._open, self._writing = None, batch
        loop = self._loop
        assert loop is not None
        # The deadline is a timer, not a wrapping task: one hop less per batch (each costs a loop
        # iteration, long under load), and an overdue batch fails at once, not when psycopg has
        # finished cancelling its query (which over a silent link takes a timeout of its own).
        task = self._task = loop.create_task(self._write(batch), name="outrig-pg-batch")
        self._overdue = loop.call_later(self._deadline, self._abandon, batch, task)

    def _abandon(self, batch: _Batch, task: asyncio.Task[None]) -> None:
        """The batch has taken longer than the deadline: it failed (its outcome is unknown)."""
        if self._writing is not batch:
            return
        self._writing = None
        task.cancel()
        self._fail(batch, TimeoutError(f"no answer within {self._deadline:.1f} s"))

    async def _write(self, batch: _Batch) -> None:
        started = time.perf_counter()
        error: Exception | None = None
        written: list[_Change] = []
        refused: list[_Change] = []
        try:
            written, refused = await self._commit(batch)
        except Exception as err:  # psycopg.Error, OSError: the outcome is unknown
            error = err
        if self._writing is not batch:
            return  # abandoned at its deadline: failed already
        if self._overdue is not None:
            self._overdue.cancel()
        self._writing = None
        if error is not None:
            self._fail(batch, error)
            return
        self.batches += 1
        self.operations += len(written)
        seconds = time.perf_counter() - started
        self.commit_seconds += seconds
        if self.on_batch is not None:
            self.on_batch(seconds, sum(len(change.records) for change in written))
        if refused:
            lost = {str(change.space) for change in refused}
            refusal = NotOwnerError(
                f"this server no longer owns space(s) {', '.join(sorted(lost))}: nothing of the "
                "change was acknowledged; retry (the SDK does) and it reaches the new owner"
            )
            for change in refused:
                _resolve(change.waiter, refusal)
            self.discard(lost, refusal)
            self.on_lost(lost)
        for change in written:
            _resolve(change.waiter, None)
        _resolve(batch.future, None)
        if self._open is not None:
            self._begin()
        else:
            self._idle.set()

    async def _commit(self, batch: _Batch) -> tuple[list[_Change], list[_Change]]:
        """Write the batch's changes whose epoch is still current: (written, refused).

        The usual case is one round trip: BEGIN, the fence (`outrig_fence`, which fails the
        transaction if any space has moved on), the statements and COMMIT, pipelined. Only when
        the fence fails does a second transaction find which spaces were lost and write the rest.
        """
        connection = self._connection
        if connection is None or connection.closed:
            raise psycopg.OperationalError("no connection")
        epochs = self._epochs
        written: list[_Change] = []
        refused: list[_Change] = []
        for change in batch.changes:  # made under an epoch this server has since left: stale
            stale = change.space is not None and epochs.get(change.space) != change.epoch
            (refused if stale else written).append(change)
        try:
            await self._transaction(connection, written, {c.space: c.epoch for c in written if c.space})
        except psycopg.Error as err:
            if err.sqlstate != FENCED:
                raise
        else:
            return written, refused
        # Fenced: which spaces are still this server's?
        spaces = sorted({change.space for change in written if change.space is not None})
        cursor = await connection.execute(
            "SELECT space, epoch FROM outrig_spaces WHERE space = ANY(%s) AND owner = %s",
            (spaces, self._server_id),
        )
        current = dict(await cursor.fetchall())
        kept: list[_Change] = []
        for change in written:
            fenced = change.space is not None and current.get(change.space) != change.epoch
            (refused if fenced else kept).append(change)
        await self._transaction(connection, kept, {c.space: c.epoch for c in kept if c.space})
        return kept, refused

    async def _transaction(
        self,
        connection: psycopg.AsyncConnection[Any],
        changes: list[_Change],
        fence: dict[str | None, int | None],
    ) -> None:
        """BEGIN, the fence, the changes and COMMIT as one simple query: one round trip."""
        folded = Changes(self._dump)
        for change in changes:
            folded.add(change.records)
        spaces = sorted(str(space) for space in fence)
        statements = ["BEGIN"]
        if spaces:
            statements.append(
                f"SELECT outrig_fence({literal(self._server_id)}, {literal(spaces)}, "
                f"ARRAY[{', '.join(str(fence[space]) for space in spaces)}]::bigint[])"
            )
        statements += folded.script(list(self._epochs))
        statements.append("COMMIT")
        try:
            await connection.execute(";\n".join(statements).encode())
        except psycopg.Error:
            if not connection.closed:
                with contextlib.suppress(psycopg.Error):
                    await connection.execute(b"ROLLBACK")
            raise

    def _fail(self, batch: _Batch, err: Exception) -> None:
        later, self._open = self._open, None
        failed = [each for each in (batch, later) if each is not None]
        uncertain = any(change.records for each in failed for change in each.changes)
        self._failure = StoreUnavailableError(
            f"PostgreSQL at {self._where} did not confirm a commit ({type(err).__name__}: {err}); "
            "nothing of it was acknowledged. This server serves no space until it reaches the "
            "database again."
        )
        if uncertain:
            log.error("commit to PostgreSQL at %s failed; dropping every space: %s", self._where, err)
        else:
            log.warning("the journal's link to PostgreSQL at %s failed while idle: %s", self._where, err)
        for each in failed:
            for change in each.changes:
                _resolve(change.waiter, self._failure)
            _resolve(each.future, self._failure)
        self._idle.set()
        if uncertain:  # memory may differ from the database: forget it all
            self.on_uncertain()
        connection, self._connection = self._connection, None
        if connection is not None:
            self._spawn_close(connection)
        if not self._closing:
            assert self._loop is not None
            self._probing = self._loop.create_task(self._probe(), name="outrig-pg-probe")

    def _spawn_close(self, connection: psycopg.AsyncConnection[Any]) -> None:
        async def close() -> None:
            with contextlib.suppress(Exception):
                await connection.close()

        assert self._loop is not None
        self._loop.create_task(close())

    async def _connect_and_probe(self) -> psycopg.AsyncConnection[Any]:
        connection = await self._connect()
        await connection.execute("SELECT 1")
        return connection

    async def _probe(self) -> None:
        while self._failure is not None and not self._closing:
            await asyncio.sleep(self._probe_interval)
            try:
                connection = await within(self._deadline, self._connect_and_probe())
            except Exception as err:
                log.warning("PostgreSQL at %s still unreachable: %s", self._where, err)
                continue
            self._connection = connection
            self._failure = None
            log.warning("PostgreSQL at %s reachable again: serving resumes", self._where)
            self.on_recovered()

    # ------------------------------------------------------------------ reads

    async def write_answer(self, request_id: str) -> WriteAnswer:
        ((first_id, count, expires_at, granted),) = await self._query(
            "SELECT first_id, count, lease_expires_at, granted FROM outrig_requests WHERE id = %s",
            (request_id,),
        )
        return first_id, count, expires_at, granted

    async def taken_rows(self, request_id: str) -> list[TakenRow]:
        rows = await self._query(
            "SELECT id, expires_at, payload FROM outrig_entries WHERE taken_by = %s ORDER BY taken_position",
            (request_id,),
        )
        return [(entry_id, expires_at, bytes(payload)) for entry_id, expires_at, payload in rows]

    async def close(self) -> None:
        """Write what is queued, then stop and close the connection."""
        self._closing = True
        if self._open is not None and self._writing is None and self._failure is None:
            self._begin()
        await self._idle.wait()
        if self._probing is not None:
            self._probing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._probing
        if self._connection is not None:
            with contextlib.suppress(Exception):
                await self._connection.close()
            self._connection = None
        if self.batches:
            log.info(
                "journal closed: %d batches, %d operations (%.1f per batch), %.2f ms per batch",
                self.batches,
                self.operations,
                self.operations / self.batches,
                1000 * self.commit_seconds / self.batches,
            )
