"""What the memory backend asks of its store: record a change made in memory, wait until it
is durable, and answer a retried request from what was stored.

Under the `always` policy a call replies only once its batch is durable, and a read, notify event
or contents chunk that shows an entry whose write is not yet durable waits for it too
(`settled`), so nobody sees what a crash could take back. A batch that cannot be written is
undone in memory and its callers get UNAVAILABLE (see memory/journal.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from outrig.service.backends.memory.idempotency import Outcome, RequestLog
from outrig.service.backends.memory.journal import BatchEnd, Journal, Record
from outrig.service.engine.model import LeaseGrant, StoredEntry
from outrig.service.engine.partitions import ids_of
from outrig.service.engine.space import SpaceEngine
from outrig.service.exceptions import SpaceError
from outrig.service.protocol import codec

# Ids reserved in the store at a time (a restart skips at most this many).
_ID_BLOCK = 1024

# Request kinds whose answer is the columns of their `request` record (memory/journal.py).
ANSWERED_IN_ITS_ROW = frozenset({"deliver", "ack", "nack", "extend"})


class Recorder:
    """The memory backend's side of its `Journal`."""

    def __init__(self, journal: Journal, requests: RequestLog) -> None:
        self.journal = journal
        # Whether it records the change log (memory/journal.py: an optional attribute), read once.
        self.keeps_changes: bool = getattr(journal, "keeps_changes", False)
        # How a batch's end runs a callback: the journal's `when_done` (memory/journal.py: an
        # optional method, in the batch's own resolution), else a done callback of its future.
        self.when_done: Callable[[asyncio.Future[None], BatchEnd], None] = getattr(
            journal, "when_done", asyncio.Future.add_done_callback
        )
        self._requests = requests
        # Entries whose write is not yet durable, with the batch that will make it so.
        self._unsynced: dict[StoredEntry, asyncio.Future[None]] = {}
        # The batch the last change joined, and the request outcomes and written entries its
        # end settles: one callback of its end per batch (`_batch_done`), not one per caller.
        self._batch: asyncio.Future[None] | None = None
        self._outcomes: list[Outcome] = []
        self._written: list[StoredEntry] = []
        # Per space, the id the store has reserved up to (see id_records).
        self._reserved: dict[str, int] = {}

    def check(self) -> None:
        """Raise StoreUnavailableError while the store cannot take changes."""
        self.journal.check()

    def note(self, records: Sequence[Record]) -> None:
        self.journal.note(records)

    async def commit(
        self,
        records: Sequence[Record],
        undo: Callable[[], None] | None,
        written: Iterable[StoredEntry] = (),
        outcome: Outcome | None = None,
        *,
        hands_out: bool = False,
    ) -> None:
        """Submit a change already made in memory and, under `always`, wait until it is durable.
        A request id's outcome is settled by the batch, even if the caller is cancelled. If the
        journal refuses the change at once, it is undone here: nothing else will undo it.

        `hands_out`: the change gave entries to its caller (a take, a commit's takes). Under
        `interval` the reply does not wait for the batch, so the caller may hold them when the
        batch fails; undoing the change then would put them back for a second taker. So its undo
        runs only if the journal refuses it at once: memory keeps the take, and the store, as
        after a crash, loses it (the interval policy's documented loss)."""
        waiter = self.enqueue(records, undo, written, outcome, hands_out=hands_out)
        if waiter is not None:
            await waiter  # its own future: cancelling this call cancels nothing shared

    def enqueue(
        self,
        records: Sequence[Record],
        undo: Callable[[], None] | None,
        written: Iterable[StoredEntry] = (),
        outcome: Outcome | None = None,
        *,
        hands_out: bool = False,
    ) -> asyncio.Future[None] | None:
        """`commit` without its wait: the caller's own future to await (None under `interval`).
        A durable write or take awaits it itself, a coroutine less than awaiting `commit`."""
        journal = self.journal
        undo_later = undo if journal.waits or not hands_out else None
        try:
            future, waiter = journal.submit(records, undo_later, own=journal.waits)
        except BaseException:
            if undo is not None:
                undo()
            raise
        if future is not self._batch or future.done():
            self._follow(future)
        if outcome is not None:
            outcome.committing = True
            self._outcomes.append(outcome)
        if waiter is None:  # the interval policy: the reply does not wait
            return None
        unsynced = self._unsynced
        for stored in written:
            unsynced[stored] = future
            self._written.append(stored)
        return waiter

    async def settled(self, entries: Sequence[StoredEntry]) -> bool:
        """Wait until the writes of `entries` are durable; False if one of them failed."""
        if not self._unsynced:
            return True
        pending = {self._unsynced[stored] for stored in entries if stored in self._unsynced}
        for future in pending:
            try:
                await asyncio.shield(future)
            except SpaceError:
                return False
        return True

    async def caught_up(self) -> None:
        """Wait until every change submitted so far is durable (or failed)."""
        pending = self.journal.pending
        if self.journal.waits and pending is not None:
            with contextlib.suppress(SpaceError):
                await asyncio.shield(pending)

    def _follow(self, batch: asyncio.Future[None]) -> None:
        """Changes join `batch` from now on: its end settles what they leave in these lists. (A
        batch already done settles only the change that met it: the next one gets lists anew.)"""
        self._batch, self._outcomes, self._written = batch, [], []
        outcomes, written = self._outcomes, self._written
        self.when_done(batch, functools.partial(self._batch_done, outcomes=outcomes, written=written))

    def _batch_done(
        self, batch: asyncio.Future[None], outcomes: list[Outcome], written: list[StoredEntry]
    ) -> None:
        """The batch is durable (or failed): its entries are no longer unsynced, and its request
        ids are answered from the store from now on (or forgotten, if it failed)."""
        unsynced = self._unsynced
        for stored in written:
            if unsynced.get(stored) is batch:
                del unsynced[stored]
        requests = self._requests
        if batch.cancelled() or batch.exception() is not None:
            for outcome in outcomes:
                requests.abandon(outcome, store_failed=True)
        else:
            for outcome in outcomes:
                requests.finish(outcome, None)

    async def stored_result(self, outcome: Outcome) -> Any:
        """The first call's answer to a request id, read back from the store."""
        journal = self.journal
        if journal.pending is not None:
            with contextlib.suppress(SpaceError):
                await asyncio.shield(journal.pending)
        if outcome.kind == "write":
            first_id, count, expires_at, granted = await journal.write_answer(
                outcome.request_id, outcome.expires_at
            )
            stride = ids_of(outcome.space).stride  # a partition's ids are its stride apart
            return [LeaseGrant(first_id + i * stride, expires_at, granted) for i in range(count)]
        if outcome.kind in ANSWERED_IN_ITS_ROW:  # the backend reads the row's columns
            return await journal.write_answer(outcome.request_id, outcome.expires_at)
        rows = await journal.taken_rows(outcome.request_id, outcome.expires_at)
        return [
            StoredEntry(entry_id, codec.stored_entry(payload), expires_at)
            for entry_id, expires_at, payload in rows
        ]

    @staticmethod
    def request_head(outcome: Outcome) -> Record:
        """The start of a request id's record; the caller appends the answer's columns."""
        return ("request", outcome.request_id, outcome.space, outcome.kind, outcome.expires_at)

    def id_records(self, space: str, engine: SpaceEngine) -> list[Record]:
        """Reserve ids in blocks: the store learns a new high-water mark only when the space's ids
        pass the last one, so a write rarely pays for it; a restart resumes above the mark."""
        if engine.next_id <= self._reserved.get(space, 0):
            return []
        mark = self._reserved[space] = engine.next_id + _ID_BLOCK * engine.id_stride
        return [("next_id", space, mark)]

    def forget_space(self, space: str) -> None:
        """`space` is no longer served here (see MemoryBackend.drop_space)."""
        self._reserved.pop(space, None)

    def reserve_ids(self, space: str, mark: int) -> None:
        """The store has reserved ids below `mark` for `space` (recovery)."""
        self._reserved[space] = mark
