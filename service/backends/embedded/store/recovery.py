"""Start-up: rebuild the in-memory spaces from the store.

Entries are loaded in arrival order, so each space's buckets come back in the order they had,
with their delivery state: a pending delivery whose deadline is still to come keeps its receipt
(an Ack after the restart settles it), a delayed entry stays hidden until its time, and one whose
deadline or time passed while the server was down is visible, its count kept.
Entries and registrations whose leases ran out while the server was down are deleted, not loaded.
Registrations restart their sequence numbers 2**31 above the stored one, so a listener that
resumes sees a jump and knows events may have been missed. Request ids still inside their window
are remembered again (their results stay in the store).

Each space's change log comes back with its epoch, its changes from the oldest retention kept,
and its durable subscriptions (`_load_changes`): a write's payload is its entry's row if the entry
is still there, else the later change that removed it. Entries that expired while the server was
down are logged as `expire` changes, recorded in the same transaction that deletes their rows.
"""

from __future__ import annotations

import gc
import json
import sqlite3
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

from google.protobuf.message import DecodeError

from outrig.service.backends.embedded.store.schema import transaction
from outrig.service.engine.changes import Change
from outrig.service.engine.model import StoredEntry
from outrig.service.engine.partitions import split_name
from outrig.service.exceptions import ConfigError, SpaceError, StoreError
from outrig.service.protocol import codec

if TYPE_CHECKING:
    from outrig.service.backends.embedded.backend import EmbeddedBackend

SEQUENCE_JUMP = 1 << 31


@dataclass(frozen=True, slots=True)
class RecoveryReport:
    """What a start-up found in the store."""

    spaces: int
    entries: int
    expired: int
    registrations: int
    requests: int
    seconds: float

    def __str__(self) -> str:
        return (
            f"recovered {self.entries} entries in {self.spaces} spaces, {self.registrations} notify "
            f"registrations and {self.requests} request ids in {self.seconds:.2f} s "
            f"({self.expired} expired while the server was down)"
        )


def recover(connection: sqlite3.Connection, backend: EmbeddedBackend, now: float) -> RecoveryReport:
    """Load everything the store holds into `backend`'s spaces; delete what has expired.

    A store that cannot be loaded (a row that does not decode, a broken reference) is a
    StoreError naming the data dir, never a traceback: `outrig check` tells what is wrong."""
    # Loading builds millions of objects that all live on; the cyclic collector would walk the
    # growing heap again and again meanwhile (measured: over 40% of a restart). Loading makes no
    # garbage cycles to collect, so the collector pauses while it runs and is put back as it was.
    # (`outrig serve` then freezes what start-up loaded, in its own process only: transport/server.)
    collecting = gc.isenabled()
    gc.disable()
    try:
        return _recover(connection, backend, now)
    except (StoreError, ConfigError):
        raise
    except (sqlite3.DatabaseError, KeyError, ValueError, DecodeError, SpaceError) as err:
        path = connection.execute("PRAGMA database_list").fetchone()[2]
        raise StoreError(
            f"the store {path} cannot be loaded ({type(err).__name__}: {err}); "
            f"`outrig check` on its data dir lists its problems"
        ) from err
    finally:
        if collecting:
            gc.enable()


def _check_partitioning(backend: EmbeddedBackend, name: str, entries: int) -> None:
    """A store's spaces must fit the configured partitions (docs/scaling.md): a partition of a
    space no longer partitioned so, or entries of a space now partitioned, would be out of reach."""
    space, k = split_name(name)
    partitioning = backend.config.partitioning(space)
    if k is not None and (partitioning is None or k >= partitioning.count):
        now = "unpartitioned" if partitioning is None else f"in {partitioning.count} partitions"
        raise ConfigError(
            f"the data dir holds partition {k} of space {space!r}, which is now configured {now}: "
            "configure the partitions it was written with (docs/scaling.md)"
        )
    if k is None and partitioning is not None and entries:
        raise ConfigError(
            f"the data dir holds {entries} entries of space {space!r} unpartitioned, which is now "
            f"configured in {partitioning.count} partitions: start without the partitions, move the "
            "entries out (outrig dump), then partition it (docs/scaling.md)"
        )


def _recover(connection: sqlite3.Connection, backend: EmbeddedBackend, now: float) -> RecoveryReport:
    started = time.perf_counter()
    execute = connection.execute
    names: dict[int, str] = {}
    held = dict(
        execute("SELECT space, count(*) FROM entries WHERE taken_by IS NULL GROUP BY space").fetchall()
    )
    for number, name, next_id in execute("SELECT no, name, next_id FROM spaces"):
        names[number] = name
        _check_partitioning(backend, name, held.get(number, 0))
        backend.engine(name).resume_ids(next_id)
        backend.reserve_ids(name, next_id)
    for number, name, supertypes in execute("SELECT space, name, supertypes FROM types"):
        backend.engine(names[number]).declare(name, tuple(json.loads(supertypes)))
    loaded = expired = 0
    engine = None
    current = -1
    rows = execute(
        "SELECT space, id, arrival, expires_at, payload, hidden_until, receipt, deliveries, "
        "dead_letter_reason, max_deliveries FROM entries "
        "WHERE taken_by IS NULL AND (expires_at IS NULL OR expires_at > ?) ORDER BY space, arrival",
        (now,),
    )
    for (
        number,
        entry_id,
        arrival,
        expires_at,
        payload,
        hidden_until,
        receipt,
        deliveries,
        reason,
        limit,
    ) in rows:
        if number != current:
            current, engine = number, backend.engine(names[number])
        assert engine is not None
        # A pending delivery keeps its receipt and deadline; one past its deadline (or a delay
        # past its time) loads visible, its count kept.
        engine.load(
            entry_id,
            arrival,
            codec.stored_entry(payload),
            expires_at,
            hidden_until=hidden_until,
            receipt=receipt,
            deliveries=deliveries,
            dead_letter_reason=reason,
            max_deliveries=limit,
        )
        loaded += 1
    registrations = 0
    for number, registration_id, expires_at, templates, sequence in execute(
        "SELECT space, id, expires_at, templates, sequence FROM registrations "
        "WHERE expires_at IS NULL OR expires_at > ?",
        (now,),
    ):
        backend.restore_subscription(
            names[number],
            registration_id,
            codec.stored_templates(templates),
            expires_at,
            sequence + SEQUENCE_JUMP,
        )
        registrations += 1
    expiries = _load_changes(connection, backend, names, now)
    requests = 0
    for request_id, space, kind, expires_at in execute(_REQUESTS, (now, now)):
        backend.restore_request(request_id, space, kind, expires_at)
        requests += 1
    with transaction(connection):
        _record_expiries(connection, backend, names, expiries)
        expired = execute("DELETE FROM entries WHERE taken_by IS NULL AND expires_at <= ?", (now,)).rowcount
        execute("DELETE FROM registrations WHERE expires_at <= ?", (now,))
        # The jump is stored at once, so a second crash before any event jumps again from here.
        execute("UPDATE registrations SET sequence = sequence + ?", (SEQUENCE_JUMP,))
        execute("DELETE FROM entries WHERE taken_by IS NOT NULL AND taken_until <= ?", (now,))
        execute("DELETE FROM requests WHERE expires_at <= ?", (now,))
    return RecoveryReport(len(names), loaded, expired, registrations, requests, time.perf_counter() - started)


# The request ids still inside their window, in the order their windows end (the request log's):
# the requests rows, and each take's from its taken rows, which hold it themselves (format 5; a
# format-4 take's row may still be in requests, its taken rows gone).
_REQUESTS = """
SELECT id, space, kind, expires_at FROM requests WHERE expires_at > ?
UNION ALL
SELECT DISTINCT e.taken_by, s.name, 'take', e.taken_until FROM entries AS e JOIN spaces AS s ON s.no = e.space
WHERE e.taken_by IS NOT NULL AND e.taken_until > ?
ORDER BY 4
"""

# The log's changes in order, each with its payload or its entry's row's. A write's payload is
# NULL (its row holds it); when the row is gone too, the first later change of the entry that holds
# one (the one that removed it) gives it, found in the same pass (`_load_changes`). Not a subquery
# per write: nothing indexes the changes by entry (schema.py, format 4), so it would walk the log
# from the write onwards, quadratic in the log (SQLite chose that walk even with the index).
_CHANGES = """
SELECT c.space, c.seq, c.kind, c.entry_id, c.at, c.txn, c.visible_at, coalesce(c.payload, e.payload)
FROM changes c
LEFT JOIN entries e ON e.space = c.space AND e.id = c.entry_id
WHERE c.seq >= coalesce((SELECT l.oldest FROM change_logs l WHERE l.space = c.space), 1)
ORDER BY c.space, c.seq
"""

# A write waiting for the payload of a later change: where its change goes, and its columns.
_Waiting = tuple[list[Change | None], int, int, str, float, int, float | None]


def _load_changes(
    connection: sqlite3.Connection, backend: EmbeddedBackend, names: dict[int, str], now: float
) -> list[tuple[int, Change, bytes]]:
    """Restore each space's change log and durable subscriptions; then log the entries that
    expired while the server was down (returned, with their space's number, to be recorded)."""
    execute = connection.execute
    logs = {number: (epoch, oldest) for number, epoch, oldest in execute("SELECT * FROM change_logs")}
    loaded: dict[int, list[Change | None]] = {}
    # A removed entry's payload decoded once for all its changes, per (space number, id).
    decoded: dict[tuple[int, int], StoredEntry] = {}
    waiting: dict[tuple[int, int], list[_Waiting]] = {}  # writes whose row is gone, by entry
    for number, seq, kind, entry_id, at, txn, visible_at, payload in execute(_CHANGES):
        engine = backend.engine(names[number])
        if engine.changes is None:  # the log is off
            continue
        changes = loaded.get(number)
        if changes is None:
            changes = loaded[number] = []
        key = (number, entry_id)
        if payload is None:  # a write whose entry is gone: a later change may hold its payload
            waiting.setdefault(key, []).append((changes, len(changes), seq, kind, at, txn, visible_at))
            changes.append(None)
            continue
        stored = engine.stored(entry_id) or decoded.get(key)
        if stored is None:
            stored = decoded[key] = StoredEntry(entry_id, codec.stored_entry(payload), None)
        changes.append(Change(seq, kind, stored, at, txn, visible_at))
        writes = waiting.pop(key, None)
        if writes is not None:
            for into, index, w_seq, w_kind, w_at, w_txn, w_visible_at in writes:
                into[index] = Change(w_seq, w_kind, stored, w_at, w_txn, w_visible_at)
    if waiting:  # writes no later change holds (`outrig check` reports them) are not shown
        for held in loaded.values():
            held[:] = [change for change in held if change is not None]
    for number, (epoch, oldest) in logs.items():
        restored = cast(list[Change], loaded.get(number, []))  # no None left (above)
        head = max(restored[-1].seq if restored else 0, oldest - 1)
        backend.restore_changes(names[number], epoch, restored, head)
    for number, name, position in execute("SELECT space, name, position FROM change_subscriptions"):
        backend.restore_durable(names[number], name, position)
    expiries: list[tuple[int, Change, bytes]] = []
    for number, entry_id, expires_at, payload in execute(
        "SELECT space, id, expires_at, payload FROM entries "
        "WHERE taken_by IS NULL AND expires_at <= ? ORDER BY space, arrival",
        (now,),
    ):
        log = backend.engine(names[number]).changes
        if log is not None:
            stored = StoredEntry(entry_id, codec.stored_entry(payload), expires_at)
            expiries.append((number, log.append("expire", stored, now), payload))
    return expiries


def _record_expiries(
    connection: sqlite3.Connection,
    backend: EmbeddedBackend,
    names: dict[int, str],
    expiries: list[tuple[int, Change, bytes]],
) -> None:
    """Record the `expire` changes `_load_changes` logged (and the epoch of a log they begin)."""
    execute = connection.execute
    for number in dict.fromkeys(number for number, _, _ in expiries):
        log = backend.engine(names[number]).changes
        assert log is not None
        execute(
            "INSERT INTO change_logs (space, epoch, oldest) VALUES (?, ?, ?) ON CONFLICT (space) DO NOTHING",
            (number, log.epoch, log.oldest),
        )
        backend.restore_changes(names[number], log.epoch, log.after(log.oldest - 1, log.count), log.head)
    connection.executemany(
        "INSERT OR REPLACE INTO changes (space, seq, kind, entry_id, at, txn, visible_at, payload) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        [
            (number, c.seq, c.kind, c.entry.id, c.at, c.transaction, c.visible_at, payload)
            for number, c, payload in expiries
        ],
    )
