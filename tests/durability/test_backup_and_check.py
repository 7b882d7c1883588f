"""`outrig backup` and `outrig check` on real stores: written by a real `outrig serve --data-dir`
through the SDK, copied while that server writes, checked, damaged on purpose and checked again.

The commands run as `python -m outrig.service ...` subprocesses, as a user runs them; a few tests
call `backup_store` / `check_store` directly where they need a hook or an injected clock.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

import outrig
from outrig.service.backends.embedded.store.backup import backup_store
from outrig.service.backends.embedded.store.check import check_store
from outrig.service.backends.embedded.store.schema import FORMAT_VERSION

from ..conftest import ServerProcess, start_server
from ..polling import wait_until

SPACE = "admin"
FOREVER_ENTRIES = 40
LEASED_ENTRIES = 5  # 60 s leases: "expired" once the check's clock is an hour on
_BACKUP_LINE = re.compile(r"^backup: copied [\d,]+ bytes \((\d+) entries\) from .+ in [\d.]+ s; check: ok$")


@dataclass
class Job(outrig.Entry, type_name="durability.admin.Job"):
    n: int | None = None
    note: str | None = None


def outrig_command(*args: object) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("OUTRIG_")}
    return subprocess.run(
        [sys.executable, "-m", "outrig.service", *map(str, args)],
        capture_output=True,
        text=True,
        env=environment,
        timeout=60,
        check=False,
    )


def fingerprint(directory: Path) -> dict[str, str]:
    """Every file in `directory` with a hash of its bytes."""
    return {path.name: hashlib.sha256(path.read_bytes()).hexdigest() for path in sorted(directory.iterdir())}


@pytest.fixture(scope="module")
def stopped_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data dir a server wrote and then left by a clean shutdown (tests copy it, not change it):
    40 entries without a lease, 5 with 60 s leases, 1 more, and one notify registration."""
    data_dir = tmp_path_factory.mktemp("stopped") / "data"
    server = start_server("--data-dir", str(data_dir))
    try:
        with outrig.connect(server.address, space=SPACE) as space:
            space.write_many(
                [Job(n=i, note="x" * 1000) for i in range(FOREVER_ENTRIES)], lease=outrig.FOREVER
            )
            space.write_many([Job(n=100 + i) for i in range(LEASED_ENTRIES)], lease=60.0)
            with space.notify(Job(n=-1), lease=600.0):
                # A write after the registration stores a next_id above the registration's id.
                space.write(Job(n=200), lease=outrig.FOREVER)
                assert server.stop() == 0  # with the registration attached, so that it is kept
    finally:
        server.stop()
    return data_dir


@pytest.fixture
def store_copy(stopped_store: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "copy"
    shutil.copytree(stopped_store, copy)
    return copy


@pytest.fixture
def durable_server(server_factory: Callable[..., ServerProcess], tmp_path: Path) -> ServerProcess:
    """A running server on tmp_path/data holding 50 acknowledged entries (note="before")."""
    server = server_factory("--data-dir", str(tmp_path / "data"))
    with outrig.connect(server.address, space=SPACE) as space:
        space.write_many([Job(n=i, note="before") for i in range(50)], lease=outrig.FOREVER)
    return server


class Writer(threading.Thread):
    """Writes one entry after another, each acknowledged (durable) before the next, until stopped."""

    def __init__(self, address: str) -> None:
        super().__init__(name="writer")
        self.address = address
        self.acknowledged = 0
        self.errors: list[BaseException] = []
        self.stopping = threading.Event()

    def run(self) -> None:
        try:
            with outrig.connect(self.address, space=SPACE, retry_deadline=5.0) as space:
                while not self.stopping.is_set():
                    space.write(Job(n=10_000 + self.acknowledged, note="during"), lease=outrig.FOREVER)
                    self.acknowledged += 1
        except BaseException as err:
            self.errors.append(err)

    def wait_for(self, count: int) -> None:
        wait_until(lambda: self.acknowledged >= count or self.errors, what=f"{count} acknowledged writes")
        assert self.acknowledged >= count, self.errors

    def finish(self) -> int:
        self.stopping.set()
        self.join(timeout=15)
        assert not self.errors, self.errors
        return self.acknowledged


# ---------------------------------------------------------------------- backup


def test_backup_while_the_server_writes_gives_a_store_a_server_starts_from(
    durable_server: ServerProcess, server_factory: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    writer = Writer(durable_server.address)
    writer.start()
    try:
        writer.wait_for(5)
        before = writer.acknowledged
        backed_up = outrig_command(
            "backup", tmp_path / "data", tmp_path / "backups" / "one"
        )  # DEST is created
        checked = outrig_command("check", tmp_path / "data")  # a running server's store, too
        writer.wait_for(before + 5)  # the server went on committing after the backup
    finally:
        written = writer.finish()
    assert backed_up.returncode == 0, backed_up.stderr
    match = _BACKUP_LINE.match(backed_up.stdout.strip())
    assert match is not None, backed_up.stdout
    copied = int(match.group(1))
    assert 50 + before <= copied <= 50 + written
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert checked.stdout.splitlines()[-1] == "check: ok"
    assert durable_server.process.poll() is None  # the backup took neither the lock nor the server down

    restored = server_factory("--data-dir", str(tmp_path / "backups" / "one"))
    with outrig.connect(restored.address, space=SPACE) as space:
        assert space.count(Job(note="before")) == 50
        assert space.count(Job()) == copied


def test_backup_steps_copy_one_snapshot_while_the_server_commits_between_them(
    durable_server: ServerProcess, tmp_path: Path
) -> None:
    # Without one read transaction across the steps SQLite restarts the copy after every commit
    # of the server, and this backup, one page per step with a commit after each, never ends.
    steps: list[int] = []
    with outrig.connect(durable_server.address, space=SPACE) as space:

        def commit_between_steps(copied: int, total: int) -> None:
            steps.append(copied)
            space.write(Job(n=-len(steps), note="during"), lease=outrig.FOREVER)  # acknowledged: on disk

        report = backup_store(tmp_path / "data", tmp_path / "copy", pages=1, progress=commit_between_steps)
        assert space.count(Job(note="during")) == len(steps)
    assert len(steps) > 5
    assert report.check.ok, report.check.problems
    assert report.check.entries == 50  # the store as it was when the backup began


def test_backup_of_a_stopped_store_changes_nothing_in_it(store_copy: Path, tmp_path: Path) -> None:
    before = fingerprint(store_copy)
    backed_up = outrig_command("backup", store_copy, tmp_path / "backup")
    assert backed_up.returncode == 0, backed_up.stderr
    assert fingerprint(store_copy) == before
    assert [path.name for path in (tmp_path / "backup").iterdir()] == ["outrig.db"]  # no partial file left


def test_backup_refuses_a_destination_that_holds_a_store(
    store_copy: Path, stopped_store: Path, tmp_path: Path
) -> None:
    destination = tmp_path / "taken"
    shutil.copytree(stopped_store, destination)
    before = fingerprint(destination)
    refused = outrig_command("backup", store_copy, destination)
    assert refused.returncode == 2
    assert "already holds an outrig store" in refused.stderr
    assert refused.stdout == ""
    assert fingerprint(destination) == before


# ---------------------------------------------------------------------- check


def test_check_reports_a_healthy_store_and_changes_nothing(store_copy: Path) -> None:
    before = fingerprint(store_copy)
    checked = outrig_command("check", store_copy)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    lines = checked.stdout.splitlines()
    assert lines[0].endswith(
        f"outrig.db: store format {FORMAT_VERSION}, {(store_copy / 'outrig.db').stat().st_size:,} bytes"
    )
    total = FOREVER_ENTRIES + LEASED_ENTRIES + 1
    assert f"space {SPACE!r}: {total} entries (0 expired, not yet deleted), 1 registrations" in lines
    assert lines[-1] == "check: ok"
    assert fingerprint(store_copy) == before  # and no -wal or -shm left behind


def test_check_counts_entries_whose_lease_ran_out(store_copy: Path) -> None:
    report = check_store(store_copy, now=time.time() + 3600)
    assert report.ok
    [space] = report.spaces
    assert (space.name, space.entries, space.expired, space.registrations) == (
        SPACE,
        FOREVER_ENTRIES + LEASED_ENTRIES + 1,
        LEASED_ENTRIES,
        1,
    )


def test_check_names_rows_that_a_server_could_not_load(store_copy: Path) -> None:
    with sqlite3.connect(store_copy / "outrig.db") as connection:
        connection.execute("UPDATE entries SET payload = x'ffffffff' WHERE id = 7")
        connection.execute("UPDATE registrations SET templates = x'1200'")  # a template with no type name
        connection.execute(  # no such space
            "INSERT INTO entries (space, id, arrival, expires_at, payload) VALUES (99, 3, 3, NULL, x'')"
        )
        connection.execute("UPDATE entries SET taken_by = 'gone', taken_position = 0 WHERE id = 8")
        connection.execute("UPDATE spaces SET next_id = 40")
    connection.close()
    checked = outrig_command("check", store_copy)
    assert checked.returncode == 1, checked.stdout + checked.stderr
    out = checked.stdout
    assert f"problem: entry 7 in space {SPACE!r}: payload does not decode" in out
    assert re.search(rf"problem: registration \d+ in space {SPACE!r}: templates do not decode", out)
    assert "problem: entry 3 belongs to space number 99, not in spaces" in out
    assert "problem: entry 8 of space number 1 was taken by request 'gone', with no taken_until" in out
    assert re.search(rf"problem: space {SPACE!r}: next_id is 40 but entry \d+ exists", out)
    assert re.search(rf"problem: space {SPACE!r}: next_id is 40 but registration \d+ exists", out)
    assert out.splitlines()[-1] == "check: 6 problem(s)"


def test_check_finds_a_damaged_page(store_copy: Path) -> None:
    path = store_copy / "outrig.db"
    with sqlite3.connect(path) as connection:
        (page_size,) = connection.execute("PRAGMA page_size").fetchone()
        (root,) = connection.execute("SELECT rootpage FROM sqlite_master WHERE name = 'entries'").fetchone()
    connection.close()
    with path.open("r+b") as file:  # the entries tree's root page: its header and cell pointers
        file.seek((root - 1) * page_size)
        file.write(b"\xa5" * 64)
    checked = outrig_command("check", store_copy)
    assert checked.returncode == 1, checked.stdout + checked.stderr
    assert re.search(r"problem: integrity_check(:| did not finish)", checked.stdout)
    assert (
        "problem: table entries could not be read to the end (database disk image is malformed)"
        in checked.stdout
    )
    assert re.fullmatch(r"check: \d+ problem\(s\)", checked.stdout.splitlines()[-1])


def _missing(tmp_path: Path) -> Path:
    return tmp_path / "nowhere"


def _a_file(tmp_path: Path) -> Path:
    (tmp_path / "file").write_text("not a directory")
    return tmp_path / "file"


def _no_store(tmp_path: Path) -> Path:
    return tmp_path


def _not_sqlite(tmp_path: Path) -> Path:
    (tmp_path / "outrig.db").write_bytes(b"these are not the pages you are looking for\n" * 200)
    return tmp_path


def _someone_elses_sqlite(tmp_path: Path) -> Path:
    with sqlite3.connect(tmp_path / "outrig.db") as connection:
        connection.execute("CREATE TABLE notes (text TEXT)")
    connection.close()
    return tmp_path


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (_missing, "no such data dir"),
        (_a_file, "is not a directory"),
        (_no_store, "holds no outrig store"),
        (_not_sqlite, "is not an outrig store"),
        (_someone_elses_sqlite, "is not an outrig store (application_id 0x0)"),
    ],
)
def test_check_and_backup_refuse_what_is_not_a_store(
    make: Callable[[Path], Path], message: str, tmp_path: Path
) -> None:
    data_dir = make(tmp_path)
    before = fingerprint(tmp_path)
    checked = outrig_command("check", data_dir)
    assert checked.returncode == 2
    assert message in checked.stderr
    assert checked.stdout == ""
    backed_up = outrig_command("backup", data_dir, tmp_path / "backup")
    assert backed_up.returncode == 2
    assert message in backed_up.stderr
    assert fingerprint(tmp_path) == before  # nothing touched, no backup dir made


def test_check_and_backup_refuse_a_store_of_a_newer_format(store_copy: Path, tmp_path: Path) -> None:
    with sqlite3.connect(store_copy / "outrig.db") as connection:
        connection.execute(f"PRAGMA user_version = {FORMAT_VERSION + 1}")
    connection.close()
    checked = outrig_command("check", store_copy)
    assert checked.returncode == 2
    assert f"has store format {FORMAT_VERSION + 1}, written by a newer outrig" in checked.stderr
    assert f"this outrig reads format {FORMAT_VERSION}" in checked.stderr
    backed_up = outrig_command("backup", store_copy, tmp_path / "backup")
    assert backed_up.returncode == 2
    assert f"has store format {FORMAT_VERSION + 1}" in backed_up.stderr
    assert not (tmp_path / "backup" / "outrig.db").exists()
