"""A batch's records as SQL: one statement per kind of record, run with `executemany` over every
record of that kind that may run at the same point of the batch.

Each record (memory/journal.py) changes one row of one table, named by its key: an entry (space,
id), a registration, a request id, a change (space, seq), a type, a space's id mark, a log's
epoch, a durable subscription. Statements on different rows commute (no statement reads another
row, no triggers, no foreign keys), so only the order of a row's own records matters. The plan
puts each record in a layer: the layer of its row's previous record if that was of the same kind
(one `executemany` keeps their order), the next layer if it was of another kind, else the first.
Layers run in order; inside one, each kind's parameters are one `executemany`. A pair's batch of
5 writes and 5 takes is then 5 statements (the puts, the takes of entries written in an earlier
batch, those of entries written earlier in this one, the requests, the changes) instead of 30.

`change_trim` deletes a range of the log: a barrier (what is planned before it runs first).
`prune_requests` has no statement here: the journal runs its deletions at COMMIT.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from typing import Any

from outrig.service.backends.memory.journal import Record

Dump = Callable[[object], bytes | memoryview]
Number = Callable[[str], int]
# A record's arguments (after its kind) -> (its row's key, its statement's parameters).
Binder = Callable[[Number, Dump, tuple[Any, ...]], tuple[tuple[Any, ...], tuple[Any, ...]]]


def _put(number: Number, dump: Dump, a: tuple[Any, ...]) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    space, entry_id, arrival, expires_at, payload = a
    no = number(space)
    return ("e", no, entry_id), (no, entry_id, arrival, expires_at, dump(payload))


def _entry(number: Number, dump: Dump, a: tuple[Any, ...]) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """delete(space, id): the key columns are the statement's only parameters."""
    space, entry_id = a
    no = number(space)
    return ("e", no, entry_id), (no, entry_id)


def _entry_expiry(number: Number, dump: Dump, a: tuple[Any, ...]) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    space, entry_id, expires_at = a
    no = number(space)
    return ("e", no, entry_id), (expires_at, no, entry_id)


def _take(number: Number, dump: Dump, a: tuple[Any, ...]) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """The row stays, marked, to answer the take's retry until `until`, the request's window end
    (its request row's expires_at: the taker index is in that order, schema.py)."""
    space, entry_id, request_id, position, until = a[:5]
    no = number(space)
    return ("e", no, entry_id), (request_id, position, until, no, entry_id)


def _visibility(number: Number, dump: Dump, a: tuple[Any, ...]) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    space, entry_id, hidden_until, receipt, deliveries, reason = a[:6]
    limit = a[6] if len(a) > 6 else 0
    no = number(space)
    return ("e", no, entry_id), (hidden_until, receipt, deliveries, reason, limit, no, entry_id)


def _next_id(number: Number, dump: Dump, a: tuple[Any, ...]) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    space, mark = a
    no = number(space)
    return ("s", no), (mark, no)


def _type(number: Number, dump: Dump, a: tuple[Any, ...]) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    space, name, supertypes = a
    no = number(space)
    return ("t", no, name), (no, name, supertypes)


def _register(number: Number, dump: Dump, a: tuple[Any, ...]) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    space, registration_id, expires_at, templates, sequence = a
    no = number(space)
    return ("r", no, registration_id), (no, registration_id, expires_at, templates, sequence)


def _registration(number: Number, dump: Dump, a: tuple[Any, ...]) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """unregister(space, id)."""
    space, registration_id = a
    no = number(space)
    return ("r", no, registration_id), (no, registration_id)


def _registration_value(
    number: Number, dump: Dump, a: tuple[Any, ...]
) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """registration_expiry(space, id, expires_at) and sequence(space, id, seq)."""
    space, registration_id, value = a
    no = number(space)
    return ("r", no, registration_id), (value, no, registration_id)


def _request(number: Number, dump: Dump, a: tuple[Any, ...]) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """request(request_id, space, kind, expires_at, first_id, count, lease_expires_at, granted):
    the requests table names its space (no number)."""
    return ("q", a[0]), a


def _change(number: Number, dump: Dump, a: tuple[Any, ...]) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """A change of the space's log (a write's payload None: its entry's row holds it)."""
    space, seq, kind, entry_id, at, txn, visible_at, payload = a
    no = number(space)
    return ("c", no, seq), (
        no,
        seq,
        kind,
        entry_id,
        at,
        txn,
        visible_at,
        None if payload is None else dump(payload),
    )


def _change_epoch(number: Number, dump: Dump, a: tuple[Any, ...]) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    space, epoch = a
    no = number(space)
    return ("l", no), (no, epoch)


def _subscription(number: Number, dump: Dump, a: tuple[Any, ...]) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    space, name, position = a
    no = number(space)
    return ("u", no, name), (no, name, position)


def _subscription_delete(
    number: Number, dump: Dump, a: tuple[Any, ...]
) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    space, name = a
    no = number(space)
    return ("u", no, name), (no, name)


#: Per kind of record: its statement, and how a record binds to it.
STATEMENTS: dict[str, tuple[str, Binder]] = {
    "put": (
        "INSERT OR REPLACE INTO entries (space, id, arrival, expires_at, payload) VALUES (?, ?, ?, ?, ?)",
        _put,
    ),
    "delete": ("DELETE FROM entries WHERE space = ? AND id = ?", _entry),
    "entry_expiry": ("UPDATE entries SET expires_at = ? WHERE space = ? AND id = ?", _entry_expiry),
    "take": (
        "UPDATE entries SET taken_by = ?, taken_position = ?, taken_until = ? WHERE space = ? AND id = ?",
        _take,
    ),
    "visibility": (
        "UPDATE entries SET hidden_until = ?, receipt = ?, deliveries = ?, dead_letter_reason = ?, "
        "max_deliveries = ? WHERE space = ? AND id = ?",
        _visibility,
    ),
    "next_id": ("UPDATE spaces SET next_id = max(next_id, ?) WHERE no = ?", _next_id),
    "type": ("INSERT OR IGNORE INTO types (space, name, supertypes) VALUES (?, ?, ?)", _type),
    "register": (
        "INSERT OR REPLACE INTO registrations (space, id, expires_at, templates, sequence) "
        "VALUES (?, ?, ?, ?, ?)",
        _register,
    ),
    "unregister": ("DELETE FROM registrations WHERE space = ? AND id = ?", _registration),
    "registration_expiry": (
        "UPDATE registrations SET expires_at = ? WHERE space = ? AND id = ?",
        _registration_value,
    ),
    "sequence": (
        "UPDATE registrations SET sequence = max(sequence, ?) WHERE space = ? AND id = ?",
        _registration_value,
    ),
    "request": (
        "INSERT OR REPLACE INTO requests "
        "(id, space, kind, expires_at, first_id, count, lease_expires_at, granted) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        _request,
    ),
    "change": (
        "INSERT OR REPLACE INTO changes (space, seq, kind, entry_id, at, txn, visible_at, payload) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        _change,
    ),
    "change_epoch": (
        "INSERT INTO change_logs (space, epoch, oldest) VALUES (?, ?, 1) "
        "ON CONFLICT (space) DO UPDATE SET epoch = excluded.epoch",
        _change_epoch,
    ),
    "subscription": (
        "INSERT OR REPLACE INTO change_subscriptions (space, name, position) VALUES (?, ?, ?)",
        _subscription,
    ),
    "subscription_delete": (
        "DELETE FROM change_subscriptions WHERE space = ? AND name = ?",
        _subscription_delete,
    ),
}

#: Batches of at most this many records run one statement each, in order, unplanned.
_FEW = 4
#: Kinds the plan does not bind (see the module docstring).
BARRIER = "change_trim"
PRUNE = "prune_requests"


def run(
    connection: sqlite3.Connection, records: Sequence[Record], number: Number, dump: Dump
) -> float | None:
    """Run `records`' statements, grouped (see the module docstring), in the open transaction.
    Returns the `now` of the batch's last `prune_requests`, if any (the caller prunes at COMMIT).
    An unknown kind raises KeyError (the journal then rolls the whole batch back)."""
    prune: float | None = None
    statements = STATEMENTS
    if len(records) <= _FEW:  # a lone caller's batch: nothing to group, planning would cost more
        for record in records:
            spec = statements.get(record[0])
            if spec is None:
                prune = _unbound(connection, record, number, prune)
            else:
                connection.execute(spec[0], spec[1](number, dump, record[1:])[1])
        return prune
    layers: list[dict[str, list[tuple[Any, ...]]]] = []
    rows: dict[tuple[Any, ...], tuple[int, str]] = {}  # a row's key -> its last record's layer, kind
    for record in records:
        kind = record[0]
        spec = statements.get(kind)
        if spec is None:
            if kind != PRUNE:  # a barrier: what was planned before it runs first
                _execute(connection, layers)
                layers, rows = [], {}
            prune = _unbound(connection, record, number, prune)
            continue
        key, parameters = spec[1](number, dump, record[1:])
        last = rows.get(key)
        if last is None:
            layer = 0
        elif last[1] == kind:
            layer = last[0]
        else:
            layer = last[0] + 1
        rows[key] = (layer, kind)
        if layer == len(layers):
            layers.append({})
        group = layers[layer].get(kind)
        if group is None:
            layers[layer][kind] = [parameters]
        else:
            group.append(parameters)
    _execute(connection, layers)
    return prune


def _unbound(
    connection: sqlite3.Connection, record: Record, number: Number, prune: float | None
) -> float | None:
    """A record without a bound statement: `prune_requests` (returns its `now`), `change_trim`."""
    kind = record[0]
    if kind == PRUNE:
        return float(record[1])
    if kind != BARRIER:
        raise KeyError(f"a record of unknown kind {kind!r}")
    space, oldest = record[1:]
    no = number(space)
    connection.execute("UPDATE change_logs SET oldest = max(oldest, ?) WHERE space = ?", (oldest, no))
    connection.execute("DELETE FROM changes WHERE space = ? AND seq < ?", (no, oldest))
    return prune


def _execute(connection: sqlite3.Connection, layers: list[dict[str, list[tuple[Any, ...]]]]) -> None:
    statements = STATEMENTS
    for layer in layers:
        for kind, parameters in layer.items():
            sql = statements[kind][0]
            if len(parameters) == 1:
                connection.execute(sql, parameters[0])
            else:
                connection.executemany(sql, parameters)
