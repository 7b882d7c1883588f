"""A batch's records run grouped (store/statements.py) leave a real SQLite store exactly as the same
records run one statement each, in order: random batches over a few rows (puts, takes, deletes,
expiries, delivery states of the same entries, requests, changes, a trim between them). The
reference runs requests and changes by their full statements (every column a parameter), so the
variants the grouped run picks (NULL literals, small payloads bound as bytearrays) are checked
against them too."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from outrig.service.backends.embedded.store import statements
from outrig.service.backends.embedded.store.schema import open_store
from outrig.service.backends.memory.journal import Record

_TABLES = (
    "spaces",
    "types",
    "entries",
    "registrations",
    "requests",
    "change_logs",
    "changes",
    "change_subscriptions",
)


def _dump(payload: object) -> bytes:
    assert isinstance(payload, bytes)
    return payload


def _store(path: Path) -> sqlite3.Connection:
    connection = open_store(path, "test")
    for name in ("a", "b"):
        connection.execute("INSERT INTO spaces (name, next_id) VALUES (?, 1)", (name,))
    return connection


def _number(connection: sqlite3.Connection) -> dict[str, int]:
    return dict(connection.execute("SELECT name, no FROM spaces").fetchall())


def _one_by_one(connection: sqlite3.Connection, records: list[Record]) -> None:
    """The reference: each record its own statement, in order."""
    number = _number(connection)
    for record in records:
        kind = record[0]
        if kind == statements.PRUNE:
            continue
        if kind == statements.BARRIER:
            no = number[record[1]]
            connection.execute(
                "UPDATE change_logs SET oldest = max(oldest, ?) WHERE space = ?", (record[2], no)
            )
            connection.execute("DELETE FROM changes WHERE space = ? AND seq < ?", (no, record[2]))
            continue
        if kind == "request" and record[3] == "take":
            continue  # no row of its own (format 5): its take records mark the taken rows
        if kind in _FULL_PARAMETERS:  # the statement with every column a parameter, not its variants
            connection.execute(statements.FULL[kind], _FULL_PARAMETERS[kind](number, record))
            continue
        bound = statements.STATEMENTS[kind](number, _dump, record)
        assert bound is not None
        connection.execute(bound[1], bound[2])


# For the kinds with variant statements (NULL literals for their common case, store/statements.py):
# a record's columns in the order of its full statement, None where a column is NULL.
_FULL_PARAMETERS: dict[str, Any] = {
    "request": lambda number, record: record[1:],
    "change": lambda number, record: (number[record[1]], *record[2:]),
}


def _contents(connection: sqlite3.Connection) -> dict[str, list[tuple[Any, ...]]]:
    return {
        table: sorted(connection.execute(f"SELECT * FROM {table}").fetchall(), key=repr) for table in _TABLES
    }


_spaces = st.sampled_from(["a", "b"])
_ids = st.integers(1, 4)
_times = st.one_of(st.none(), st.floats(1.0, 100.0))
_records = st.one_of(
    st.tuples(st.just("put"), _spaces, _ids, st.integers(1, 9), _times, st.binary(max_size=4)),
    st.tuples(st.just("delete"), _spaces, _ids),
    st.tuples(st.just("entry_expiry"), _spaces, _ids, _times),
    st.tuples(st.just("take"), _spaces, _ids, st.sampled_from(["r1", "r2"]), st.integers(0, 2), _times),
    st.tuples(
        st.just("visibility"),
        _spaces,
        _ids,
        _times,
        st.one_of(st.none(), st.integers(1, 5)),
        st.integers(0, 3),
        st.one_of(st.none(), st.just("max deliveries")),
        st.integers(0, 2),
    ),
    st.tuples(st.just("next_id"), _spaces, st.integers(1, 2000)),
    st.tuples(st.just("type"), _spaces, st.sampled_from(["T", "U"]), st.sampled_from(["[]", '["T"]'])),
    st.tuples(st.just("register"), _spaces, _ids, _times, st.binary(max_size=3), st.integers(0, 9)),
    st.tuples(st.just("unregister"), _spaces, _ids),
    st.tuples(st.just("registration_expiry"), _spaces, _ids, _times),
    st.tuples(st.just("sequence"), _spaces, _ids, st.integers(0, 9)),
    st.tuples(
        st.just("request"),
        st.sampled_from(["r1", "r2", "r3"]),
        _spaces,
        st.sampled_from(["write", "take"]),
        st.floats(1.0, 100.0),
        st.one_of(st.none(), _ids),
        st.integers(0, 3),
        _times,
        _times,
    ),
    st.tuples(  # a take's: no first id, lease or grant
        st.just("request"),
        st.sampled_from(["r1", "r2", "r3"]),
        _spaces,
        st.just("take"),
        st.floats(1.0, 100.0),
        st.none(),
        st.integers(0, 3),
        st.none(),
        st.none(),
    ),
    st.tuples(
        st.just("change"),
        _spaces,
        st.integers(1, 6),
        st.sampled_from(["write", "take"]),
        _ids,
        st.floats(1.0, 100.0),
        st.integers(0, 2),
        _times,
        st.one_of(st.none(), st.binary(max_size=3), st.just(b"x" * 5000)),  # bound as it is
    ),
    st.tuples(st.just("change_epoch"), _spaces, st.integers(1, 9)),
    st.tuples(st.just("change_trim"), _spaces, st.integers(1, 6)),
    st.tuples(st.just("subscription"), _spaces, st.sampled_from(["s", "t"]), st.integers(0, 9)),
    st.tuples(st.just("subscription_delete"), _spaces, st.sampled_from(["s", "t"])),
    st.tuples(st.just("prune_requests"), st.floats(1.0, 100.0)),
)


@settings(max_examples=60, deadline=None)
@given(records=st.lists(_records, max_size=30))
def test_grouped_statements_leave_the_store_as_one_statement_per_record(
    tmp_path_factory: Any, records: list[Record]
) -> None:
    prune = _grouped_as_one_by_one(tmp_path_factory, records)
    pruned = [record[1] for record in records if record[0] == "prune_requests"]
    assert prune == (pruned[-1] if pruned else None)


def _grouped_as_one_by_one(tmp_path_factory: Any, records: list[Record]) -> float | None:
    """Run `records` grouped in one store and one statement per record in another, check that
    both stores hold the same, and give the grouped run's prune."""
    grouped = _store(tmp_path_factory.mktemp("grouped"))
    reference = _store(tmp_path_factory.mktemp("reference"))
    try:
        prune = statements.run(grouped, records, _number(grouped), _dump)
        _one_by_one(reference, records)
        assert _contents(grouped) == _contents(reference)
        return prune
    finally:
        grouped.close()
        reference.close()


# Inserts, deletes and takes, over more rows and in larger batches: one kind's rows of a layer go as
# one statement of many rows, up to statements._ROWS at a time (the rest in a further statement),
# a row inserted twice in one of them keeps the later values, and a row taken twice is taken by the
# later take, as one statement per record does.
_insert_ids = st.integers(1, 40)
_inserts = st.one_of(
    st.tuples(st.just("put"), _spaces, _insert_ids, st.integers(1, 9), _times, st.binary(max_size=4)),
    st.tuples(
        st.just("request"),
        st.sampled_from([f"r{n}" for n in range(30)]),
        _spaces,
        st.just("write"),
        st.floats(1.0, 100.0),
        _insert_ids,
        st.integers(0, 3),
        _times,
        _times,
    ),
    st.tuples(
        st.just("change"),
        _spaces,
        _insert_ids,
        st.sampled_from(["write", "take"]),
        _insert_ids,
        st.floats(1.0, 100.0),
        st.integers(0, 2),
        st.none(),
        st.one_of(st.none(), st.binary(max_size=3)),
    ),
    st.tuples(st.just("delete"), _spaces, _insert_ids),
    st.tuples(  # an UPDATE from a VALUES list: a row taken twice goes to the next layer
        st.just("take"), _spaces, _insert_ids, st.sampled_from(["r1", "r2"]), st.integers(0, 2), _times
    ),
)


@settings(max_examples=40, deadline=None)
@given(records=st.lists(_inserts, min_size=statements._ROWS, max_size=4 * statements._ROWS))
def test_large_batches_of_inserts_leave_the_store_as_one_statement_per_record(
    tmp_path_factory: Any, records: list[Record]
) -> None:
    _grouped_as_one_by_one(tmp_path_factory, records)


def test_a_row_inserted_twice_in_one_statement_keeps_the_later_values(tmp_path: Path) -> None:
    """The case the random batches may miss: one layer's two puts of the same entry, and more
    rows than one statement takes, each row's last put kept; then two takes of each."""
    connection = _store(tmp_path)
    try:
        records: list[Record] = [
            ("put", "a", n % 20, n, None, bytes([n])) for n in range(2 * statements._ROWS + 3)
        ]
        statements.run(connection, records, _number(connection), _dump)
        rows = connection.execute("SELECT id, arrival, payload FROM entries ORDER BY id").fetchall()
        expected = {n % 20: n for n in range(2 * statements._ROWS + 3)}
        assert rows == [(entry_id, n, bytes([n])) for entry_id, n in sorted(expected.items())]
        _take_each_twice(connection)
    finally:
        connection.close()


def _take_each_twice(connection: sqlite3.Connection) -> None:
    """Take entries 0-19 of space "a" twice each in one batch: each row keeps its later take."""
    takes: list[Record] = [("take", "a", n % 20, f"r{n}", n, 50.0) for n in range(40)]
    statements.run(connection, takes, _number(connection), _dump)
    taken = connection.execute("SELECT id, taken_by, taken_position FROM entries ORDER BY id").fetchall()
    assert taken == [(n, f"r{n + 20}", n + 20) for n in range(20)]


def test_takes_without_update_from_run_as_one_executemany(tmp_path: Path, monkeypatch: Any) -> None:
    """With an SQLite older than 3.33 (no UPDATE ... FROM) a take's rows stay one `executemany`,
    a row's repeated take in the same layer: each row's later take still wins."""
    monkeypatch.delitem(statements._MANY, statements._TAKE, raising=False)
    monkeypatch.setattr(statements, "_DISTINCT", frozenset())
    connection = _store(tmp_path)
    try:
        puts: list[Record] = [("put", "a", n, n, 90.0, bytes([n])) for n in range(20)]
        statements.run(connection, puts, _number(connection), _dump)
        _take_each_twice(connection)
    finally:
        connection.close()
