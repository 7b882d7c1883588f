"""What the memory backend asks of the store that records it: a group-commit journal.

The memory backend applies every change to its in-memory engines at once and hands the journal
`Record`s describing it, with an undo. Two journals implement this protocol: SQLite in a data dir
(backends/embedded/store/journal.py) and PostgreSQL, fenced by space ownership
(backends/postgres/journal.py). Both commit the records of every change that arrives while the
previous batch is being written in one transaction, and resolve each caller's future only once
that transaction has committed; a batch that fails is undone in memory, newest change first.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any, Protocol

Record = tuple[Any, ...]
"""(kind, *arguments). The kinds, and what they say:

    put(space, id, arrival, expires_at, payload)      an entry is in the space
    delete(space, id)                                  it is gone
    take(space, id, request_id, position, until)       taken by a request id: kept to answer a retry
                                                       until the request's window ends
    entry_expiry(space, id, expires_at)                its lease was renewed
    type(space, name, supertypes_json)                 a declared type
    next_id(space, mark)                               ids below mark may have been handed out
    register(space, id, expires_at, templates, seq)    a notify registration
    unregister(space, id)
    registration_expiry(space, id, expires_at)
    sequence(space, id, seq)                           a registration's event sequence number
    request(request_id, space, kind, expires_at, first_id, count, lease_expires_at, granted)
    prune_requests(now)                                request ids whose window ended may go
    visibility(space, id, hidden_until, receipt, deliveries, dead_letter_reason, max_deliveries)
                                                       an entry's delivery state (takes with an
                                                       acknowledgement deadline): hidden until
                                                       (None: visible), its pending delivery's
                                                       receipt (None: none), its delivery count,
                                                       why it is a dead letter (None: it is not),
                                                       its take's own max_deliveries (0: none)

`visibility` follows the entry's `put` in a delayed write (hidden until visible_at, no receipt,
count 0) and in a move to a dead-letter space (visible, the count kept, the reason); it is
recorded alone by a delivery (hidden until the deadline, the receipt, the count), an extension
(the new deadline) and a nack (hidden until its visible_at, or visible; no receipt). An ack is a
`delete`. A deadline or delay that passes is not recorded: a store loading a row whose
hidden_until is past loads it visible, its stale receipt dropped. A move to a dead-letter space
is `delete` in the space and `put` + `visibility` in the dead-letter space, in one change.

A take's request id is in its `take` records (or, under a transaction, its `lock` records), which
mark the taken rows with it and its window's end: they answer its retry, and start-up remembers the
id by them. A take's `request` record, where one is made (a take under a transaction on the owner
tier), has no row in either store; an ordinary take makes none.

A `request` answers a retry from its own columns for these kinds (nothing else is kept):

    deliver   first_id: the first receipt, count: how many (receipts are consecutive ids of the
              space, a partition's its stride apart); a retry answers those still pending
    ack       first_id: the receipt, count 1
    nack      first_id: the receipt, count: 1 if the entry went to the dead-letter space, else 0;
              lease_expires_at: when it is visible again (None: at once)
    extend    first_id: the receipt, count 1, lease_expires_at: the new deadline

The change log (engine/changes.py; memory/changes.py makes these records), recorded by a journal
whose `keeps_changes` is true, each `change` in the same batch as the change it logs:

    change(space, seq, kind, id, at, transaction, visible_at, payload)
                                                       a change of the space's stored set: its
                                                       seq, kind ("write", "take", "expire",
                                                       "cancel", "purge", "dead"), the entry's
                                                       id, when (epoch seconds), its transaction
                                                       (0: none), a delayed write's visible_at.
                                                       payload: None for a `write` (the entry's
                                                       `put` or `written` row, in the same
                                                       change, holds it), the entry's payload for
                                                       every other kind (its row is deleted in
                                                       the same change). At load a write's
                                                       payload comes from the entry's row if it
                                                       still exists, else from the later change of
                                                       the same id that removed it (always held:
                                                       it is newer, and trimming takes the oldest)
    change_trim(space, oldest)                         changes with seq < oldest may go (retention;
                                                       from the reaper's pass, when it moved)
    change_epoch(space, epoch)                         the log's epoch, recorded once, with its
                                                       first change
    change_head(space, head)                           optional: the head, when the log is empty
                                                       after a trim (the SQLite store derives it:
                                                       oldest - 1)
    subscription(space, name, position)                a durable subscription made or acked
    subscription_delete(space, name)                   ... deleted

A failed batch rewinds the log (`ChangeLog.rewind`) as it undoes the changes themselves.

Recorded only by a backend that keeps open transactions (`keeps_transactions`: the postgres
owner tier, so that a new owner rebuilds them; the embedded server's transactions live in memory
until they commit, and their commit is puts and deletes):

    transaction(space, id, expires_at)                 a transaction opened
    transaction_expiry(space, id, expires_at)          its lease was renewed
    transaction_end(space, id)                         it committed or aborted: its locks go, and
                                                       the rows it wrote that are still its own
    written(space, id, arrival, expires_at, payload, transaction)
                                                       an entry written under a transaction
    lock(space, transaction, id, mode, request_id, position, until)
                                                       held by it: mode "take" or "read" (a take's
                                                       request id and position answer its retry
                                                       until the request's window ends)
    unlock(space, transaction, id)                     given back (its caller went away)
"""

WriteAnswer = tuple[int, int, float | None, float | None]
"""A stored write's answer: (first id, count, lease expiry, granted seconds); for a deliver, ack,
nack or extend, the same columns of its `request` record, as the docstring above reads them."""

TakenRow = tuple[int, float | None, Any]
"""A stored take's answer, one row per entry in order: (id, expiry, payload)."""

BatchEnd = Callable[[asyncio.Future[None]], None]
"""A callback of a batch's end, given the batch's future (done). A journal may run it itself in
the batch's resolution, before its callers resume, with an optional method `when_done(future,
callback)` (the SQLite store's does: a loop iteration's handle less than a done callback); the
`Recorder` uses a done callback where a journal has none (memory/recorder.py)."""


class Journal(Protocol):
    """A group committer (see the module docstring)."""

    waits: bool  # callers wait for their batch (the `always` policy)
    # A journal that records the change log's records (above) says so with an attribute
    # `keeps_changes = True`; one without it is not given them, and its batches still tell when
    # a change is durable (memory/changes.py reads it with getattr, so that it is optional).
    on_batch: Callable[[float, int], None] | None  # told of each commit: seconds, records

    def check(self) -> None:
        """Raise StoreUnavailableError (or a subclass) while the store cannot take changes."""

    def submit(
        self, records: Sequence[Record], undo: Callable[[], None] | None = None, *, own: bool = True
    ) -> tuple[asyncio.Future[None], asyncio.Future[None] | None]:
        """Queue a change already applied in memory: (its batch's future, the caller's own)."""

    def note(self, records: Sequence[Record]) -> None:
        """Queue bookkeeping nobody waits for."""

    @property
    def pending(self) -> asyncio.Future[None] | None:
        """The future of the last batch not yet durable, if any."""

    async def write_answer(self, request_id: str, until: float) -> WriteAnswer:
        """The stored answer of a write with this request id, whose window ends at `until` (its
        `request` record's expires_at: the SQLite store finds the row by both)."""

    async def taken_rows(self, request_id: str, until: float) -> list[TakenRow]:
        """The entries a take with this request id (its window ending at `until`) took, in order."""

    async def close(self) -> None:
        """Write what is queued, then stop."""
