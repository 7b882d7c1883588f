"""The data directory: one SQLite database in WAL mode, its schema, its version and its lock.

    DATA_DIR/outrig.db        the record (SQLite, WAL mode; -wal and -shm beside it)
    DATA_DIR/outrig.lock      held (flock) by the one server using the directory

The in-memory indexes serve every request; this database is what they are rebuilt from at start.
Tables (the `space` columns hold a space's number from `spaces`, except in `requests`, which
names the space):

    meta(key, value)                       format version, who created the store and when
    spaces(no, name, next_id)              each space, and an id above every id it has handed out
                                           (reserved in blocks, so not written at every write)
    types(space, name, supertypes)         declared types (supertypes as a JSON list)
    entries(space, id, arrival, expires_at, payload, taken_by, taken_position,
            hidden_until, receipt, deliveries, dead_letter_reason, max_deliveries, taken_until)
                                           entries; payload is the protobuf-encoded
                                           outrig.v1.Entry. A row with taken_by set was taken by
                                           that request id and is kept only to answer its retry,
                                           until its window ends (taken_until).
                                           The delivery state (engine/deliveries.py): hidden until
                                           (a pending delivery's deadline or a delayed entry's
                                           time; NULL or past: visible), the pending delivery's
                                           receipt, the delivery count, why it is a dead letter,
                                           and the pending delivery's take's own max_deliveries
                                           (0: the space's setting)
    registrations(space, id, expires_at, templates, sequence)  notify registrations; templates
                                           is a protobuf-encoded outrig.v1.NotifyRequest
    requests(id, space, kind, expires_at, first_id, count, lease_expires_at, granted)
                                           idempotency keys within their window, keyed by
                                           (expires_at, id): the order they are added in; a write's
                                           answer is its leases (ids first_id .. first_id+count-1,
                                           one expiry and duration); a deliver's, ack's, nack's or
                                           extend's is in its columns (memory/journal.py). A
                                           take's id has no row here (format 5): its taken rows
                                           are its answer and its record (taken_by, taken_until)
    change_logs(space, epoch, oldest)      a space's change log (engine/changes.py): its epoch,
                                           and the oldest seq retention keeps (the head is the
                                           last change's seq, or oldest - 1 when none is left)
    changes(space, seq, kind, entry_id, at, txn, visible_at, payload)
                                           the log's changes; a write's payload is NULL (its
                                           entry's row holds it, or the later change that removed
                                           the entry: memory/journal.py)
    change_subscriptions(space, name, position)  durable subscriptions and their positions
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sqlite3
import time
from pathlib import Path

from outrig.service.exceptions import IncompatibleStoreError, StoreLockedError

DB_NAME = "outrig.db"
LOCK_NAME = "outrig.lock"
# 'outr': marks the file as an outrig store (SQLite's application_id header field).
APPLICATION_ID = 0x6F757472
# Bump on any change a server of the previous version could not read; say what changed here.
# 1: the first durable format.
# 2: entries keep their delivery state (hidden_until, receipt, deliveries, dead_letter_reason);
#    a format-1 store is migrated when a server opens it (`_MIGRATIONS`).
# 3: the change log (change_logs, changes, change_subscriptions); a pending delivery keeps its
#    take's own max_deliveries (0: the space's setting applies). A format-2 store is migrated
#    (its spaces' logs start empty, their epochs made at their first change).
# 4: request ids are kept in the order their windows end: `requests` is keyed by (expires_at, id)
#    instead of id, and a taken entry's row keeps its take's window end (`taken_until`), indexed
#    with its taker. Request ids are random (uuid4), so a B-tree keyed by them dirtied a random
#    leaf page for every row: most of a durable pair's WAL pages (docs/performance.md, "The durable
#    path: request ids in the order they expire"). A retry finds its rows by both columns (the
#    request log knows when its id's window ends). A format-3 store is migrated (a taken row whose
#    request row is gone gets taken_until 0, so the next start removes it with the expired ones).
#    Stores of format 4 made before the change log's index by entry was dropped have it
#    (changes_by_entry): `open_store` drops it (`_DROPPED`). Not a new format: a server of the
#    same format reads and writes a store with or without it alike.
# 5: a take's request id is kept in its taken rows only (taken_by, taken_until, the space), not
#    in a `requests` row of its own as well: a durable pair writes a row less (docs/performance.md,
#    "The durable pair, fourth pass"). Start-up remembers the ids of both; the taken rows leave
#    at their own window's end. A format-4 store is migrated: a take's request row whose taken
#    rows are there is deleted (one whose rows are gone stays, and still answers its retry
#    with nothing, until its window ends). A format-4 server would not know the ids of a
#    format-5 store's takes, nor remove their rows before a restart.
FORMAT_VERSION = 5

# No index by entry: a change's row is written once per change and read only at start-up, whose
# one pass in order finds a removed write's payload (recovery.py); the index cost every change a
# second B-tree insert (docs/performance.md, "The durable pair, fourth pass").
_CHANGE_TABLES = """
CREATE TABLE IF NOT EXISTS change_logs (
    space INTEGER PRIMARY KEY, epoch INTEGER NOT NULL, oldest INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS changes (
    space INTEGER NOT NULL, seq INTEGER NOT NULL, kind TEXT NOT NULL, entry_id INTEGER NOT NULL,
    at REAL NOT NULL, txn INTEGER NOT NULL, visible_at REAL, payload BLOB,
    PRIMARY KEY (space, seq)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS change_subscriptions (
    space INTEGER NOT NULL, name TEXT NOT NULL, position INTEGER NOT NULL,
    PRIMARY KEY (space, name)
) WITHOUT ROWID;
"""

# Keyed by the window's end first: rows arrive in about that order, so a batch's rows go to the
# last leaf pages (format 4).
_REQUESTS = """
CREATE TABLE requests (
    id TEXT NOT NULL, space TEXT NOT NULL, kind TEXT NOT NULL, expires_at REAL NOT NULL,
    first_id INTEGER, count INTEGER NOT NULL, lease_expires_at REAL, granted REAL,
    PRIMARY KEY (expires_at, id)
) WITHOUT ROWID;
"""
_TAKER_INDEX = """
CREATE INDEX entries_by_taker ON entries (taken_until, taken_by) WHERE taken_by IS NOT NULL;
"""

# Indexes of earlier versions of this format, dropped when a store is opened.
_DROPPED = ("changes_by_entry",)

# The statements that bring a store of format n to n + 1, run in one transaction with the version.
_MIGRATIONS: dict[int, str] = {
    1: """
ALTER TABLE entries ADD COLUMN hidden_until REAL;
ALTER TABLE entries ADD COLUMN receipt INTEGER;
ALTER TABLE entries ADD COLUMN deliveries INTEGER NOT NULL DEFAULT 0;
ALTER TABLE entries ADD COLUMN dead_letter_reason TEXT;
""",
    2: _CHANGE_TABLES
    + """
ALTER TABLE entries ADD COLUMN max_deliveries INTEGER NOT NULL DEFAULT 0;
""",
    # The taken rows' window ends are read from the old table while its key is still the id.
    3: """
ALTER TABLE entries ADD COLUMN taken_until REAL;
UPDATE entries SET taken_until = coalesce(
    (SELECT q.expires_at FROM requests AS q WHERE q.id = entries.taken_by), 0
) WHERE taken_by IS NOT NULL;
DROP INDEX entries_by_taker;
"""
    + _REQUESTS.replace("CREATE TABLE requests", "CREATE TABLE requests_4")
    + """
INSERT INTO requests_4 (id, space, kind, expires_at, first_id, count, lease_expires_at, granted)
    SELECT id, space, kind, expires_at, first_id, count, lease_expires_at, granted FROM requests;
DROP TABLE requests;
ALTER TABLE requests_4 RENAME TO requests;
"""
    + _TAKER_INDEX,
    4: """
DELETE FROM requests WHERE kind = 'take' AND EXISTS (
    SELECT 1 FROM entries AS e
    WHERE e.taken_until = requests.expires_at AND e.taken_by = requests.id AND e.taken_by IS NOT NULL
);
""",
}

_SCHEMA = (
    """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID;
CREATE TABLE spaces (no INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE, next_id INTEGER NOT NULL);
CREATE TABLE types (
    space INTEGER NOT NULL, name TEXT NOT NULL, supertypes TEXT NOT NULL,
    PRIMARY KEY (space, name)
) WITHOUT ROWID;
CREATE TABLE entries (
    space INTEGER NOT NULL, id INTEGER NOT NULL, arrival INTEGER NOT NULL,
    expires_at REAL, payload BLOB NOT NULL, taken_by TEXT, taken_position INTEGER,
    hidden_until REAL, receipt INTEGER, deliveries INTEGER NOT NULL DEFAULT 0, dead_letter_reason TEXT,
    max_deliveries INTEGER NOT NULL DEFAULT 0, taken_until REAL,
    PRIMARY KEY (space, id)
);
CREATE TABLE registrations (
    space INTEGER NOT NULL, id INTEGER NOT NULL, expires_at REAL,
    templates BLOB NOT NULL, sequence INTEGER NOT NULL,
    PRIMARY KEY (space, id)
);
"""
    + _TAKER_INDEX
    + _REQUESTS
    + _CHANGE_TABLES
)


def database_path(data_dir: Path) -> Path:
    return Path(data_dir) / DB_NAME


def connect(path: Path) -> sqlite3.Connection:
    """A connection with outrig's settings: WAL, fsync at every commit, explicit transactions."""
    connection = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=10.0)
    connection.execute("PRAGMA journal_mode = WAL")
    # FULL: a commit returns only once the WAL is fsynced, so an acknowledged change survives a
    # power cut, not only a crash of the server.
    connection.execute("PRAGMA synchronous = FULL")
    connection.execute("PRAGMA foreign_keys = OFF")
    return connection


def check_format(connection: sqlite3.Connection, path: Path, *, older: bool = False) -> None:
    """Refuse a file that is not an outrig store of this format version (`older`: or of an older
    one this outrig migrates when it opens it, which `outrig check` and `outrig backup` read)."""
    application_id = connection.execute("PRAGMA application_id").fetchone()[0]
    version = connection.execute("PRAGMA user_version").fetchone()[0]
    if application_id != APPLICATION_ID:
        raise IncompatibleStoreError(f"{path} is not an outrig store (application_id {application_id:#x})")
    if older and version in _MIGRATIONS:
        return
    if version != FORMAT_VERSION:
        newer = "a newer" if version > FORMAT_VERSION else "an older"
        raise IncompatibleStoreError(
            f"{path} has store format {version}, written by {newer} outrig; this outrig reads format "
            f"{FORMAT_VERSION}. Use the matching outrig version, or start from an empty data dir."
        )


def open_store(data_dir: Path, software_version: str) -> sqlite3.Connection:
    """Open (creating if new) the store in `data_dir`, checking that this outrig can read it."""
    path = database_path(data_dir)
    try:
        connection = connect(path)
    except sqlite3.DatabaseError as err:
        raise IncompatibleStoreError(f"{path} is not an outrig store ({err})") from err
    try:
        tables = connection.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
        if tables == 0 and connection.execute("PRAGMA application_id").fetchone()[0] == 0:
            # One transaction: a crash during the first start leaves an empty file, not a store
            # without its marks (the header PRAGMAs are transactional).
            connection.executescript(
                "BEGIN IMMEDIATE;"
                + _SCHEMA
                + f"PRAGMA application_id = {APPLICATION_ID};"
                + f"PRAGMA user_version = {FORMAT_VERSION};"
                + "COMMIT;"
            )
            with transaction(connection):
                connection.executemany(
                    "INSERT INTO meta (key, value) VALUES (?, ?)",
                    [("created_by", f"outrig {software_version}"), ("created_at", f"{time.time():.3f}")],
                )
        check_format(connection, path, older=True)
        migrate(connection, software_version)
        _drop_old_indexes(connection)
    except sqlite3.DatabaseError as err:
        connection.close()
        raise IncompatibleStoreError(f"{path}: {err}") from err
    except BaseException:
        connection.close()
        raise
    return connection


def migrate(connection: sqlite3.Connection, software_version: str) -> None:
    """Bring a store of an older format to this one, a version at a time, each step in one
    transaction with its version number (a crash midway leaves the store at a version it had)."""
    while (version := connection.execute("PRAGMA user_version").fetchone()[0]) < FORMAT_VERSION:
        with transaction(connection):
            for statement in filter(str.strip, _MIGRATIONS[version].split(";")):
                connection.execute(statement)
            connection.execute(f"PRAGMA user_version = {version + 1:d}")
            connection.execute(
                "INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)",
                (f"migrated_to_{version + 1}", f"outrig {software_version} at {time.time():.3f}"),
            )


def _drop_old_indexes(connection: sqlite3.Connection) -> None:
    """Drop the indexes this format no longer has (`_DROPPED`), if the store has them."""
    names = ", ".join("?" * len(_DROPPED))
    for (name,) in connection.execute(
        f"SELECT name FROM sqlite_master WHERE type = 'index' AND name IN ({names})", _DROPPED
    ).fetchall():
        connection.execute(f"DROP INDEX {name}")


@contextlib.contextmanager
def transaction(connection: sqlite3.Connection):  # type: ignore[no-untyped-def]
    """BEGIN IMMEDIATE ... COMMIT, or ROLLBACK on any error."""
    if not connection.in_transaction:
        connection.execute("BEGIN IMMEDIATE")
    try:
        yield connection
    except BaseException:
        if connection.in_transaction:
            connection.execute("ROLLBACK")
        raise
    if connection.in_transaction:
        connection.execute("COMMIT")


class DataDirLock:
    """An exclusive lock on a data directory, so a second server cannot open the same store.

    flock is released by the kernel when the holder dies, so a SIGKILLed server never leaves a
    stale lock behind.
    """

    def __init__(self, data_dir: Path) -> None:
        self.path = Path(data_dir) / LOCK_NAME
        self._fd: int | None = None

    def acquire(self) -> None:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise StoreLockedError(
                f"data dir {self.path.parent} is in use by another outrig server (pid {holder}); "
                "one data dir serves one server at a time"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
