"""`outrig backup`: a consistent copy of a store, while a server may be using it.

It does not take the data dir's lock and never writes to the store. It copies one read
transaction's snapshot (in WAL mode that never blocks the server's commits) through SQLite's
backup API, a step of `pages` pages at a time. The steps share the one read transaction on
purpose: between steps without it, SQLite restarts a backup from the first page whenever another
process (the server) has committed, so against a busy server a large store would never finish
copying. The copy is then checked as `outrig check` would.
"""

from __future__ import annotations

import os
import sqlite3
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from outrig.service.backends.embedded.store.check import (
    CheckReport,
    check_store,
    open_unchanging,
    store_path,
    verified_format,
)
from outrig.service.backends.embedded.store.schema import DB_NAME, database_path
from outrig.service.exceptions import StoreError

# Pages copied per backup step (4 MiB with SQLite's default 4 KiB pages).
BACKUP_STEP_PAGES = 1024
_SIDE_FILES = ("-journal", "-wal", "-shm")


@dataclass(frozen=True, slots=True)
class BackupReport:
    """What `backup_store` copied, and what the check of the copy found."""

    source: Path
    destination: Path
    copied_bytes: int
    seconds: float
    check: CheckReport

    def __str__(self) -> str:
        summary = (
            f"backup: copied {self.copied_bytes:,} bytes ({self.check.entries} entries) from {self.source} "
            f"to {self.destination} in {self.seconds:.2f} s"
        )
        if self.check.ok:
            return f"{summary}; {self.check.verdict}"
        return "\n".join(
            [summary, *(f"problem: {problem}" for problem in self.check.problems), self.check.verdict]
        )


def backup_store(
    data_dir: Path,
    destination: Path,
    *,
    pages: int = BACKUP_STEP_PAGES,
    progress: Callable[[int, int], object] | None = None,
) -> BackupReport:
    """Copy the store in `data_dir` to `destination`/outrig.db, then check the copy.

    Safe while a server uses `data_dir` (see the module docstring). `destination` is created if
    missing and must not already hold a store. The copy is written under a temporary name and
    appears as outrig.db only once complete, so an interrupted backup leaves no half store.
    `progress(copied, total)` is called with page counts after each step of `pages` pages.
    """
    destination = Path(destination)
    target = database_path(destination)
    for suffix in ("", *_SIDE_FILES):
        if Path(f"{target}{suffix}").exists():
            raise StoreError(
                f"{destination} already holds an outrig store ({DB_NAME}{suffix}); back up to a new directory"
            )
    path = store_path(data_dir)
    started = time.perf_counter()
    source = open_unchanging(path)
    try:
        source.execute("BEGIN")  # the snapshot every step copies from
        verified_format(source, path)
        try:
            destination.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise StoreError(f"cannot create {destination}: {err}") from err
        _copy(source, path, target, pages, progress)
    finally:
        source.close()
    seconds = time.perf_counter() - started
    return BackupReport(path, target, target.stat().st_size, seconds, check_store(destination))


def _copy(
    source: sqlite3.Connection,
    path: Path,
    target: Path,
    pages: int,
    progress: Callable[[int, int], object] | None,
) -> None:
    """Copy into a temporary file beside `target`, then link it to `target` (never over a file)."""
    try:
        fd, name = tempfile.mkstemp(dir=target.parent, prefix=f".{DB_NAME}.", suffix=".partial")
    except OSError as err:
        raise StoreError(f"cannot write in {target.parent}: {err}") from err
    os.close(fd)
    partial = Path(name)
    try:
        os.chmod(partial, path.stat().st_mode & 0o777)
        copy = sqlite3.connect(partial, isolation_level=None)
        try:
            copy.execute("PRAGMA synchronous = FULL")  # the copy is on disk when backup() returns
            source.backup(copy, pages=pages, progress=_pages_copied(progress))
        finally:
            copy.close()
        _publish(partial, target)
    except FileExistsError:
        raise StoreError(
            f"{target.parent} already holds an outrig store ({DB_NAME}); nothing was copied"
        ) from None
    except (OSError, sqlite3.Error) as err:
        raise StoreError(f"backup of {path} to {target} failed: {err}") from err
    finally:
        for suffix in ("", *_SIDE_FILES):
            Path(f"{partial}{suffix}").unlink(missing_ok=True)
    directory = os.open(target.parent, os.O_RDONLY)
    try:
        os.fsync(directory)  # the new name survives a power cut too
    finally:
        os.close(directory)


def _publish(partial: Path, target: Path) -> None:
    """Give the finished copy its name; never replace a store that appeared there meanwhile."""
    try:
        os.link(partial, target)  # fails if target exists, atomically
    except FileExistsError:
        raise
    except OSError:  # a file system without hard links: check, then rename
        if target.exists():
            raise FileExistsError(target) from None
        os.rename(partial, target)


def _pages_copied(
    progress: Callable[[int, int], object] | None,
) -> Callable[[int, int, int], object] | None:
    """sqlite3's progress(status, remaining, total) as progress(copied, total)."""
    if progress is None:
        return None
    return lambda status, remaining, total: progress(total - remaining, total)
