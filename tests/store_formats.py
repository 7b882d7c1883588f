"""Older store formats made from a new store, for the tests of their migrations (schema.py)."""

from __future__ import annotations

import sqlite3


def with_entry_index(db: sqlite3.Connection) -> None:
    """A format-4 store as outrig made it before the change log lost its index by entry."""
    db.execute("CREATE INDEX changes_by_entry ON changes (space, entry_id)")


def as_format_4(db: sqlite3.Connection) -> None:
    """Undo format 5 in `db` (a store this outrig made): each take's request id has a requests row
    too (its count of taken rows, no first id, lease or grant), and the change log is indexed by
    entry."""
    db.executescript(
        """
        INSERT INTO requests (id, space, kind, expires_at, first_id, count, lease_expires_at, granted)
            SELECT e.taken_by, s.name, 'take', e.taken_until, NULL, count(*), NULL, NULL
            FROM entries AS e JOIN spaces AS s ON s.no = e.space
            WHERE e.taken_by IS NOT NULL GROUP BY e.taken_until, e.taken_by;
        PRAGMA user_version = 4;
        """
    )
    with_entry_index(db)


def as_format_3(db: sqlite3.Connection) -> None:
    """Undo formats 5 and 4 in `db` (a store this outrig made): requests keyed by their id, with an
    index on their window's end, taken rows indexed by their taker alone, with no taken_until, and
    the change log indexed by entry."""
    as_format_4(db)
    db.executescript(
        """
        DROP INDEX entries_by_taker;
        ALTER TABLE entries DROP COLUMN taken_until;
        CREATE INDEX entries_by_taker ON entries (taken_by) WHERE taken_by IS NOT NULL;
        CREATE TABLE requests_3 (
            id TEXT PRIMARY KEY, space TEXT NOT NULL, kind TEXT NOT NULL, expires_at REAL NOT NULL,
            first_id INTEGER, count INTEGER NOT NULL, lease_expires_at REAL, granted REAL
        ) WITHOUT ROWID;
        INSERT INTO requests_3 SELECT id, space, kind, expires_at, first_id, count, lease_expires_at, granted
            FROM requests;
        DROP TABLE requests;
        ALTER TABLE requests_3 RENAME TO requests;
        CREATE INDEX requests_by_expiry ON requests (expires_at);
        PRAGMA user_version = 3;
        """
    )
