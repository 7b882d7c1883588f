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
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import psycopg

from outrig.service.exceptions import NotOwnerError

SEQUENCE_JUMP = 1 << 31


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
    expired: int = 0
    seconds: float = 0.0


async def load_space(
    connection: psycopg.AsyncConnection[Any], space: str, server_id: str, epoch: int, now: float
) -> SpaceRows:
    """Read `space` under the claim (`server_id`, `epoch`); NotOwnerError if it was lost meanwhile."""
    started = time.perf_counter()
    rows = SpaceRows()
    async with connection.transaction():
        cursor = await connection.execute(
            "SELECT next_id FROM outrig_spaces WHERE space = %s AND owner = %s AND epoch = %s FOR SHARE",
            (space, server_id, epoch),
        )
        found = await cursor.fetchone()
        if found is None:
            raise NotOwnerError(f"space {space!r} was claimed by another server while this one loaded it")
        rows.next_id = int(found[0])
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
        cursor = await connection.execute(
            "DELETE FROM outrig_entries WHERE space = %s AND taken_by IS NULL AND expires_at <= %s",
            (space, now),
        )
        rows.expired = cursor.rowcount
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
