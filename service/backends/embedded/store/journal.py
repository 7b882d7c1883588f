"""Group commit: changes applied in memory are written to SQLite together, one fsync per batch.

Each change to a space (a write, a take, a renewal ...) is applied to the in-memory engine at
once, on the event loop, and submitted here as records. Records submitted while the previous
batch is being written join the next batch, so one transaction and one fsync serve every change
that arrived meanwhile: the busier the server, the fuller the batches. With the `always` policy
the caller awaits its batch before replying, so nothing is acknowledged before it is durable; with
`interval` the caller replies at once and batches are written every `interval` seconds (a crash
loses the last interval's acknowledged changes, as documented).

A batch that cannot be written (full disk, failing fsync) is rolled back by SQLite, and the
changes of that batch and of every later one are undone in memory, newest first, so memory again
equals the store; their callers get UNAVAILABLE. (Under `interval`, a take already answered is
not undone: its caller holds the entries, and putting them back would hand them out twice. See
Recorder.commit.) Until a probe transaction succeeds again (tried
every `probe_interval`), `check()` refuses new changes with UNAVAILABLE while reads go on. The
connection is reopened before each probe: after a failed fsync the file's state in the page cache
cannot be trusted (the PostgreSQL "fsyncgate" lesson), so nothing retries on the old handle.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from outrig.service.backends.embedded.store import statements
from outrig.service.backends.embedded.store.schema import connect, transaction
from outrig.service.backends.memory.journal import BatchEnd, Record, TakenRow, WriteAnswer
from outrig.service.exceptions import StoreUnavailableError

log = logging.getLogger("outrig.service.backends.embedded.store")

# Request ids deleted from the store per batch at most (their window has passed).
PRUNE_LIMIT = 5000


@dataclass(frozen=True, slots=True)
class BatchStatistics:
    """How group commit has gone: batches written, the operations and records (rows changed) in
    them, and the time spent writing them."""

    batches: int
    operations: int
    records: int
    commit_seconds: float


class _SpaceNumbers(dict[str, int]):
    """Each space's number in `spaces`, by name: made at the name's first use (`__missing__`). The
    statements look numbers up as `numbers[name]`, a dict lookup in C for all but the first, not
    a method call each (two a pair)."""

    def __init__(self, connection: sqlite3.Connection) -> None:
        super().__init__()
        self._connection = connection

    def __missing__(self, name: str) -> int:
        execute = self._connection.execute
        execute("INSERT OR IGNORE INTO spaces (name, next_id) VALUES (?, 1)", (name,))
        number: int = execute("SELECT no FROM spaces WHERE name = ?", (name,)).fetchone()[0]
        self[name] = number
        return number


class _Writer:
    """Applies records to the database: the statements on the event loop, the COMMIT (and its
    fsync) on the journal's thread, never both at once.

    Statements only change SQLite's page cache and take microseconds each, so they run on the
    loop; the store thread then needs the interpreter once per batch, not once per statement.
    Only the COMMIT, which waits for the disk, runs off the loop.
    """

    def __init__(self, connection: sqlite3.Connection, dump: Callable[[object], bytes | memoryview]) -> None:
        self.connection = connection
        # One cursor for the batches' statements, BEGIN and COMMIT: `connection.execute` makes a
        # cursor per statement (and a weak reference to it, which the connection lists), about
        # 1,500 instructions a statement made and freed. The loop and the store thread never use
        # it at once (a batch's statements, then its COMMIT).
        self._cursor = connection.cursor()
        self._dump = dump
        self._space_numbers = _SpaceNumbers(connection)
        self._prune_before: float | None = None

    def apply(self, records: Sequence[Record]) -> None:
        """Begin a transaction and run the records' statements (on the loop): one `executemany`
        per kind of record where their rows allow it (statements.py)."""
        cursor = self._cursor
        cursor.execute("BEGIN IMMEDIATE")
        try:
            self._prune_before = statements.run(cursor, records, self._space_numbers, self._dump)
        except BaseException:
            self.rollback()
            raise

    def commit(self) -> None:
        """Commit, which writes and fsyncs the WAL (on the journal's thread). Bulk deletions run
        here too: each is one SQLite step, in C with the GIL released, so it costs the loop
        nothing however many rows it removes."""
        try:
            if self._prune_before is not None:
                self._delete_expired_requests(self._prune_before)
            self._cursor.execute("COMMIT")
        except BaseException:
            self.rollback()
            raise

    def rollback(self) -> None:
        with contextlib.suppress(sqlite3.Error):
            if self.connection.in_transaction:
                self.connection.execute("ROLLBACK")

    def _delete_expired_requests(self, now: float) -> None:
        """Request ids whose window ended: the requests rows, and the taken rows, which hold a
        take's id themselves (format 5), each in the order of its window's end (their keys)."""
        execute = self.connection.execute
        execute(
            "DELETE FROM entries WHERE rowid IN (SELECT rowid FROM entries "
            "WHERE taken_by IS NOT NULL AND taken_until <= ? ORDER BY taken_until LIMIT ?)",
            (now, PRUNE_LIMIT),
        )
        expired = "SELECT expires_at, id FROM requests WHERE expires_at <= ? ORDER BY expires_at, id LIMIT ?"
        execute(f"DELETE FROM requests WHERE (expires_at, id) IN ({expired})", (now, PRUNE_LIMIT))


class _StoreThread:
    """The journal's one thread: runs the callables the loop hands it, in order.

    Cheaper than a ThreadPoolExecutor for the commit of every batch: `submit` is one put on a
    SimpleQueue (C code) with no concurrent.futures.Future, work item or idle-semaphore check;
    the commit reports back with its own `call_soon_threadsafe`. Started at the first submit.
    """

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[tuple[Callable[..., object], tuple[Any, ...]] | None] = (
            queue.SimpleQueue()
        )
        self._thread: threading.Thread | None = None

    def submit(self, function: Callable[..., object], *args: Any) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="outrig-store", daemon=True)
            self._thread.start()
        self._queue.put((function, args))

    async def call(self, function: Callable[[], object]) -> Any:
        """Run `function` on the thread; its result (or its exception) here."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()

        def run() -> None:
            try:
                result = function()
            except BaseException as err:  # handed to the caller
                loop.call_soon_threadsafe(_settle, future, None, err)
            else:
                loop.call_soon_threadsafe(_settle, future, result, None)

        self.submit(run)
        return await future

    def stop(self) -> None:
        """Finish what was submitted, then end the thread."""
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()
            self._thread = None

    def _run(self) -> None:
        get = self._queue.get
        while (item := get()) is not None:
            function, args = item
            try:
                function(*args)
            except BaseException:  # the thread must outlive a bug in one call
                log.exception("the store thread's call failed")


def _settle(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.done():  # its caller was cancelled meanwhile
        return
    if error is None:
        future.set_result(result)
    else:
        future.set_exception(error)


class _Batch:
    """Changes that will be committed together: their records, their undos, the future readers
    of not-yet-durable entries wait on, the callbacks its end runs (`Journal.when_done`), and one
    future per waiting caller."""

    __slots__ = ("done", "future", "operations", "records", "undos", "waiters")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.records: list[Record] = []
        self.operations = 0
        self.undos: list[Callable[[], None]] = []
        self.waiters: list[asyncio.Future[None]] = []
        self.done: list[BatchEnd] = []
        self.future: asyncio.Future[None] = loop.create_future()

    def resolve(self, error: BaseException | None) -> None:
        """The batch's future, then its callbacks, here and in order (each a loop iteration's
        handle less than a done callback's), then its callers' futures: so the callbacks have
        run when a caller resumes, as the done callbacks, scheduled first, had."""
        future = self.future
        if not future.done():
            if error is None:
                future.set_result(None)
            else:
                future.set_exception(error)
                # A batch nobody awaits (interval policy) must not log "exception never retrieved".
                future.exception()
        for callback in self.done:
            try:
                callback(future)
            except Exception:  # the others must still run, and every caller must hear
                log.exception("a callback of a batch's end failed")
        for waiter in self.waiters:
            if waiter.done():  # a caller that was cancelled meanwhile
                continue
            if error is None:
                waiter.set_result(None)
            else:
                waiter.set_exception(error)


class Journal:
    """The group committer of one store (see the module docstring).

    It is driven by callbacks, not a task: the store thread hands a finished commit back with
    one `call_soon_threadsafe`, whose callback resolves the callers' futures and starts the next
    batch at once. Under load every loop iteration is long, so each hop saved is latency saved.
    """

    def __init__(
        self,
        path: Path,
        connection: sqlite3.Connection,
        dump: Callable[[object], bytes | memoryview],
        *,
        wait: bool = True,
        interval: float = 0.0,
        probe_interval: float = 1.0,
    ) -> None:
        self._path = path
        self._dump = dump
        self.waits = wait
        self.keeps_changes = True  # it records the change log (memory/journal.py)
        self._interval = interval
        self._probe_interval = probe_interval
        self._writer = _Writer(connection, dump)
        self._executor = _StoreThread()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._open: _Batch | None = None  # accepting records
        self._writing: _Batch | None = None  # being written
        self._scheduled = False  # a start of the open batch is due
        self._idle = asyncio.Event()  # nothing open, nothing being written
        self._idle.set()
        self._probing: asyncio.Task[None] | None = None
        self._closing = False
        self._failure: StoreUnavailableError | None = None
        self._batches = 0
        self._changes = 0
        self._operations = 0
        self._commit_seconds = 0.0
        self.on_batch: Callable[[float, int], None] | None = None  # told of each commit (metrics)

    # ------------------------------------------------------------------ the loop side

    def check(self) -> None:
        """Raise StoreUnavailableError while the store cannot take changes."""
        if self._failure is not None:
            raise self._failure

    def submit(
        self, records: Sequence[Record], undo: Callable[[], None] | None = None, *, own: bool = True
    ) -> tuple[asyncio.Future[None], asyncio.Future[None] | None]:
        """Queue a change already applied in memory. Returns (the batch's future, the caller's
        own future, if `own`): both resolve once the change is durable, or fail with
        StoreUnavailableError after `undo` has reverted it in memory. Await only your own; the
        batch's is shared."""
        if self._failure is not None:  # `check`, inline: a durable operation submits twice
            raise self._failure
        loop = self._loop
        assert loop is not None, "start() the journal first"
        batch = self._open
        if batch is None:
            batch = self._open = _Batch(loop)
            self._idle.clear()
            self._schedule()
        batch.records += records
        batch.operations += 1
        if undo is not None:
            batch.undos.append(undo)
        if not own:
            return batch.future, None
        waiter: asyncio.Future[None] = loop.create_future()
        batch.waiters.append(waiter)
        return batch.future, waiter

    def note(self, records: Sequence[Record]) -> None:
        """Queue bookkeeping nobody waits for (expired leases, pruning); dropped while failed."""
        if self._failure is None:
            self.submit(records, own=False)

    def when_done(self, future: asyncio.Future[None], callback: BatchEnd) -> None:
        """Call `callback(future)` once `future`, a batch's from `submit`, is done: for the open
        batch or the one being written, in the callback that resolves it, before its callers'
        futures (no loop iteration's handle of its own, as `add_done_callback` would make);
        otherwise as a done callback. (An optional method of memory/journal.py's protocol.)"""
        for batch in (self._open, self._writing):
            if batch is not None and batch.future is future:
                batch.done.append(callback)
                return
        future.add_done_callback(callback)

    @property
    def pending(self) -> asyncio.Future[None] | None:
        """The future of the last batch not yet durable, if any."""
        batch = self._open or self._writing
        return None if batch is None else batch.future

    async def read(self, sql: str, parameters: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Run a query between batches (for the rare reads made while serving: a retry's result)."""
        while self._writing is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(self._writing.future)
        return self._writer.connection.execute(sql, parameters).fetchall()

    async def write_answer(self, request_id: str, until: float) -> WriteAnswer:
        ((first_id, count, expires_at, granted),) = await self.read(
            "SELECT first_id, count, lease_expires_at, granted FROM requests WHERE expires_at = ? AND id = ?",
            (until, request_id),
        )
        return first_id, count, expires_at, granted

    async def taken_rows(self, request_id: str, until: float) -> list[TakenRow]:
        rows = await self.read(
            "SELECT id, expires_at, payload FROM entries WHERE taken_until = ? AND taken_by = ? "
            "ORDER BY taken_position",
            (until, request_id),
        )
        return [(entry_id, expires_at, payload) for entry_id, expires_at, payload in rows]

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Serve on `loop`: the one the changes are submitted from."""
        self._loop = loop

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
        await self._executor.call(self._writer.connection.close)
        self._executor.stop()
        stats = self.statistics()
        if stats.batches:
            log.info(
                "store closed: %d batches, %d operations (%.1f per batch), %.2f ms per batch",
                stats.batches,
                stats.operations,
                stats.operations / stats.batches,
                1000 * stats.commit_seconds / stats.batches,
            )

    def statistics(self) -> BatchStatistics:
        return BatchStatistics(self._batches, self._operations, self._changes, self._commit_seconds)

    def _schedule(self) -> None:
        """Start the open batch soon: after this loop iteration, so the changes that arrive in it
        join; or after the interval under the `interval` policy."""
        if self._scheduled or self._writing is not None or self._loop is None:
            return
        self._scheduled = True
        if self._interval and not self._closing:
            self._loop.call_later(self._interval, self._begin)
        else:
            self._loop.call_soon(self._begin)

    def _begin(self) -> None:
        """Run the open batch's statements here, on the loop, and hand its COMMIT to the thread."""
        self._scheduled = False
        batch = self._open
        if batch is None or self._writing is not None or self._failure is not None:
            return
        self._open, self._writing = None, batch
        started = time.perf_counter()
        writer = self._writer
        try:
            writer.apply(batch.records)
        except Exception as err:  # sqlite3.Error, OSError, or a bug: never acknowledge the batch
            self._finished(batch, started, err)
            return
        self._executor.submit(self._commit, writer, batch, started)

    def _commit(self, writer: _Writer, batch: _Batch, started: float) -> None:
        """On the store thread: COMMIT (and fsync), then hand the outcome back to the loop."""
        error: Exception | None = None
        try:
            writer.commit()
        except Exception as err:
            error = err
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self._finished, batch, started, error)

    def _finished(self, batch: _Batch, started: float, error: Exception | None) -> None:
        self._writing = None
        if error is not None:
            self._fail(batch, error)
        else:
            self._batches += 1
            self._operations += batch.operations
            self._changes += len(batch.records)
            seconds = time.perf_counter() - started
            self._commit_seconds += seconds
            if self.on_batch is not None:
                self.on_batch(seconds, len(batch.records))
            batch.resolve(None)
        if self._open is not None and self._failure is None:
            self._schedule()
        elif self._open is None:
            self._idle.set()

    def _fail(self, batch: _Batch, err: Exception) -> None:
        self._failure = StoreUnavailableError(
            f"the store in {self._path.parent} cannot persist changes ({err}); nothing of them was "
            f"acknowledged. Reads go on; changes resume once the store is writable again."
        )
        log.error("store write failed, changes refused until the store is writable again: %s", err)
        later, self._open = self._open, None
        failed = [batch] if later is None else [batch, later]
        for each in reversed(failed):
            for undo in reversed(each.undos):
                try:
                    undo()
                except Exception:  # the others must still run, and every caller must hear
                    log.exception("undoing a change the store could not persist failed")
        for each in failed:
            each.resolve(self._failure)
        self._idle.set()
        if not self._closing:
            self._probing = asyncio.get_running_loop().create_task(self._probe(), name="outrig-store-probe")

    async def _probe(self) -> None:
        while self._failure is not None:
            await asyncio.sleep(self._probe_interval)
            try:
                await self._executor.call(self._reopen_and_probe)
            except sqlite3.Error as err:
                log.warning("store still not writable: %s", err)
                continue
            log.warning("store writable again; accepting changes")
            self._failure = None

    def _reopen_and_probe(self) -> None:
        with contextlib.suppress(sqlite3.Error):
            self._writer.connection.close()
        connection = connect(self._path)
        self._writer = _Writer(connection, self._dump)
        with transaction(connection):
            connection.execute(
                "INSERT OR REPLACE INTO meta (key, value) VALUES ('last_probe', ?)", (f"{time.time():.3f}",)
            )
