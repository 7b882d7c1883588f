"""The memory backend: one in-memory `SpaceEngine` per named space, driven from the event loop,
optionally recorded by a group-commit `Journal` (memory/journal.py): SQLite in a data dir (the
embedded backend, backends/embedded) or PostgreSQL (the owner backend, backends/postgres).

A read or take that finds nothing parks a future in the engine and awaits it, so a blocked call
holds no thread. A reaper task expires leases in bounded batches, yielding between them, so mass
expiry never stalls request handling.

Durability: with a journal, every change is applied in memory at once and handed, as records
with an undo, to the `Recorder` (recorder.py), whose journal commits the changes that
arrive together in one transaction (group commit). A change whose records cannot be made or
handed over is undone in memory before the call fails: memory never holds what the store was
not told of, and no call is acknowledged for what it did not apply.

Takes with an acknowledgement deadline (deliver, ack, nack, extend) and dead letters come from
`DeliveringMixin` in memory/deliveries.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import math
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Sequence
from typing import Any

from outrig.service.backends.base import Placement, SpaceFigures, TierFigures
from outrig.service.backends.memory.changes import ChangesMixin
from outrig.service.backends.memory.deliveries import DeliveringMixin, visibility_record
from outrig.service.backends.memory.idempotency import Outcome, RequestLog
from outrig.service.backends.memory.journal import Journal, Record
from outrig.service.backends.memory.recorder import Recorder
from outrig.service.backends.memory.subscription import SHUTTING_DOWN, MemorySubscription
from outrig.service.config import ServerConfig
from outrig.service.engine import inspection
from outrig.service.engine.clock import Clock, SystemClock
from outrig.service.engine.leases import check_lease_duration
from outrig.service.engine.model import (
    LeaseGrant,
    NewEntry,
    StoredEntry,
    Template,
    Transaction,
    TransactionOutcome,
    TransactionState,
    Waiter,
)
from outrig.service.engine.partitions import split_name, template_partitions
from outrig.service.engine.space import SpaceEngine
from outrig.service.exceptions import (
    CrossPartitionError,
    LeaseNotFoundError,
    NoOtherServerError,
    QuotaExceededError,
    RegistrationBusyError,
    ShuttingDownError,
    SpaceError,
    TransactionAbortedError,
    TransactionNotFoundError,
)
from outrig.service.protocol import codec

log = logging.getLogger("outrig.service")

# Candidates a contents call checks before it lets other requests run.
_SLICE = 1024
# Transactions whose end is remembered, so that a retried commit or abort gets its answer.
_ENDED_REMEMBERED = 100_000
# Entries a purge removes (one store batch) before it lets other requests run.
PURGE_BATCH = 1024
# Candidates a browse looks at per entry of a page asked for, at most (a bounded page).
_BROWSE_SCAN = 16


def _commit_marker(space: str, transaction: int) -> str:
    """The request id under which a durable commit is recorded, to answer a commit retried
    across a restart. A transaction's id is a lease id of its space, so the space is in it too
    (spaces number their leases apart: transaction 5 of one space is not another's)."""
    return f"outrig:commit:{transaction}:{space}"


def _abort_marker(space: str, transaction: int) -> str:
    """Likewise for an abort, where the store keeps open transactions (an abort answered by a
    server that then died is answered again by the next owner, and a late commit told)."""
    return f"outrig:abort:{transaction}:{space}"


def _written_records(space: str, entries: Iterable[StoredEntry], txn: Transaction) -> list[Record]:
    """Entries written under `txn`, as the store keeps them for it until it commits."""
    return [("written", space, s.id, s.arrival, s.expires_at, s.payload, txn.id) for s in entries]


def _nothing_found(future: asyncio.Future[list[StoredEntry]]) -> None:
    """A parked read's or take's deadline: it found nothing, unless something was delivered first."""
    if not future.done():
        future.set_result([])


class _Acting:
    """`MemoryBackend._acting_for`'s context: a failure (any exception, cancellation included)
    abandons the call's request id. A class rather than a generator's context manager: it is on
    every write's, read's and take's path, and costs a quarter as much to enter and leave (0.26
    against 1.12 us)."""

    __slots__ = ("_outcome", "_requests")

    def __init__(self, requests: RequestLog, outcome: Outcome | None) -> None:
        self._requests = requests
        self._outcome = outcome

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, error: object, trace: object) -> None:
        if kind is not None and self._outcome is not None:
            self._requests.abandon(self._outcome)


class MemoryBackend(DeliveringMixin, ChangesMixin):
    """Spaces in memory, recorded by a journal when a subclass opens one (`open_store`)."""

    keeps_transactions = False
    """Whether open transactions are recorded as they go (their writes, takes, read locks and
    lease), so that whoever loads the space next rebuilds them: the owner tier, where a space
    moves between servers. Otherwise a transaction lives in memory until it commits, and aborts
    with the process."""

    def __init__(self, config: ServerConfig, clock: Clock | None = None) -> None:
        self.config = config
        self.clock = clock or SystemClock()
        self._spaces: dict[str, SpaceEngine] = {}
        self._reaper: asyncio.Task[None] | None = None
        # The reaper's next pass (clock time), and what wakes it sooner: a deadline or a delay
        # filed before then (`_timer_filed`), so that hidden entries show again on time.
        self._next_pass = math.inf
        self._wake = asyncio.Event()
        self.closing = False
        # Blocked reads and takes, per space.
        self._parked: dict[str, set[asyncio.Future[list[StoredEntry]]]] = {}
        self._recorder: Recorder | None = None
        self._requests = RequestLog(config.request_window, self.clock)
        self._subscriptions: dict[tuple[str, int], MemorySubscription] = {}
        self._ended_transactions: dict[tuple[str, int], TransactionState] = {}
        self._init_delivering()
        self._init_changes()

    @property
    def keeps_registrations(self) -> bool:
        """Whether registrations survive a restart (a durable server)."""
        return self._recorder is not None

    @property
    def journal(self) -> Journal | None:
        return None if self._recorder is None else self._recorder.journal

    def engine(self, name: str) -> SpaceEngine:
        """The named space, created with its configured settings on first use."""
        engine = self._spaces.get(name)
        if engine is None:
            if self.closing:
                raise ShuttingDownError(SHUTTING_DOWN)
            limit = self.config.limits.max_spaces
            if len(self._spaces) >= limit:
                raise QuotaExceededError(
                    f"space {name!r} would be space number {limit + 1}; the limit is max_spaces={limit}"
                )
            engine = self._spaces[name] = SpaceEngine(name, self.config.space_settings(name), self.clock)
            if self._recorder is not None:
                engine.on_expired = lambda entry_id: self.note([("delete", name, entry_id)])
            # Aborts by lease expiry too, so that a late commit is told it aborted.
            engine.on_transaction_end = lambda outcome: self._transaction_ended(name, outcome)
            engine.on_timer = self._timer_filed
            self._watch_dead_letters(name, engine)
            self._watch_changes(name, engine)
        return engine

    def _transaction_ended(self, space: str, outcome: TransactionOutcome) -> None:
        """Any end of a transaction, its lease's (the reaper, a lazy expiry) too. A commit, abort
        or cancel also puts the end in its own change, which it awaits: the journal folds the
        two into one (they are noted in the same loop iteration, so in the same batch)."""
        self._ended(space, outcome.transaction.id, outcome.transaction.state)
        if self._keeping_transactions and space in self._spaces:
            self.note([("transaction_end", space, outcome.transaction.id)])

    @property
    def _keeping_transactions(self) -> bool:
        return self.keeps_transactions and self._recorder is not None

    def drop_space(self, name: str, error: SpaceError) -> None:
        """Forget a space this server no longer serves (another owns it now, or the store's
        state is uncertain): its blocked calls and notify streams end with `error`, and nothing
        of it is recorded (the store keeps what it holds; whoever serves the space next loads
        it from there)."""
        engine = self._spaces.pop(name, None)
        if engine is None:
            return
        for future in self._parked.pop(name, set()):
            if not future.done():
                future.set_exception(error)
        subscriptions = [key for key in self._subscriptions if key[0] == name]
        for key in subscriptions:
            self._subscriptions.pop(key).end(error)
        self._end_feeds(name, error)
        self._forget_changes(name)
        self._requests.forget_space(name)
        if self._recorder is not None:
            self._recorder.forget_space(name)

    # ------------------------------------------------------------------ life cycle

    def serving_at(self, address: str) -> None:
        """A lone server needs no address of its own."""

    async def start(self) -> None:
        await self.open_store()  # nothing is served before start() returns
        self._reaper = asyncio.create_task(self._reap_forever(), name="outrig-reaper")

    async def open_store(self) -> None:
        """Open the store and load what it holds (`use_journal`); in memory only: nothing."""

    def use_journal(self, journal: Journal) -> None:
        """Record every change from now on in `journal`."""
        self._recorder = Recorder(journal, self._requests)
        for name, engine in self._spaces.items():  # their change hooks, for the recorder
            self._watch_changes(name, engine)

    async def close(self) -> None:
        """Stop taking work: end blocked calls and notify streams. The store stays open for
        in-flight calls until `shutdown`."""
        self.closing = True
        # Blocked reads and takes end now, with UNAVAILABLE, rather than being cut off at the end
        # of the grace period.
        for parked in self._parked.values():
            for future in parked:
                if not future.done():
                    future.set_exception(ShuttingDownError(SHUTTING_DOWN))
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper
        for engine in self._spaces.values():
            engine.close()
        self._end_feeds(None, ShuttingDownError(SHUTTING_DOWN))

    async def shutdown(self) -> None:
        """The server has stopped: write what is queued and close the store."""
        if self._recorder is not None:
            await self._recorder.journal.close()
            self._recorder = None

    def _timer_filed(self, until: float) -> None:
        if until < self._next_pass:
            self._next_pass = until
            self._wake.set()

    async def _until_next_pass(self) -> None:
        """Wait reap_interval, or less when a hidden entry's timer is due sooner (one filed
        meanwhile too): a pass then shows it again on time, not up to reap_interval late."""
        now = self.clock.time()
        soonest = min(
            (due for engine in self._spaces.values() if (due := engine.next_timer()) is not None),
            default=math.inf,
        )
        self._next_pass = now + min(self.config.reap_interval, max(0.0, soonest - now))
        while (wait := self._next_pass - self.clock.time()) > 0:
            self._wake.clear()
            try:
                async with asyncio.timeout(wait):
                    await self._wake.wait()  # a sooner timer was filed: `_next_pass` moved
            except TimeoutError:
                return

    async def _reap_forever(self) -> None:
        batch = self.config.reap_batch
        while True:
            await self._until_next_pass()
            for engine in list(self._spaces.values()):
                try:
                    while engine.reap(batch) >= batch:  # noqa: ASYNC110 - bounded batches, not a wait
                        await asyncio.sleep(0)  # let requests run between batches
                except Exception:  # the engine refiled what it could not reap: the next pass retries
                    log.exception("reaping space %r failed", engine.name)
                self._trim_changes(engine)
            pruned = 0
            while (step := self._requests.prune(batch)) >= batch:
                pruned += step
                await asyncio.sleep(0)
            if pruned + step:
                self.note([("prune_requests", self.clock.time())])

    # ------------------------------------------------------------------ the store

    def note(self, records: Sequence[Record]) -> None:
        """Record bookkeeping nobody waits for (expiries, sequence numbers)."""
        if self._recorder is not None:
            self._recorder.note(records)

    def _check_store(self) -> None:
        if self._recorder is not None:
            self._recorder.check()

    async def _commit(
        self,
        records: Sequence[Record],
        undo: Callable[[], None] | None,
        written: Iterable[StoredEntry] = (),
        outcome: Outcome | None = None,
        *,
        hands_out: bool = False,
    ) -> None:
        if self._recorder is not None:
            await self._recorder.commit(records, undo, written, outcome, hands_out=hands_out)

    async def settled(self, entries: Sequence[StoredEntry]) -> bool:
        """Wait until the writes of `entries` are durable; False if one of them failed."""
        return self._recorder is None or await self._recorder.settled(entries)

    def forget_subscription(self, space: str, registration_id: int) -> None:
        if self._subscriptions.pop((space, registration_id), None) is not None and not self.closing:
            if space not in self._spaces:
                return  # dropped: the registration lives on in the store
            self.note([("unregister", space, registration_id)])

    async def _replay(self, request_id: str, space: str, kind: str) -> Any:
        """The earlier result of a retried call, or None if this call must act."""
        while True:
            outcome = self._requests.find(request_id, space, kind)
            if outcome is None:
                return None
            if outcome.done is not None and not outcome.done.done():
                await asyncio.shield(outcome.done)  # the first call is still in flight
                continue
            if self._recorder is None or outcome.result is not None:
                return outcome.result  # an in-memory server's, or a call under a transaction's
            return await self._recorder.stored_result(outcome)

    def _acting_for(self, outcome: Outcome | None) -> _Acting:
        """A first call with a request id is acting: if it fails, the id is forgotten so that a
        retry acts afresh (unless its change is already queued: see RequestLog.abandon)."""
        return _Acting(self._requests, outcome)

    def _acted(self, outcome: Outcome | None, result: Any, *, keep: bool = False) -> None:
        """The first call with a request id acted; an in-memory server keeps its result, and so
        does a durable one for a call under a transaction (which the store does not see). A
        durable call's batch has already finished its id (`Recorder._batch_done` runs before its
        caller resumes): its `record` is set, and nothing is left to do but keeping a result."""
        if outcome is not None and (outcome.record is None or keep):
            self._requests.finish(outcome, result if keep or self._recorder is None else None)

    @staticmethod
    def _transaction(engine: SpaceEngine, transaction: int) -> Transaction | None:
        return engine.transaction(transaction) if transaction else None

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
        # `_replay` only when the id is known (a coroutine less for every first call).
        requests = self._requests
        if (
            request_id
            and request_id in requests.ids
            and requests.find(request_id, space, "write") is not None
        ):
            earlier = await self._replay(request_id, space, "write")
            if earlier is not None:
                return list(earlier)
        engine = self._spaces.get(space)  # engine()'s and _transaction()'s, inline: frames less
        if engine is None:
            engine = self.engine(space)
        txn = engine.transaction(transaction) if transaction else None
        recorder = self._recorder
        if recorder is not None:
            recorder.journal.check()  # Recorder.check's, a frame less
        # In memory the write never waits, so no retry can come while it acts: its id is recorded
        # once it has acted (`RequestLog.acted`), without an `Outcome` begun and finished.
        outcome = requests.begin(request_id, space, "write") if request_id and recorder is not None else None
        try:  # _acting_for's, inline (a pair's write and take: an object and two calls less)
            written, granted = engine.write_entries(entries, lease, txn, visible_at)
            if len(written) == 1:  # a pair's write: no list comprehension's frame
                grants = [LeaseGrant(written[0].id, written[0].expires_at, granted)]
            else:
                grants = [LeaseGrant(stored.id, stored.expires_at, granted) for stored in written]
            if recorder is not None and txn is not None and not self.keeps_transactions:
                # The store learns of the entries at commit; their ids are reserved now.
                self.note(recorder.id_records(space, engine))
            elif recorder is not None:
                undo = functools.partial(engine.revoke, written)
                try:  # the write is applied in memory: if making its records fails, undo it
                    records = self._write_records(space, engine, written, grants, outcome, txn)
                except BaseException:
                    undo()
                    raise
                # Recorder.commit's wait here: not through _commit nor commit, two coroutines less
                waiter = recorder.enqueue(records, undo, written, outcome)
                if waiter is not None:
                    await waiter
        except BaseException:
            if outcome is not None:
                self._requests.abandon(outcome)
            raise
        if outcome is not None:
            self._acted(outcome, grants, keep=txn is not None)
        elif request_id:
            requests.acted(request_id, space, "write", grants)
        return grants

    def _write_records(
        self,
        space: str,
        engine: SpaceEngine,
        written: list[StoredEntry],
        grants: list[LeaseGrant],
        outcome: Outcome | None,
        txn: Transaction | None = None,
    ) -> list[Record]:
        recorder = self._recorder
        assert recorder is not None
        if txn is not None:  # recorded as the transaction's: invisible to others until it commits
            records = _written_records(space, written, txn)
        elif len(written) == 1:  # a pair's write: no list comprehension's frame
            s = written[0]
            records = [("put", space, s.id, s.arrival, s.expires_at, s.payload)]
        else:
            records = [("put", space, s.id, s.arrival, s.expires_at, s.payload) for s in written]
        if written[0].hidden_until is not None:  # a delayed write (never under a transaction)
            records += [visibility_record(space, s) for s in written]
        if engine.declared:  # types this write declared first
            records += [
                ("type", space, name, json.dumps(list(parents))) for name, parents in engine.declared.items()
            ]
        records += recorder.id_records(space, engine)
        if outcome is not None:
            # Ids of one write are consecutive (a partition's, its stride apart), with one lease:
            # four numbers say it all.
            first = grants[0]
            assert grants[-1].id == first.id + (len(grants) - 1) * engine.id_stride
            records.append(
                (
                    *recorder.request_head(outcome),
                    first.id,
                    len(grants),
                    first.expires_at,
                    first.granted,
                )
            )
        return records

    @staticmethod
    @contextlib.contextmanager
    def _undone_on_error(undo: Callable[[], None]) -> Iterator[None]:
        """A change is applied in memory: if making its records fails, undo it before raising."""
        try:
            yield
        except BaseException:
            undo()
            raise

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
        # `_replay` only when the id is known (a coroutine less for every first call).
        requests = self._requests
        if request_id and request_id in requests.ids and requests.find(request_id, space, "take") is not None:
            earlier = await self._replay(request_id, space, "take")
            if earlier is not None:
                return list(earlier)
        engine = self._spaces.get(space)  # as in write
        if engine is None:
            engine = self.engine(space)
        txn = engine.transaction(transaction) if transaction else None
        recorder = self._recorder
        if take and recorder is not None:
            recorder.journal.check()  # _check_store's, two frames less
        # In memory a take waits only when it parks: its id is begun then, and one that found at
        # once is recorded once it has acted (as a write's is).
        outcome = requests.begin(request_id, space, "take") if request_id and recorder is not None else None
        try:  # _acting_for's, inline (see write)
            # _find's first step inline: a pair's take finds at once, without a coroutine of its own
            found, conflicted = engine.find_or_conflict(
                templates, take=take, max_entries=max_entries, txn=txn
            )
            if not (found or timeout == 0 or (if_exists and not conflicted)):
                if request_id and outcome is None:
                    outcome = requests.begin(request_id, space, "take")
                found = await self._park(engine, templates, take, max_entries, timeout, if_exists, txn)
            if take and found and recorder is not None and txn is None:
                waiter = self._enqueue_take(space, engine, found, outcome)
                if waiter is not None:  # awaited here: a coroutine less than a _commit_take
                    try:
                        await waiter
                    except asyncio.CancelledError:
                        self._take_cancelled(space, engine, found, outcome)
                        raise
            elif found and txn is not None and self._keeping_transactions:
                await self._commit_holds(space, engine, txn, found, take, outcome)
            elif found and not take and self._recorder is not None and not await self.settled(found):
                self._check_store()
                return []
        except BaseException:
            if outcome is not None:
                self._requests.abandon(outcome)
            raise
        if take and not found and outcome is not None:
            # A take that took nothing leaves nothing to answer: its retry acts afresh (as on a
            # durable store, which records nothing for it), and a partitioned space's fan-out
            # (transport/fanout.py) may take with the same id again in a later round.
            self._requests.abandon(outcome)
            return found
        if outcome is not None:
            self._acted(outcome, found, keep=txn is not None)
        elif request_id and found:
            requests.acted(request_id, space, "take", found)
        return found

    async def replay(self, space: str, request_id: str) -> list[StoredEntry]:
        """What a take with `request_id` took in `space` (within the window), or []: takes nothing."""
        earlier = await self._replay(request_id, space, "take")
        return [] if earlier is None else list(earlier)

    def _enqueue_take(
        self, space: str, engine: SpaceEngine, found: list[StoredEntry], outcome: Outcome | None
    ) -> asyncio.Future[None] | None:
        """Record a take of `found` (`Recorder.enqueue`): the caller's future to await, None if
        nothing is to be awaited (`interval`). A take that waited may resume after the store
        failed: the journal's `submit` then refuses, and `enqueue` undoes the take before any
        of it reaches the store."""
        if outcome is None:
            records: list[Record] = [("delete", space, stored.id) for stored in found]
        else:  # the rows stay, marked, to answer a retry until the request window passes
            # No `request` record: the take records hold the id and its window's end, which both
            # stores keep it by (memory/journal.py), and neither has a row for a take's request.
            request_id, until = outcome.request_id, outcome.expires_at
            if len(found) == 1:  # a pair's take: no list comprehension's frame
                records = [("take", space, found[0].id, request_id, 0, until)]
            else:
                records = [("take", space, s.id, request_id, i, until) for i, s in enumerate(found)]
        recorder = self._recorder
        assert recorder is not None  # only a recorded space's takes come here
        undo = functools.partial(engine.restore, found)  # no closure's cells for engine and found
        return recorder.enqueue(records, undo, outcome=outcome, hands_out=True)

    def _take_cancelled(
        self, space: str, engine: SpaceEngine, found: list[StoredEntry], outcome: Outcome | None
    ) -> None:
        """The caller of a recorded take is gone while it waited for its batch. With a request id
        its retry gets these entries; without one, nobody will: put them back, as a cancelled
        blocked take does."""
        if outcome is None:
            recorder = self._recorder
            assert recorder is not None
            engine.restore(found)
            self.note(
                [("put", space, s.id, s.arrival, s.expires_at, s.payload) for s in found]
                + [visibility_record(space, s) for s in found if s.deliveries]  # its count
                + recorder.id_records(space, engine)
            )

    def _hold_records(
        self,
        space: str,
        engine: SpaceEngine,
        txn: Transaction,
        found: Sequence[StoredEntry],
        request: Outcome | None = None,
    ) -> tuple[list[Record], list[StoredEntry], list[StoredEntry]]:
        """The records of what a call under `txn` was handed (the owner tier): its takes and read
        locks, with the take's request id and positions to answer a retry, and its own writes
        taken back. Returns them, the entries it take-locked, and its own writes it took back."""
        records: list[Record] = []
        taken: list[StoredEntry] = []
        rewritten: list[StoredEntry] = []
        request_id, until = (request.request_id, request.expires_at) if request else (None, None)
        for position, stored in enumerate(found):
            held = engine.held_by(txn, stored)
            if held is None:  # its own write, taken back: as if never written
                rewritten.append(stored)
                records.append(
                    ("take", space, stored.id, request_id, position, until)
                    if request_id
                    else ("delete", space, stored.id)
                )
            elif held != "write":
                if held == "take":
                    taken.append(stored)
                mark = (request_id, position, until) if request_id and held == "take" else (None, None, None)
                records.append(("lock", space, txn.id, stored.id, held, *mark))
        return records, taken, rewritten

    async def _commit_holds(
        self,
        space: str,
        engine: SpaceEngine,
        txn: Transaction,
        found: list[StoredEntry],
        take: bool,
        outcome: Outcome | None,
    ) -> None:
        """Record what a read or take under `txn` claimed before it answers (the owner tier), so
        that a new owner rebuilds the transaction holding it."""
        records, taken, rewritten = self._hold_records(space, engine, txn, found, outcome)
        if outcome is not None:
            records.append((*Recorder.request_head(outcome), None, len(found), None, None))
        if not records:
            return

        def give_back() -> None:
            if txn.active:
                engine.untake(txn, taken)
                engine.rewrite(txn, rewritten)

        try:
            await self._commit(records, give_back, outcome=outcome, hands_out=take)
        except asyncio.CancelledError:
            # The caller is gone: with a request id its retry gets these entries; without one,
            # the transaction gets them back, as a cancelled blocked take under it does.
            if outcome is None and take and txn.active:
                give_back()
                self.note(
                    [("unlock", space, txn.id, s.id) for s in taken] + _written_records(space, rewritten, txn)
                )
            raise

    async def _find(
        self,
        engine: SpaceEngine,
        templates: Sequence[Template],
        take: bool,
        max_entries: int,
        timeout: float | None,
        if_exists: bool,
        txn: Transaction | None = None,
        *,
        ack: float | None = None,
        max_deliveries: int = 0,
    ) -> list[StoredEntry]:
        """What a read or take finds, waiting up to `timeout` for it; with `ack`, a take with an
        acknowledgement deadline (memory/deliveries.py): what it finds is delivered, not removed."""
        if ack is None:
            found, conflicted = engine.find_or_conflict(
                templates, take=take, max_entries=max_entries, txn=txn
            )
        else:
            found = [d.entry for d in engine.deliver(templates, max_entries, ack, max_deliveries)]
            conflicted = False
        # if_exists (read_if_exists, take_if_exists) waits only while the entries it could use are
        # locked by other transactions.
        if found or timeout == 0 or (if_exists and not conflicted):
            return found
        return await self._park(
            engine,
            templates,
            take,
            max_entries,
            timeout,
            if_exists,
            txn,
            ack=ack,
            max_deliveries=max_deliveries,
        )

    async def _park(
        self,
        engine: SpaceEngine,
        templates: Sequence[Template],
        take: bool,
        max_entries: int,
        timeout: float | None,
        if_exists: bool,
        txn: Transaction | None = None,
        *,
        ack: float | None = None,
        max_deliveries: int = 0,
    ) -> list[StoredEntry]:
        """`_find`'s wait, when it found nothing at once: park a waiter until a delivery, the
        timeout or the caller's cancellation."""
        if self.closing:
            raise ShuttingDownError(SHUTTING_DOWN)
        limit = self.config.limits.max_waiters
        if engine.waiting >= limit:
            raise QuotaExceededError(
                f"space {engine.name!r} has {engine.waiting} blocked reads and takes; "
                f"the limit is max_waiters={limit}"
            )
        loop = asyncio.get_running_loop()
        future: asyncio.Future[list[StoredEntry]] = loop.create_future()

        def deliver(entries: list[StoredEntry]) -> bool:
            if future.done():
                return False
            future.set_result(entries)
            return True

        waiter = Waiter(
            engine.new_waiter_seq(),
            tuple(templates),
            take,
            deliver,
            max_entries,
            txn=txn,
            if_exists=if_exists,
            wants=lambda: not future.done(),  # cancelled, timed out or shut down: not any more
            ack=ack,
            max_deliveries=max_deliveries,
        )
        engine.park(waiter)
        parked = self._parked.setdefault(engine.name, set())
        parked.add(future)
        # The deadline is a timer of the loop's that answers "nothing found", not asyncio.timeout,
        # which binds the task current when it is entered: nothing here depends on which task
        # runs the call, so a Mux stream starts a blocking read or take without a task of its
        # own, and gives it one only if it parks (transport/mux.py). A delivery that landed first
        # is the call's (`deliver` and the timer each act only on a future not yet done).
        timer = None if timeout is None else loop.call_later(timeout, _nothing_found, future)
        try:
            found = await future
        except asyncio.CancelledError:
            delivered = future.done() and not future.cancelled() and future.exception() is None
            if take and delivered:  # the caller is gone: put the entries back
                if ack is not None:  # in their place, the delivery not counted
                    back = engine.undeliver(engine.delivery_of(s) for s in future.result() if s.receipt)
                    self.note([visibility_record(engine.name, s) for s in back])
                elif txn is None:
                    engine.restore(future.result(), logged=False)  # its take was not logged yet
                elif txn.active:
                    engine.untake(txn, future.result())
            raise
        finally:
            if timer is not None:
                timer.cancel()
            engine.unpark(waiter)
            parked.discard(future)
        if take and ack is None and txn is None:
            engine.log_taken(found)  # recorded with the take's own records (engine.log_taken)
        return found

    async def contents(
        self, space: str, templates: Sequence[Template], max_entries: int, transaction: int = 0
    ) -> AsyncIterator[list[StoredEntry]]:
        engine = self.engine(space)
        txn = self._transaction(engine, transaction)
        # With a bound and an order (or matchers), only the first matches: the rest, only if some
        # of those turn out gone or locked (then every candidate, less those looked at).
        candidates, more = engine.first_candidates(templates, max_entries)
        chunk = self.config.limits.contents_chunk
        left = max_entries or len(candidates)
        ready: list[StoredEntry] = []
        start = 0
        while start < len(candidates):
            for stored in candidates[start : start + _SLICE]:
                if engine.visible(templates, stored, txn):
                    if txn is not None:
                        engine.read_lock(txn, stored)  # what a transaction lists, it has read
                    ready.append(stored)
                    left -= 1
                    if len(ready) == chunk or not left:
                        await self._settle_chunk(space, engine, txn, ready)
                        yield ready
                        ready = []
                    if not left:
                        return
            start += _SLICE
            if start >= len(candidates) and more:
                seen = {stored.id for stored in candidates}
                candidates = [stored for stored in engine.candidates(templates) if stored.id not in seen]
                start, more = 0, False
            await asyncio.sleep(0)  # a slice at a time: a large space never holds the loop
        if ready:
            await self._settle_chunk(space, engine, txn, ready)
            yield ready

    async def _settle_chunk(
        self, space: str, engine: SpaceEngine, txn: Transaction | None, chunk: list[StoredEntry]
    ) -> None:
        """Before a contents chunk goes out: its entries' writes are durable, and under a
        transaction of the owner tier, the read locks it took are recorded."""
        if txn is not None and self._keeping_transactions:
            records = self._hold_records(space, engine, txn, chunk)[0]
            if records:
                await self._commit(records, None)
        await self.settled(chunk)

    async def count(self, space: str, templates: Sequence[Template], transaction: int = 0) -> int:
        engine = self.engine(space)
        number = engine.count(templates, self._transaction(engine, transaction))
        if self._recorder is not None:
            await self._recorder.caught_up()  # count nothing a crash could take back
        return number

    async def subscribe(
        self,
        space: str,
        templates: Sequence[Template],
        lease: float | None,
        *,
        resume: int | None = None,
        transaction: int = 0,
    ) -> MemorySubscription:
        engine = self.engine(space)
        if resume is not None:
            return self._resume(space, engine, resume)
        txn = self._transaction(engine, transaction)
        self._check_store()
        limit = self.config.limits.max_registrations
        if engine.registered >= limit:
            raise QuotaExceededError(
                f"space {space!r} has {engine.registered} notify registrations; "
                f"the limit is max_registrations={limit}"
            )
        # Encoded before anything changes: the record must not be what fails once it has.
        stored_templates = codec.templates_bytes(templates) if self._recorder is not None else b""
        subscription = MemorySubscription(self, space, engine)
        registration, grant = engine.register(
            tuple(templates), lease, subscription.on_event, subscription.on_end, txn
        )
        subscription.registration = registration
        subscription.grant = grant
        subscription.attached = True
        self._subscriptions[(space, registration.seq)] = subscription
        if self._recorder is not None and txn is None:  # one under a transaction ends with it
            records: list[Record] = [
                ("register", space, grant.id, grant.expires_at, stored_templates, 0),
                *self._recorder.id_records(space, engine),
            ]
            await self._commit(records, subscription.close)
        return subscription

    def _resume(self, space: str, engine: SpaceEngine, registration_id: int) -> MemorySubscription:
        subscription = self._subscriptions.get((space, registration_id))
        if subscription is None or engine.registration(registration_id) is None:
            raise LeaseNotFoundError(
                f"resume: registration {registration_id} in space {space!r} is unknown or has ended"
            )
        if subscription.attached:
            raise RegistrationBusyError(
                f"resume: registration {registration_id} in space {space!r} already has a listener"
            )
        base, k = split_name(space)
        partitioning = self.config.partitioning(base)
        registration = engine.registration(registration_id)
        spans = (
            k is not None
            and partitioning is not None
            and registration is not None
            and template_partitions(registration.templates, partitioning) != {k}
        )
        if spans:
            # One of a fan-out's registrations (transport/fanout.py): the others ended with
            # their stream, so this one alone would hear of a part of the space.
            subscription.close()
            raise CrossPartitionError(
                f"resume: registration {registration_id} of space {base!r} listened on every "
                "partition (its templates do not name the routing field): register again"
            )
        subscription.attached = True
        return subscription

    def restore_subscription(
        self,
        space: str,
        registration_id: int,
        templates: tuple[Template, ...],
        expires_at: float | None,
        sequence: int,
    ) -> None:
        """Put back a registration recovered from the store, waiting for its listener to resume."""
        engine = self.engine(space)
        subscription = MemorySubscription(self, space, engine)
        subscription.stored_sequence = sequence
        subscription.registration = engine.restore_registration(
            registration_id, templates, expires_at, sequence, subscription.on_event, subscription.on_end
        )
        self._subscriptions[(space, registration_id)] = subscription

    def reserve_ids(self, space: str, mark: int) -> None:
        """The store has reserved ids below `mark` for `space` (recovery)."""
        if self._recorder is not None:
            self._recorder.reserve_ids(space, mark)

    def restore_request(self, request_id: str, space: str, kind: str, expires_at: float) -> None:
        self._requests.restore(request_id, space, kind, expires_at)

    async def renew(
        self, space: str, renewals: Sequence[tuple[int, float | None]]
    ) -> list[LeaseGrant | SpaceError]:
        for _, duration in renewals:  # a duration nobody may ask for refuses the whole call
            check_lease_duration(duration, "duration")
        engine = self.engine(space)
        self._check_store()
        results: list[LeaseGrant | SpaceError] = []
        records: list[Record] = []
        previous: list[tuple[int, float | None]] = []

        def undo() -> None:
            for lease_id, old in reversed(previous):
                engine.set_expiry(lease_id, old)

        with self._undone_on_error(undo):
            for lease_id, duration in renewals:
                try:
                    old = engine.lease_expiry(lease_id)
                    grant = engine.renew(lease_id, duration)
                except SpaceError as err:
                    results.append(err)
                    continue
                results.append(grant)
                previous.append((lease_id, old))
                if engine.is_transaction(lease_id):
                    if self.keeps_transactions:
                        records.append(("transaction_expiry", space, lease_id, grant.expires_at))
                    continue  # otherwise a transaction lives in memory only
                kind = "registration_expiry" if engine.registration(lease_id) is not None else "entry_expiry"
                records.append((kind, space, lease_id, grant.expires_at))
        if records:
            await self._commit(records, undo)
        return results

    async def cancel(self, space: str, lease_ids: Sequence[int]) -> list[SpaceError | None]:
        return await self._cancel(space, lease_ids)

    async def _cancel(
        self, space: str, lease_ids: Sequence[int], kind: str = "cancel"
    ) -> list[SpaceError | None]:
        """`cancel`; an entry removed is a change of `kind` ("purge" for an admin's Purge)."""
        engine = self.engine(space)
        self._check_store()
        results: list[SpaceError | None] = []
        records: list[Record] = []
        removed: list[StoredEntry] = []
        try:
            for lease_id in lease_ids:
                transaction = engine.is_transaction(lease_id)
                try:
                    stored = engine.cancel(lease_id, kind)
                except SpaceError as err:
                    results.append(err)
                    continue
                results.append(None)
                if transaction:
                    self._ended(space, lease_id, TransactionState.ABORTED)
                    if self.keeps_transactions:
                        records.append(("transaction_end", space, lease_id))
                elif stored is not None:
                    removed.append(stored)
                    records.append(("delete", space, lease_id))
                else:
                    records.append(("unregister", space, lease_id))
        except BaseException:
            # An ended registration or an aborted transaction cannot be undone: the store is told
            # of the cancellations made before the failure, so that it agrees with memory.
            if records:
                self.note(records)
            raise
        if records:
            await self._commit(records, lambda: engine.restore(removed))
        return results

    # ------------------------------------------------------------------ metrics

    async def space_figures(self) -> dict[str, SpaceFigures]:
        """What each space holds, for the metrics (runs on the event loop)."""
        figures = {}
        for name, engine in self._spaces.items():
            stats = engine.statistics()
            figures[name] = SpaceFigures(
                entries=stats.entries,
                bytes=stats.bytes,
                waiters=stats.waiters,
                registrations=stats.registrations,
                transactions=stats.transactions,
                expired=engine.expired,
                types=engine.type_counts(),
                max_entries=engine.settings.max_entries,
                max_bytes=engine.settings.max_bytes,
                in_flight=stats.in_flight,
                delayed=stats.delayed,
                redelivered=stats.redelivered,
                dead_lettered=stats.dead_lettered,
            )
        return figures

    @property
    def serving(self) -> bool:
        """A lone server serves while it runs (its store refusing changes still serves reads)."""
        return True

    async def locate(self, space: str) -> str | None:
        """A lone server serves every space itself."""
        return None

    @property
    def forwards(self) -> bool:
        """Whether `locate` may name another server for a space: the servicer asks it only then.
        This one never does; a subclass with a `locate` of its own may (the owner tier's)."""
        return type(self).locate is not MemoryBackend.locate

    async def placements(self) -> list[Placement]:
        return [Placement(name, "", "", 0, None, True) for name in self._spaces]

    def tier_figures(self) -> TierFigures | None:
        return None

    async def move(self, space: str, to: str) -> str:
        raise NoOtherServerError("a lone server has no other server to move a space to")

    async def drain(self) -> list[tuple[str, str]]:
        raise NoOtherServerError("a lone server has no other server to hand its spaces to")

    @property
    def peer_secret(self) -> str:
        return ""

    def accepts_peer(self, secret: str) -> bool:
        """A lone server has no peers: no call is taken as forwarded."""
        return False

    def observe_commits(self, observe: Callable[[float, int], None]) -> None:
        """Have the store report each group commit's seconds and records (if there is a store)."""
        if self._recorder is not None:
            self._recorder.journal.on_batch = observe

    # ------------------------------------------------------------------ transactions

    async def begin(self, space: str, lease: float | None) -> LeaseGrant:
        engine = self.engine(space)
        self._check_store()
        txn, grant = engine.begin(lease)
        if self._keeping_transactions:
            assert self._recorder is not None
            records: list[Record] = [
                ("transaction", space, txn.id, txn.expires_at),
                *self._recorder.id_records(space, engine),
            ]

            def undo() -> None:
                if txn.active:
                    engine.abort(txn)

            await self._commit(records, undo)
        elif self._recorder is not None:
            self.note(self._recorder.id_records(space, engine))  # a transaction's id is never reused
        return grant

    async def commit(self, space: str, transaction: int) -> None:
        """Commit: on a durable server, the transaction's writes and takes go to the store in one
        store transaction, so that a crash keeps all of them or none."""
        engine = self.engine(space)
        txn = self._ended_or_active(space, engine, transaction, TransactionState.COMMITTED)
        if txn is None:
            return  # committed already: a retry
        self._check_store()
        result = engine.commit(txn)
        self._ended(space, transaction, TransactionState.COMMITTED)
        if self._recorder is None:
            return
        outcome = self._requests.begin(_commit_marker(space, transaction), space, "commit")

        def undo() -> None:  # the store failed: the commit did not happen
            engine.revoke(result.written)
            engine.restore(result.taken)

        try:
            with self._acting_for(outcome), self._undone_on_error(undo):
                records = self._commit_records(space, engine, result, outcome)
            with self._acting_for(outcome):
                await self._commit(records, undo, result.written, outcome, hands_out=bool(result.taken))
        except SpaceError:
            # The store failed and the undo ran: the transaction's effects are gone, so it ended
            # as an abort, and a retried commit says so.
            self._ended(space, transaction, TransactionState.ABORTED)
            raise
        except BaseException:
            if not outcome.committing:  # undone before it reached the store: as above
                self._ended(space, transaction, TransactionState.ABORTED)
            raise
        self._acted(outcome, None)

    async def abort(self, space: str, transaction: int) -> None:
        """Abort: nothing of the transaction ever reached the store, so only memory changes;
        unless the store keeps open transactions, which is told before the call answers."""
        engine = self.engine(space)
        txn = self._ended_or_active(space, engine, transaction, TransactionState.ABORTED)
        if txn is None:
            return
        engine.abort(txn)
        self._ended(space, transaction, TransactionState.ABORTED)
        if self._keeping_transactions:
            outcome = self._requests.begin(_abort_marker(space, transaction), space, "abort")
            records: list[Record] = [
                ("transaction_end", space, transaction),
                (*Recorder.request_head(outcome), transaction, 0, None, None),
            ]
            with self._acting_for(outcome):
                await self._commit(records, None, outcome=outcome)
            self._acted(outcome, None)

    def _commit_records(
        self, space: str, engine: SpaceEngine, result: TransactionOutcome, outcome: Outcome
    ) -> list[Record]:
        assert self._recorder is not None
        records: list[Record] = [
            ("put", space, s.id, s.arrival, s.expires_at, s.payload) for s in result.written
        ]
        records += [
            ("type", space, name, json.dumps(list(stored.lineage[depth + 1 :])))
            for stored in result.written
            for depth, name in enumerate(stored.lineage)
        ]
        records += [("delete", space, stored.id) for stored in result.taken]
        records += self._recorder.id_records(space, engine)
        if self.keeps_transactions:  # its locks and what it wrote but took back go with it
            records.append(("transaction_end", space, result.transaction.id))
        records.append((*Recorder.request_head(outcome), result.transaction.id, 0, None, None))
        return records

    def _ended_or_active(
        self, space: str, engine: SpaceEngine, transaction: int, wanted: TransactionState
    ) -> Transaction | None:
        """The active transaction; None if it already ended as `wanted` (a retried commit or
        abort); TransactionAbortedError for a commit of an aborted one."""
        try:
            return engine.transaction(transaction)
        except TransactionNotFoundError:
            ended = self._ended_transactions.get((space, transaction))
            if ended is None:
                if self._requests.find(_commit_marker(space, transaction), space, "commit") is not None:
                    ended = TransactionState.COMMITTED
                elif self._requests.find(_abort_marker(space, transaction), space, "abort") is not None:
                    ended = TransactionState.ABORTED
            if ended is wanted:
                return None
            if ended is TransactionState.ABORTED:
                raise TransactionAbortedError(
                    f"transaction {transaction} in space {space!r} has aborted (cancelled, its lease "
                    "ran out, or its space moved to another server): it cannot commit"
                ) from None
            if ended is TransactionState.COMMITTED:
                raise TransactionAbortedError(
                    f"transaction {transaction} in space {space!r} has committed: it cannot abort"
                ) from None
            raise

    def _ended(self, space: str, transaction: int, state: TransactionState) -> None:
        ended = self._ended_transactions
        ended[(space, transaction)] = state
        while len(ended) > _ENDED_REMEMBERED:
            del ended[next(iter(ended))]

    # ------------------------------------------------------------------ inspection (admin)

    async def describe(self, space: str) -> inspection.SpaceDescription:
        engine = self.engine(space)
        tally = inspection.Tally(engine.declared_types())
        entries = engine.snapshot()
        for start in range(0, len(entries), _SLICE):
            tally.add_entries(entries[start : start + _SLICE])
            await asyncio.sleep(0)  # a slice at a time: a large space never holds the loop
        slots = engine.index_slots()
        for start in range(0, len(slots), _SLICE):
            tally.add_slots(slots[start : start + _SLICE])
            await asyncio.sleep(0)
        return inspection.describe(engine, tally, self.clock.time(), self.config.limits.max_registrations)

    async def browse(
        self, space: str, templates: Sequence[Template], after: int, max_entries: int
    ) -> tuple[list[StoredEntry], int]:
        engine = self.engine(space)
        found, cursor = engine.browse(templates, after, max_entries, max_entries * _BROWSE_SCAN)
        await self.settled(found)
        return found, cursor

    async def purge(
        self, space: str, templates: Sequence[Template], *, dry_run: bool, max_entries: int
    ) -> int:
        engine = self.engine(space)
        if dry_run:
            number = await self.count(space, templates)
            return min(number, max_entries) if max_entries else number
        left = max_entries or 1 << 62
        removed = 0
        while left > 0:
            # The oldest matches anyone may read, found as a read finds them: no copy of the
            # space's buckets, and what a batch removed is freed with the batch.
            found, _ = engine.find_or_conflict(templates, take=False, max_entries=min(PURGE_BATCH, left))
            if not found:
                break
            # One store batch; a purge's removals are logged as such.
            outcomes = await self._cancel(space, [stored.id for stored in found], "purge")
            done = sum(outcome is None for outcome in outcomes)
            if not done:
                break  # nothing found could be removed: stop rather than find it again
            removed += done
            left -= done
            del found
            await asyncio.sleep(0)  # a batch at a time: other callers run in between
        return removed

    async def cancel_registration(self, space: str, registration_id: int) -> None:
        engine = self.engine(space)
        if engine.registration(registration_id) is None:
            raise LeaseNotFoundError(
                f"id: registration {registration_id} in space {space!r} is unknown or has ended"
            )
        (outcome,) = await self.cancel(space, [registration_id])
        if outcome is not None:
            raise outcome
