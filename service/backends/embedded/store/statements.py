"""A batch's records as SQL: one statement per kind of record, run with `executemany` over every
record of that kind that may run at the same point of the batch.

Each record (memory/journal.py) changes one row of one table, named by its key: an entry (space,
id), a registration, a request id, a change (space, seq), a type, a space's id mark, a log's
epoch, a durable subscription. Statements on different rows commute (no statement reads another
row, no triggers, no foreign keys), so only the order of a row's own records matters. The plan
puts each record in a layer: the layer of its row's previous record if that was of the same kind
(one statement keeps their order; but a take's repeat, `_DISTINCT`), the next layer if it was of
another kind, else the first. Layers run in order; inside one, each statement's rows run as one
statement of many rows (an INSERT's VALUES rows, a take's UPDATE from a VALUES list: `_MANY`),
else as one `executemany` (a kind may have a variant statement for its common case: NULL literals
instead of None parameters, which Python's sqlite3 binds slowly; see `_blob`). A pair's batch of 5
writes and 5 takes is then 7 statements, one step each (the puts, the takes of entries written in
an earlier batch, those of entries written earlier in this one, the writes' requests, the writes'
and the takes' changes) instead of 25 (a take's request has no row: `_request`).

`change_trim` deletes a range of the log: a barrier (what is planned before it runs first).
`prune_requests` has no statement here: the journal runs its deletions at COMMIT.
"""

from __future__ import annotations

import itertools
import sqlite3
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from outrig.service.backends.memory.journal import Record

Dump = Callable[[object], bytes | memoryview]
# A space's number by its name (journal.py's `_SpaceNumbers` makes a new name's at its first use).
Number = Mapping[str, int]
# What runs the statements: a connection, or a cursor of it (the journal's: journal.py `_Writer`).
Runner = sqlite3.Connection | sqlite3.Cursor
# A record, as it is (its kind first) -> (its row's key, its statement, the parameters): a binder
# unpacks the kind with the rest, so no record is sliced into a tuple of its arguments.
Bound = tuple[tuple[Any, ...], str, tuple[Any, ...]]
# None: the record needs no statement of its own (a take's request: `_request`).
Binder = Callable[[Number, Dump, Record], Bound | None]


#: Blobs up to this size are bound as a bytearray copy (see `_blob`).
_COPIED = 4096


def _blob(data: bytes | memoryview) -> bytes | memoryview | bytearray:
    """A payload as the cheapest parameter to bind: Python's sqlite3 binds an exact int, float,
    str or bytearray at once, but looks every other value (bytes, a memoryview, None) up in its
    adapter registry first, which costs about 0.85 us a parameter (two failed attribute lookups,
    each raising and clearing an AttributeError); a bytearray copy of a small entry costs 0.12.
    Larger payloads are bound as they are: the copy would cost more than the lookup."""
    return bytearray(data) if len(data) <= _COPIED else data


# The statements, each with every column a parameter (FULL below); for the change, which every
# pair records twice, variants with the columns that are NULL in the common case written as NULL
# literals, for the same reason as `_blob`: a None parameter costs an adapter lookup.
_PUT = "INSERT OR REPLACE INTO entries (space, id, arrival, expires_at, payload) VALUES (?, ?, ?, ?, ?)"
_DELETE = "DELETE FROM entries WHERE space = ? AND id = ?"
_ENTRY_EXPIRY = "UPDATE entries SET expires_at = ? WHERE space = ? AND id = ?"
_TAKE = "UPDATE entries SET taken_by = ?, taken_position = ?, taken_until = ? WHERE space = ? AND id = ?"
_VISIBILITY = (
    "UPDATE entries SET hidden_until = ?, receipt = ?, deliveries = ?, dead_letter_reason = ?, "
    "max_deliveries = ? WHERE space = ? AND id = ?"
)
_NEXT_ID = "UPDATE spaces SET next_id = max(next_id, ?) WHERE no = ?"
_TYPE = "INSERT OR IGNORE INTO types (space, name, supertypes) VALUES (?, ?, ?)"
_REGISTER = (
    "INSERT OR REPLACE INTO registrations (space, id, expires_at, templates, sequence) VALUES (?, ?, ?, ?, ?)"
)
_UNREGISTER = "DELETE FROM registrations WHERE space = ? AND id = ?"
_REGISTRATION_EXPIRY = "UPDATE registrations SET expires_at = ? WHERE space = ? AND id = ?"
_SEQUENCE = "UPDATE registrations SET sequence = max(sequence, ?) WHERE space = ? AND id = ?"
_REQUEST = (
    "INSERT OR REPLACE INTO requests "
    "(id, space, kind, expires_at, first_id, count, lease_expires_at, granted) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
)
_CHANGE_INTO = "INSERT OR REPLACE INTO changes (space, seq, kind, entry_id, at, txn, visible_at, payload) "
_CHANGE = _CHANGE_INTO + "VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
_CHANGE_WRITE = _CHANGE_INTO + "VALUES (?, ?, ?, ?, ?, ?, NULL, NULL)"  # visible at once, payload in its row
_CHANGE_GONE = _CHANGE_INTO + "VALUES (?, ?, ?, ?, ?, ?, NULL, ?)"  # visible at once, the payload kept
_CHANGE_EPOCH = (
    "INSERT INTO change_logs (space, epoch, oldest) VALUES (?, ?, 1) "
    "ON CONFLICT (space) DO UPDATE SET epoch = excluded.epoch"
)
_SUBSCRIPTION = "INSERT OR REPLACE INTO change_subscriptions (space, name, position) VALUES (?, ?, ?)"
_SUBSCRIPTION_DELETE = "DELETE FROM change_subscriptions WHERE space = ? AND name = ?"


def _put(numbers: Number, dump: Dump, r: Record) -> Bound:
    _, space, entry_id, arrival, expires_at, payload = r
    no = numbers[space]
    return ("e", no, entry_id), _PUT, (no, entry_id, arrival, expires_at, _blob(dump(payload)))


def _entry(numbers: Number, dump: Dump, r: Record) -> Bound:
    """delete(space, id): the key columns are the statement's only parameters."""
    _, space, entry_id = r
    no = numbers[space]
    return ("e", no, entry_id), _DELETE, (no, entry_id)


def _entry_expiry(numbers: Number, dump: Dump, r: Record) -> Bound:
    _, space, entry_id, expires_at = r
    no = numbers[space]
    return ("e", no, entry_id), _ENTRY_EXPIRY, (expires_at, no, entry_id)


def _take(numbers: Number, dump: Dump, r: Record) -> Bound:
    """The row stays, marked, to answer the take's retry until `until`, the request's window end
    (its request row's expires_at: the taker index is in that order, schema.py)."""
    _, space, entry_id, request_id, position, until = r
    no = numbers[space]
    return ("e", no, entry_id), _TAKE, (request_id, position, until, no, entry_id)


def _visibility(numbers: Number, dump: Dump, r: Record) -> Bound:
    space, entry_id, hidden_until, receipt, deliveries, reason = r[1], r[2], r[3], r[4], r[5], r[6]
    limit = r[7] if len(r) > 7 else 0
    no = numbers[space]
    return ("e", no, entry_id), _VISIBILITY, (hidden_until, receipt, deliveries, reason, limit, no, entry_id)


def _next_id(numbers: Number, dump: Dump, r: Record) -> Bound:
    _, space, mark = r
    no = numbers[space]
    return ("s", no), _NEXT_ID, (mark, no)


def _type(numbers: Number, dump: Dump, r: Record) -> Bound:
    _, space, name, supertypes = r
    no = numbers[space]
    return ("t", no, name), _TYPE, (no, name, supertypes)


def _register(numbers: Number, dump: Dump, r: Record) -> Bound:
    _, space, registration_id, expires_at, templates, sequence = r
    no = numbers[space]
    return ("r", no, registration_id), _REGISTER, (no, registration_id, expires_at, templates, sequence)


def _registration(numbers: Number, dump: Dump, r: Record) -> Bound:
    """unregister(space, id)."""
    _, space, registration_id = r
    no = numbers[space]
    return ("r", no, registration_id), _UNREGISTER, (no, registration_id)


def _registration_expiry(numbers: Number, dump: Dump, r: Record) -> Bound:
    _, space, registration_id, value = r
    no = numbers[space]
    return ("r", no, registration_id), _REGISTRATION_EXPIRY, (value, no, registration_id)


def _sequence(numbers: Number, dump: Dump, r: Record) -> Bound:
    _, space, registration_id, value = r
    no = numbers[space]
    return ("r", no, registration_id), _SEQUENCE, (value, no, registration_id)


def _request(numbers: Number, dump: Dump, r: Record) -> Bound | None:
    """request(request_id, space, kind, expires_at, first_id, count, lease_expires_at, granted):
    the requests table names its space (no number). A take's has no row (format 5): its `take`
    records, in the same change, mark its rows with its id and window end, which answer its
    retry and are what start-up remembers it by. (With the take's row went the variant for its
    NULL columns: a write's request has them all.)"""
    if r[3] == "take":
        return None
    return ("q", r[1]), _REQUEST, r[1:]


def _change(numbers: Number, dump: Dump, r: Record) -> Bound:
    """A change of the space's log (a write's payload None: its entry's row holds it)."""
    _, space, seq, kind, entry_id, at, txn, visible_at, payload = r
    no = numbers[space]
    key = ("c", no, seq)
    if visible_at is None:
        if payload is None:
            return key, _CHANGE_WRITE, (no, seq, kind, entry_id, at, txn)
        return key, _CHANGE_GONE, (no, seq, kind, entry_id, at, txn, _blob(dump(payload)))
    return (
        key,
        _CHANGE,
        (no, seq, kind, entry_id, at, txn, visible_at, None if payload is None else dump(payload)),
    )


def _change_epoch(numbers: Number, dump: Dump, r: Record) -> Bound:
    _, space, epoch = r
    no = numbers[space]
    return ("l", no), _CHANGE_EPOCH, (no, epoch)


def _subscription(numbers: Number, dump: Dump, r: Record) -> Bound:
    _, space, name, position = r
    no = numbers[space]
    return ("u", no, name), _SUBSCRIPTION, (no, name, position)


def _subscription_delete(numbers: Number, dump: Dump, r: Record) -> Bound:
    _, space, name = r
    no = numbers[space]
    return ("u", no, name), _SUBSCRIPTION_DELETE, (no, name)


#: Per kind of record: how a record binds to its statement.
STATEMENTS: dict[str, Binder] = {
    "put": _put,
    "delete": _entry,
    "entry_expiry": _entry_expiry,
    "take": _take,
    "visibility": _visibility,
    "next_id": _next_id,
    "type": _type,
    "register": _register,
    "unregister": _registration,
    "registration_expiry": _registration_expiry,
    "sequence": _sequence,
    "request": _request,
    "change": _change,
    "change_epoch": _change_epoch,
    "subscription": _subscription,
    "subscription_delete": _subscription_delete,
}

#: Per kind, the statement with every column a parameter: what a variant must equal (the tests).
FULL: dict[str, str] = {"request": _REQUEST, "change": _CHANGE}

#: Batches of at most this many records run one statement each, in order, unplanned.
_FEW = 4
#: Kinds the plan does not bind (see the module docstring).
BARRIER = "change_trim"
PRUNE = "prune_requests"


def run(connection: Runner, records: Sequence[Record], numbers: Number, dump: Dump) -> float | None:
    """Run `records`' statements, grouped (see the module docstring), in the open transaction.
    Returns the `now` of the batch's last `prune_requests`, if any (the caller prunes at COMMIT).
    An unknown kind raises KeyError (the journal then rolls the whole batch back)."""
    prune: float | None = None
    statements = STATEMENTS
    if len(records) <= _FEW:  # a lone caller's batch: nothing to group, planning would cost more
        for record in records:
            bind = statements.get(record[0])
            if bind is None:
                prune = _unbound(connection, record, numbers, prune)
            elif (bound := bind(numbers, dump, record)) is not None:
                connection.execute(bound[1], bound[2])
        return prune
    # Each layer: per statement, its parameters. A statement stands for its kind here: a row's
    # records of one kind but different variants go to different layers, so they keep their order.
    layers: list[dict[str, list[tuple[Any, ...]]]] = []
    rows: dict[tuple[Any, ...], tuple[int, str]] = {}  # a row's key -> its last record's layer, statement
    for record in records:
        bind = statements.get(record[0])
        if bind is None:
            if record[0] != PRUNE:  # a barrier: what was planned before it runs first
                _execute(connection, layers)
                layers, rows = [], {}
            prune = _unbound(connection, record, numbers, prune)
            continue
        bound = bind(numbers, dump, record)
        if bound is None:
            continue
        key, sql, parameters = bound
        last = rows.get(key)
        if last is None:
            layer = 0
        elif last[1] == sql and sql not in _DISTINCT:
            layer = last[0]
        else:
            layer = last[0] + 1
        rows[key] = (layer, sql)
        if layer == len(layers):
            layers.append({})
        group = layers[layer].get(sql)
        if group is None:
            layers[layer][sql] = [parameters]
        else:
            group.append(parameters)
    _execute(connection, layers)
    return prune


def _unbound(connection: Runner, record: Record, numbers: Number, prune: float | None) -> float | None:
    """A record without a bound statement: `prune_requests` (returns its `now`), `change_trim`."""
    kind = record[0]
    if kind == PRUNE:
        return float(record[1])
    if kind != BARRIER:
        raise KeyError(f"a record of unknown kind {kind!r}")
    space, oldest = record[1:]
    no = numbers[space]
    connection.execute("UPDATE change_logs SET oldest = max(oldest, ?) WHERE space = ?", (oldest, no))
    connection.execute("DELETE FROM changes WHERE space = ? AND seq < ?", (no, oldest))
    return prune


def _values(sql: str) -> tuple[str, str, str]:
    """An INSERT of one VALUES row as (what comes before its rows, a row, what comes after)."""
    head, _, row = sql.partition(" VALUES ")
    return f"{head} VALUES ", row, ""


#: The statements whose rows of one layer run as one statement of several rows (`_execute`): the
#: INSERTs as many VALUES rows, a take's UPDATE from a VALUES list of its rows (one search of the
#: entries' key per row, as the one-row statement does).
_MANY: dict[str, tuple[str, str, str]] = {
    **{sql: _values(sql) for sql in (_PUT, _TYPE, _REGISTER, _REQUEST, _CHANGE, _CHANGE_WRITE, _CHANGE_GONE)},
    _SUBSCRIPTION: _values(_SUBSCRIPTION),
}
#: UPDATE ... FROM is SQLite 3.33's (2020): with an older library (the one Python's sqlite3 was
#: built against) a take's rows stay one `executemany`.
UPDATE_FROM = sqlite3.sqlite_version_info >= (3, 33, 0)
if UPDATE_FROM:
    _MANY[_TAKE] = (
        "UPDATE entries SET taken_by = v.column1, taken_position = v.column2, taken_until = v.column3 "
        "FROM (VALUES ",
        "(?, ?, ?, ?, ?)",
        ") AS v WHERE entries.space = v.column4 AND entries.id = v.column5",
    )
#: Of those, the UPDATEs: a row that two of its rows in one statement would change gets one of
#: them, SQLite does not say which, so the plan puts a row's repeat in the next layer.
_DISTINCT = frozenset({_TAKE}) if UPDATE_FROM else frozenset()
#: Rows per such statement at most (so at most this many texts of each in sqlite3's statement
#: cache, and 8 * 16 parameters, far below SQLite's limit).
_ROWS = 16
#: (statement, rows) -> the statement for that many rows.
_TEXTS: dict[tuple[str, int], str] = {}


def _rows_of(sql: str, rows: int) -> str:
    """`sql` (one row's statement, in `_MANY`) for `rows` rows, in their order."""
    text = _TEXTS.get((sql, rows))
    if text is None:
        before, row, after = _MANY[sql]
        text = _TEXTS[(sql, rows)] = before + ", ".join([row] * rows) + after
    return text


def _execute(connection: Runner, layers: list[dict[str, list[tuple[Any, ...]]]]) -> None:
    """Each layer's statements, each with its parameters. The rows of a statement in `_MANY` go
    as one statement of many rows (up to `_ROWS` at a time; an INSERT's in order, as
    `executemany` would insert them; an UPDATE's each a different row, `_DISTINCT`): one step of
    the statement instead of one per row (and Python's sqlite3 releases and takes back the GIL
    around each step and each reset, two hand-offs a row)."""
    chain = itertools.chain.from_iterable
    for layer in layers:
        for sql, parameters in layer.items():
            count = len(parameters)
            if count == 1:
                connection.execute(sql, parameters[0])
            elif sql not in _MANY:
                connection.executemany(sql, parameters)
            elif count <= _ROWS:
                connection.execute(_rows_of(sql, count), list(chain(parameters)))
            else:
                for start in range(0, count, _ROWS):
                    rows = parameters[start : start + _ROWS]
                    connection.execute(_rows_of(sql, len(rows)), list(chain(rows)))
