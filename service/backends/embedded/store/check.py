"""`outrig check`: verify a store without changing it, while a server may be using it.

It does not take the data dir's lock and never writes to the store. It reads inside one read
transaction, which in WAL mode is a snapshot that never blocks the server's commits: the server
goes on writing to the WAL while the check sees the store as it was when it began.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from outrig.service.backends.embedded.store.schema import DB_NAME, check_format, database_path
from outrig.service.engine.changes import CHANGE_KINDS
from outrig.service.exceptions import IncompatibleStoreError, StoreError
from outrig.service.protocol import codec

# How many problems of each kind the check lists by name; it counts all of them.
_LISTED_PER_KIND = 5


@dataclass(frozen=True, slots=True)
class SpaceReport:
    """What the check counted in one space."""

    name: str
    entries: int
    expired: int  # entries whose lease has run out but that the server has not deleted yet
    registrations: int
    changes: int = 0  # changes its change log holds (format 3)


@dataclass(frozen=True, slots=True)
class CheckReport:
    """What `check_store` found: the store's shape, and its problems (none if `ok`)."""

    path: Path
    format_version: int
    file_bytes: int
    wal_bytes: int
    spaces: tuple[SpaceReport, ...]
    requests: int
    taken: int  # entries taken by a request id, kept until its window passes to answer a retry
    problem_count: int
    problems: tuple[str, ...]  # the first few of each kind, then how many more of it there are

    @property
    def ok(self) -> bool:
        return self.problem_count == 0

    @property
    def entries(self) -> int:
        return sum(space.entries for space in self.spaces)

    @property
    def verdict(self) -> str:
        return "check: ok" if self.ok else f"check: {self.problem_count} problem(s)"

    def lines(self) -> list[str]:
        wal = f" (+ {self.wal_bytes:,} bytes of WAL)" if self.wal_bytes else ""
        lines = [f"{self.path}: store format {self.format_version}, {self.file_bytes:,} bytes{wal}"]
        for space in self.spaces:
            lines.append(
                f"space {space.name!r}: {space.entries} entries ({space.expired} expired, not yet deleted), "
                f"{space.registrations} registrations"
            )
            if space.changes:
                lines.append(f"space {space.name!r}: {space.changes} changes logged")
        lines.append(f"request ids: {self.requests} ({self.taken} taken entries kept for their retries)")
        lines += [f"problem: {problem}" for problem in self.problems]
        lines.append(self.verdict)
        return lines

    def __str__(self) -> str:
        return "\n".join(self.lines())


# ---------------------------------------------------------------------- opening without changing


def store_path(data_dir: Path) -> Path:
    data_dir = Path(data_dir)
    if not data_dir.exists():
        raise StoreError(f"{data_dir}: no such data dir")
    if not data_dir.is_dir():
        raise StoreError(f"{data_dir} is not a directory; give the data dir that holds {DB_NAME}")
    path = database_path(data_dir)
    if not path.is_file():
        raise StoreError(f"{data_dir} holds no outrig store (no {DB_NAME})")
    return path


def open_unchanging(path: Path) -> sqlite3.Connection:
    """A connection that cannot change the store, whether or not a server is using it.

    With a server running, the -wal and -shm files exist and a read-only open reads the latest
    commits through them. Without them, a read-only open would create both and, being read-only,
    leave them behind; a read-write connection made query_only creates them and, as the last
    connection, removes them again when it closes.
    """
    modes = ("ro", "rw") if Path(f"{path}-shm").exists() else ("rw",)
    failure: sqlite3.OperationalError | None = None
    for mode in modes:
        connection: sqlite3.Connection | None = None
        try:
            # A URI, so that mode=rw never creates a missing file; as_uri() escapes '?' and '#'.
            uri = f"{path.absolute().as_uri()}?mode={mode}"
            connection = sqlite3.connect(uri, uri=True, isolation_level=None, timeout=10.0)
            connection.execute("PRAGMA query_only = ON")
            connection.execute("PRAGMA schema_version").fetchone()
        except sqlite3.OperationalError as err:  # cannot open, cannot map the -shm, locked ...
            if connection is not None:
                connection.close()
            failure = err
            continue
        except sqlite3.DatabaseError as err:
            if connection is not None:
                connection.close()
            raise IncompatibleStoreError(f"{path} is not an outrig store ({err})") from err
        return connection
    raise StoreError(f"cannot read {path}: {failure}") from failure


def verified_format(connection: sqlite3.Connection, path: Path) -> int:
    """The store's format version, once `check_format` has accepted it."""
    try:
        check_format(connection, path, older=True)  # a server migrates it when it opens it
        version: int = connection.execute("PRAGMA user_version").fetchone()[0]
    except sqlite3.OperationalError as err:
        raise StoreError(f"cannot read {path}: {err}") from err
    except sqlite3.DatabaseError as err:
        raise IncompatibleStoreError(f"{path} is not an outrig store ({err})") from err
    return version


# ---------------------------------------------------------------------- check


def check_store(data_dir: Path, *, now: float | None = None) -> CheckReport:
    """Verify the store in `data_dir` without changing it (see `_Checker` for what is verified).

    Raises StoreError (IncompatibleStoreError for another format or a file that is not a store)
    when there is no store to check; problems found in a store are in the report.
    """
    path = store_path(data_dir)
    connection = open_unchanging(path)
    try:
        connection.execute("BEGIN")  # one snapshot for every pass, while a server goes on writing
        version = verified_format(connection, path)
        checker = _Checker(connection, time.time() if now is None else now, version)
        checker.run()
        if connection.in_transaction:  # a corrupt page may have ended it already
            connection.execute("ROLLBACK")
    finally:
        connection.close()
    wal = Path(f"{path}-wal")
    return CheckReport(
        path=path,
        format_version=version,
        file_bytes=path.stat().st_size,
        wal_bytes=wal.stat().st_size if wal.exists() else 0,
        spaces=tuple(
            SpaceReport(tally.name, tally.entries, tally.expired, tally.registrations, tally.changes)
            for tally in sorted(checker.spaces.values(), key=lambda tally: tally.name)
        ),
        requests=checker.requests,
        taken=checker.taken,
        problem_count=checker.problems.count,
        problems=tuple(checker.problems.listed()),
    )


@dataclass(slots=True)
class _SpaceTally:
    name: str
    next_id: int
    entries: int = 0
    expired: int = 0
    registrations: int = 0
    changes: int = 0
    max_entry_id: int = 0
    max_registration_id: int = 0


@dataclass(slots=True)
class _Problems:
    """Counts every problem; keeps the first few of each kind to name them in the report."""

    count: int = 0
    _by_kind: dict[str, int] = field(default_factory=dict)
    _listed: list[str] = field(default_factory=list)

    def add(self, kind: str, message: str) -> None:
        self.count += 1
        seen = self._by_kind.get(kind, 0)
        self._by_kind[kind] = seen + 1
        if seen < _LISTED_PER_KIND:
            self._listed.append(message)

    def listed(self) -> Iterator[str]:
        yield from self._listed
        for kind, seen in self._by_kind.items():
            if seen > _LISTED_PER_KIND:
                yield f"... and {seen - _LISTED_PER_KIND} more {kind}"


def _why(err: Exception) -> str:
    text = str(err)
    return f"{type(err).__name__}: {text[:120]}{'...' if len(text) > 120 else ''}"


class _Checker:
    """One pass over each table, decoding rows as they stream by; it keeps only per-space counts.

    Verified: SQLite's own integrity_check; every entry payload and every registration's
    templates decode as the server would decode them at start-up; every row's space number is in
    `spaces`; each space's next_id is above every entry id and registration id in it (or a
    restarted server would hand out an id twice, a pending delivery's receipt included); every
    taken entry belongs to a request (before format 5; since, a taken row is its take's record,
    and has its window's end); every
    type's supertypes are a JSON list of names; (format 3) each space's change log runs gap-free
    from its oldest seq, under an epoch, of known kinds, and every logged write's payload can be
    found (its entry's row, or the later change that removed the entry).
    """

    def __init__(self, connection: sqlite3.Connection, now: float, version: int) -> None:
        self.execute = connection.execute
        self.now = now
        self.version = version
        self.spaces: dict[int, _SpaceTally] = {}
        self.requests = 0
        self.taken = 0
        self.problems = _Problems()

    def run(self) -> None:
        passes: list[tuple[str, Callable[[], None]]] = [
            ("integrity_check did not finish", self._integrity),
            ("table spaces could not be read to the end", self._scan_spaces),
            ("table types could not be read to the end", self._scan_types),
            ("table entries could not be read to the end", self._scan_entries),
            ("table registrations could not be read to the end", self._scan_registrations),
            ("table requests could not be read", self._scan_requests),
            ("taken entries could not be read to the end", self._scan_taken_entries),
            ("the change log could not be read to the end", self._scan_changes),
        ]
        for failure, scan in passes:
            try:
                scan()
            except sqlite3.DatabaseError as err:  # a corrupt page, a missing table ...
                self.problems.add("unreadable tables", f"{failure} ({err})")
        self._check_next_ids()

    def _space(self, number: int, what: str) -> _SpaceTally | None:
        tally = self.spaces.get(number)
        if tally is None:
            self.problems.add(
                "rows of unknown spaces", f"{what} belongs to space number {number}, not in spaces"
            )
        return tally

    def _integrity(self) -> None:
        for (message,) in self.execute("PRAGMA integrity_check"):
            if message != "ok":
                self.problems.add("integrity errors", f"integrity_check: {message}")

    def _scan_spaces(self) -> None:
        for number, name, next_id in self.execute("SELECT no, name, next_id FROM spaces"):
            self.spaces[number] = _SpaceTally(name, next_id)

    def _scan_types(self) -> None:
        for number, name, supertypes in self.execute("SELECT space, name, supertypes FROM types"):
            tally = self._space(number, f"type {name!r}")
            try:
                parents = json.loads(supertypes)
                valid = isinstance(parents, list) and all(isinstance(parent, str) for parent in parents)
            except (TypeError, ValueError):
                valid = False
            if not valid:
                where = f" in space {tally.name!r}" if tally is not None else ""
                self.problems.add(
                    "bad type rows",
                    f"type {name!r}{where}: supertypes {supertypes!r:.60} is not a list of names",
                )

    def _scan_entries(self) -> None:
        # A receipt is an id of its space too (format 2: a format-1 store has no receipts yet).
        columns = {row[1] for row in self.execute("PRAGMA table_info(entries)")}
        receipt = "receipt" if "receipt" in columns else "NULL"
        for number, entry_id, expires_at, payload, taken_by, pending in self.execute(
            f"SELECT space, id, expires_at, payload, taken_by, {receipt} FROM entries"
        ):
            tally = self._space(number, f"entry {entry_id}")
            if tally is None:
                continue
            if taken_by is not None:
                self.taken += 1  # taken, kept to answer its request's retry
            else:
                tally.entries += 1
                if expires_at is not None and expires_at <= self.now:
                    tally.expired += 1
            tally.max_entry_id = max(tally.max_entry_id, entry_id, pending or 0)
            try:
                codec.stored_entry(payload)
            # Whatever a bad payload makes the decoder raise, the check reports it and goes on.
            except Exception as err:
                self.problems.add(
                    "undecodable entries",
                    f"entry {entry_id} in space {tally.name!r}: payload does not decode ({_why(err)})",
                )

    def _scan_registrations(self) -> None:
        for number, registration_id, templates in self.execute(
            "SELECT space, id, templates FROM registrations"
        ):
            tally = self._space(number, f"registration {registration_id}")
            if tally is None:
                continue
            tally.registrations += 1
            tally.max_registration_id = max(tally.max_registration_id, registration_id)
            try:
                codec.stored_templates(templates)
            except Exception as err:  # as for entries
                self.problems.add(
                    "undecodable registrations",
                    f"registration {registration_id} in space {tally.name!r}: "
                    f"templates do not decode ({_why(err)})",
                )

    def _scan_requests(self) -> None:
        (self.requests,) = self.execute("SELECT count(*) FROM requests").fetchone()
        if self.version >= 5:  # a take's id is in its taken rows only
            (takes,) = self.execute(
                "SELECT count(*) FROM "
                "(SELECT DISTINCT taken_until, taken_by FROM entries WHERE taken_by IS NOT NULL)"
            ).fetchone()
            self.requests += takes

    def _scan_taken_entries(self) -> None:
        if self.version >= 5:  # a taken row is its take's record: it needs its window's end
            for number, entry_id, request_id in self.execute(
                "SELECT space, id, taken_by FROM entries WHERE taken_by IS NOT NULL AND taken_until IS NULL"
            ):
                self.problems.add(
                    "taken entries without their window's end",
                    f"entry {entry_id} of space number {number} was taken by request {request_id!r}, "
                    "with no taken_until (it would be kept for ever, its take forgotten at a restart)",
                )
            return
        for number, entry_id, request_id in self.execute(
            "SELECT e.space, e.id, e.taken_by FROM entries AS e LEFT JOIN requests AS q ON q.id = e.taken_by "
            "WHERE e.taken_by IS NOT NULL AND q.id IS NULL"
        ):
            self.problems.add(
                "taken entries without their request",
                f"entry {entry_id} of space number {number} was taken by request {request_id!r}, "
                "which has no requests row",
            )

    def _scan_changes(self) -> None:
        tables = {name for (name,) in self.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if "changes" not in tables:
            return  # format 1 or 2: no change log yet
        oldest = dict(self.execute("SELECT space, oldest FROM change_logs").fetchall())
        last: dict[int, int] = {}
        # Writes whose payload is neither in their change nor in their entry's row, by (space, id):
        # a later change of the entry must hold it (the one that removed it). Found in this one
        # pass, not by a subquery per write, which would walk the log from the write onwards
        # (nothing indexes the changes by entry: schema.py, format 4).
        unheld: dict[tuple[int, int], list[int]] = {}
        for number, seq, kind, entry_id, held, has_row in self.execute(
            "SELECT c.space, c.seq, c.kind, c.entry_id, c.payload IS NOT NULL, e.id IS NOT NULL "
            "FROM changes AS c LEFT JOIN entries AS e ON e.space = c.space AND e.id = c.entry_id "
            "ORDER BY c.space, c.seq"
        ):
            if held:
                unheld.pop((number, entry_id), None)
            elif kind == "write" and not has_row:
                unheld.setdefault((number, entry_id), []).append(seq)
            tally = self._space(number, f"change {seq}")
            if tally is None:
                continue
            tally.changes += 1
            expected = last.get(number, oldest.get(number, 1) - 1) + 1
            if number not in oldest and number not in last:
                self.problems.add(
                    "change logs without their epoch", f"space {tally.name!r}: changes but no change_logs row"
                )
            if seq != expected:
                self.problems.add(
                    "gaps in change logs", f"space {tally.name!r}: change {seq} where {expected} was due"
                )
            last[number] = seq
            if kind not in CHANGE_KINDS:
                self.problems.add(
                    "changes of unknown kinds", f"space {tally.name!r}: change {seq} is {kind!r}"
                )
        for number, seq in sorted((number, seq) for (number, _), seqs in unheld.items() for seq in seqs):
            tally = self.spaces.get(number)
            self.problems.add(
                "logged writes without their payload",
                f"space {tally.name if tally else number!r}: change {seq} is a write whose entry is gone "
                "and no later change holds it",
            )

    def _check_next_ids(self) -> None:
        for tally in self.spaces.values():
            for kind, highest in (("entry", tally.max_entry_id), ("registration", tally.max_registration_id)):
                if highest >= tally.next_id:
                    self.problems.add(
                        "spaces behind their ids",
                        f"space {tally.name!r}: next_id is {tally.next_id} but {kind} {highest} exists "
                        "(a restarted server could hand out an id twice)",
                    )
