"""Loading a space this server has just claimed: everything the database holds of it.

The load runs in one transaction that first checks the claim's epoch is still current (FOR
SHARE: a later claim's UPDATE of the row waits for the load), so it reads the space exactly as
its last owner left it: every change that owner had acknowledged committed before the claim
could (the claim waited for its fenced batches). Entries and registrations
whose leases have run out are deleted rather than loaded; transactions the last owner had open
come back with their writes, takes and read locks (each recorded before its call answered), but
those whose lease has run out abort here, with what they wrote (a late commit is told so);
registrations' sequence numbers jump by 2**31 (stored at once), so that a listener resuming sees
the gap and knows events may be missing; request ids still in their window come back (their
answers stay in the database). Entries come with their delivery state (hidden until, a pending
delivery's receipt, their delivery count, a dead letter's reason), which the engine restores: a
delivery still pending keeps its receipt, so its Ack succeeds at the new owner. Dead letters on
their way into this space (outrig_dead_letters) come too: the backend takes them in once loaded.

The change log (migration 5) comes with the space, so that cursors and durable subscriptions
stay valid across a takeover and a restart: its epoch, its head, every row still held (oldest to
head) and the durable subscriptions' positions. A write's row holds no payload: it comes from
the entry loaded if it is still there, else from the later change of that id that removed it
(always held: it is newer, and retention drops the oldest first): `log_changes`. An entry whose lease ran out
while nobody served the space is deleted here as always, and logged as an `expire` change in the
same transaction (the next seqs, in arrival order), so the log keeps every change of the stored
set. With the space's log off (`changes = false`) its rows and epoch are deleted instead: a log
turned on again later is a new epoch, whose cursors never skip what happened meanwhile (the
backend records the new log's epoch when it loads the space).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import psycopg

from outrig.service.engine.changes import Change
from outrig.service.engine.model import NewEntry, StoredEntry
from outrig.service.exceptions import NotOwnerError
from outrig.service.protocol import codec

log = logging.getLogger("outrig.service.backends.postgres")

SEQUENCE_JUMP = 1 << 31
# Changes decoded between two looks at the event loop.
SLICE = 5000


@dataclass
class SpaceRows:
    """What the database holds of one space."""

    next_id: int = 1
    types: list[tuple[str, list[str]]] = field(default_factory=list)
    # id, arrival, expiry, payload, the transaction that wrote it (None: committed), and its
    # delivery state: hidden until, the pending delivery's receipt, deliveries, dead-letter reason,
    # the pending delivery's take's own max_deliveries
    entries: list[
        tuple[int, int, float | None, bytes, int | None, float | None, int | None, int, str | None, int]
    ] = field(default_factory=list)
    # dead letters on their way here: source, id, expiry, payload, deliveries, reason
    dead_letters: list[tuple[str, int, float | None, bytes, int, str]] = field(default_factory=list)
    registrations: list[tuple[int, float | None, bytes, int]] = field(default_factory=list)
    requests: list[tuple[str, str, float]] = field(default_factory=list)  # id, kind, expiry
    transactions: list[tuple[int, float | None]] = field(default_factory=list)  # open: id, expiry
    locks: list[tuple[int, int, str]] = field(default_factory=list)  # transaction, entry, mode
    aborted: list[int] = field(default_factory=list)  # transactions that aborted with the move
    # The change log: its epoch (None: none recorded yet), head, changes (seq, kind, entry id,
    # at, transaction, visible_at, payload; oldest first), durable subscriptions (name, position).
    change_epoch: int | None = None
    change_head: int = 0
    changes: list[tuple[int, str, int, float, int, float | None, bytes | None]] = field(default_factory=list)
    subscriptions: list[tuple[str, int]] = field(default_factory=list)
    expired: int = 0
    seconds: float = 0.0


async def load_space(
    connection: psycopg.AsyncConnection[Any],
    space: str,
    server_id: str,
    epoch: int,
    now: float,
    *,
    keeps_log: bool = True,
) -> SpaceRows:
    """Read `space` under the claim (`server_id`, `epoch`); NotOwnerError if it was lost meanwhile.
    `keeps_log`: whether the space keeps a change log (its `changes` setting)."""
    started = time.perf_counter()
    rows = SpaceRows()
    async with connection.transaction():
        cursor = await connection.execute(
            "SELECT next_id, change_epoch, change_head FROM outrig_spaces "
            "WHERE space = %s AND owner = %s AND epoch = %s FOR SHARE",
            (space, server_id, epoch),
        )
        found = await cursor.fetchone()
        if found is None:
            raise NotOwnerError(f"space {space!r} was claimed by another server while this one loaded it")
        rows.next_id = int(found[0])
        rows.change_epoch = None if found[1] is None else int(found[1])
        rows.change_head = int(found[2])
        if not keeps_log and rows.change_epoch is not None:
            # Off: nothing of this log may show through one made later.
            await _forget_log(connection, space)
            rows.change_epoch, rows.change_head = None, 0
        cursor = await connection.execute(
            "DELETE FROM outrig_open_transactions WHERE space = %s AND (NOT recorded OR expires_at <= %s) "
            "RETURNING id",
            (space, now),
        )
        rows.aborted = [int(transaction) for (transaction,) in await cursor.fetchall()]
        # What ended transactions left (their end is recorded with the last of their changes,
        # but a row of version 2, or of one that ran out of lease, has only its end here).
        await connection.execute(
            "DELETE FROM outrig_entries AS e WHERE e.space = %s AND e.written_by IS NOT NULL AND NOT EXISTS "
            "(SELECT 1 FROM outrig_open_transactions AS t WHERE t.space = e.space AND t.id = e.written_by)",
            (space,),
        )
        await connection.execute(
            "DELETE FROM outrig_transaction_locks AS l WHERE l.space = %s AND NOT EXISTS "
            "(SELECT 1 FROM outrig_open_transactions AS t WHERE t.space = l.space AND t.id = l.transaction)",
            (space,),
        )
        if rows.change_epoch is None:
            cursor = await connection.execute(
                "DELETE FROM outrig_entries WHERE space = %s AND taken_by IS NULL AND expires_at <= %s",
                (space, now),
            )
            rows.expired = cursor.rowcount
        else:
            rows.expired, rows.change_head = await _expire_logged(connection, space, now)
        await connection.execute(
            "DELETE FROM outrig_registrations WHERE space = %s AND expires_at <= %s", (space, now)
        )
        await connection.execute(  # dead letters whose lease ran out on the way here
            "DELETE FROM outrig_dead_letters WHERE dead_space = %s AND expires_at <= %s", (space, now)
        )
        await connection.execute(
            "UPDATE outrig_registrations SET sequence = sequence + %s WHERE space = %s",
            (SEQUENCE_JUMP, space),
        )
        cursor = await connection.execute(
            "SELECT name, supertypes FROM outrig_types WHERE space = %s", (space,)
        )
        rows.types = [(name, list(supertypes)) for name, supertypes in await cursor.fetchall()]
        async with connection.cursor(binary=True) as binary:
            await binary.execute(
                "SELECT id, arrival, expires_at, payload, written_by, hidden_until, receipt, deliveries, "
                "dead_letter_reason, max_deliveries FROM outrig_entries "
                "WHERE space = %s AND taken_by IS NULL ORDER BY arrival",
                (space,),
            )
            rows.entries = list(await binary.fetchall())
            await binary.execute(
                "SELECT source, id, expires_at, payload, deliveries, reason FROM outrig_dead_letters "
                "WHERE dead_space = %s ORDER BY moved_at, source, id",
                (space,),
            )
            rows.dead_letters = list(await binary.fetchall())
            if rows.change_epoch is not None:
                rows.changes = await _changes(binary, space)
        cursor = await connection.execute(
            "SELECT name, position FROM outrig_change_subscriptions WHERE space = %s ORDER BY name",
            (space,),
        )
        rows.subscriptions = [(name, int(position)) for name, position in await cursor.fetchall()]
        cursor = await connection.execute(
            "SELECT id, expires_at, templates, sequence FROM outrig_registrations WHERE space = %s",
            (space,),
        )
        rows.registrations = [
            (int(reg), expires_at, bytes(templates), int(sequence))
            for reg, expires_at, templates, sequence in await cursor.fetchall()
        ]
        # Request ids in their window: writes' rows, and takes' marks on the rows they took or
        # locked (a take keeps no row of its own).
        cursor = await connection.execute(
            "SELECT id, kind, expires_at FROM outrig_requests WHERE space = %(s)s AND expires_at > %(now)s "
            "UNION ALL SELECT taken_by, 'take', max(taken_until) FROM outrig_entries "
            "WHERE space = %(s)s AND taken_by IS NOT NULL AND taken_until > %(now)s GROUP BY taken_by "
            "UNION ALL SELECT request_id, 'take', max(request_until) FROM outrig_transaction_locks "
            "WHERE space = %(s)s AND request_id IS NOT NULL AND request_until > %(now)s GROUP BY request_id "
            "ORDER BY 3",
            {"s": space, "now": now},
        )
        rows.requests = list(await cursor.fetchall())
        cursor = await connection.execute(
            "SELECT id, expires_at FROM outrig_open_transactions WHERE space = %s ORDER BY id", (space,)
        )
        rows.transactions = [
            (int(transaction), expires_at) for transaction, expires_at in await cursor.fetchall()
        ]
        cursor = await connection.execute(
            "SELECT transaction, entry, mode FROM outrig_transaction_locks WHERE space = %s "
            "ORDER BY transaction, entry",
            (space,),
        )
        rows.locks = [
            (int(transaction), int(entry), mode) for transaction, entry, mode in await cursor.fetchall()
        ]
    rows.seconds = time.perf_counter() - started
    return rows


async def _forget_log(connection: psycopg.AsyncConnection[Any], space: str) -> None:
    """The space's log is off: its rows, epoch and durable subscriptions go. (With no epoch
    recorded there are none: the epoch is recorded with, or before, a log's first change.)"""
    await connection.execute(
        "WITH changes AS (DELETE FROM outrig_changes WHERE space = %(s)s), "
        "subscriptions AS (DELETE FROM outrig_change_subscriptions WHERE space = %(s)s) "
        "UPDATE outrig_spaces SET change_epoch = NULL, change_head = 0 WHERE space = %(s)s",
        {"s": space},
    )


async def _expire_logged(connection: psycopg.AsyncConnection[Any], space: str, now: float) -> tuple[int, int]:
    """Delete the entries whose lease has run out, each logged as an `expire` change: (how many,
    the log's head after them)."""
    cursor = await connection.execute(
        "WITH head AS (SELECT greatest((SELECT change_head FROM outrig_spaces WHERE space = %(s)s), "
        "(SELECT coalesce(max(seq), 0) FROM outrig_changes WHERE space = %(s)s)) AS h), "
        "gone AS (DELETE FROM outrig_entries WHERE space = %(s)s AND taken_by IS NULL "
        "AND expires_at <= %(now)s RETURNING id, arrival, payload, written_by), "
        "logged AS (INSERT INTO outrig_changes (space, seq, kind, entry_id, at, payload) "
        "SELECT %(s)s, head.h + row_number() OVER (ORDER BY gone.arrival), 'expire', gone.id, %(now)s, "
        "gone.payload FROM gone, head WHERE gone.written_by IS NULL RETURNING seq) "
        "SELECT (SELECT count(*) FROM gone), greatest((SELECT h FROM head), (SELECT max(seq) FROM logged))",
        {"s": space, "now": now},
    )
    found = await cursor.fetchone()
    assert found is not None
    return int(found[0]), int(found[1])


async def _changes(
    binary: psycopg.AsyncCursor[Any], space: str
) -> list[tuple[int, str, int, float, int, float | None, bytes | None]]:
    """The space's log, oldest first (a write's payload None: see `log_changes`)."""
    await binary.execute(
        "SELECT seq, kind, entry_id, at, transaction, visible_at, payload FROM outrig_changes "
        "WHERE space = %s ORDER BY seq",
        (space,),
    )
    return [
        (
            int(seq),
            kind,
            int(entry_id),
            at,
            int(transaction),
            visible_at,
            None if payload is None else bytes(payload),
        )
        for seq, kind, entry_id, at, transaction, visible_at, payload in await binary.fetchall()
    ]


async def log_changes(
    space: str, rows: SpaceRows, loaded: Mapping[int, tuple[NewEntry, float | None]]
) -> list[Change]:
    """The loaded log as the engine's changes, each with its entry: a write's from the entry
    loaded (`loaded`: id -> the entry and its expiry), or, its row gone, from the later change of
    that id that removed it (decoded once for both). Should neither exist (never the case,
    unless the rows were edited by hand), the log is held from after that write: compacted
    before it, never shown with a hole. Decoded a slice at a time (other calls run between)."""
    removed: dict[int, NewEntry] = {}
    changes: list[Change] = []
    for done, (seq, kind, entry_id, at, transaction, visible_at, payload) in enumerate(
        reversed(rows.changes)
    ):
        expires_at = None
        if payload is not None:
            new = removed[entry_id] = codec.stored_entry(payload)
        elif entry_id in loaded:
            new, expires_at = loaded[entry_id]
        elif entry_id in removed:
            new = removed[entry_id]
        else:
            log.warning(
                "space %r: change %d (a write of entry %d) has no payload (neither its entry's row "
                "nor a later change of it is held): its log is loaded from change %d on",
                space,
                seq,
                entry_id,
                seq + 1,
            )
            break
        changes.append(Change(seq, kind, StoredEntry(entry_id, new, expires_at), at, transaction, visible_at))
        if done % SLICE == SLICE - 1:
            await asyncio.sleep(0)
    changes.reverse()
    return changes
