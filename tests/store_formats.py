"""Older store formats made from a new store, for the tests of their migrations (schema.py)."""

from __future__ import annotations

import sqlite3


def with_entry_index(db: sqlite3.Connection) -> None:
    """A format-4 store as outrig made it before the change log lost its index by entry."""
    db.execute("CREATE INDEX changes_by_entry ON changes (space, entry_id)")


def as_format_3(db: sqlite3.Connection) -> None:
    """Undo format 4 in `db` (a store this outrig made): requests keyed by their id, with an index
    on their window's end, taken rows indexed by their taker alone, with no taken_until, and the
    change log indexed by entry."""
    db.executescript(
        """
        CREATE INDEX IF NOT EXISTS changes_by_entry ON changes (space, entry_id);
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
