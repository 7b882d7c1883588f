"""A store that cannot be written: the server says UNAVAILABLE, keeps serving reads, acknowledges
nothing it could not persist, and the store stays sound.

"Full disk" here is real: the server process runs under RLIMIT_FSIZE, so the kernel refuses to
grow its files (EFBIG) exactly as a full file system refuses with ENOSPC, and SQLite sees the
failed write. Python ignores SIGXFSZ, so the process lives on.
"""

from __future__ import annotations

import resource
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import outrig

from ..conftest import start_server
from ..integration.entries import Task

FILE_LIMIT = 3 * 1024 * 1024
BLOB = "x" * 20_000  # ~20 KB per entry: the limit is reached after about 150 writes


def limit_file_size() -> None:
    # Soft limit only: the test lifts it later with prlimit, as freeing disk space would.
    resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_LIMIT, resource.RLIM_INFINITY))


def test_a_full_disk_answers_unavailable_and_loses_nothing_acknowledged(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    server = start_server("--data-dir", str(data_dir), preexec_fn=limit_file_size)
    acknowledged: list[int] = []
    try:
        with outrig.connect(server.address, space="s", retry_deadline=0) as space:
            space.write(Task(job="keep", n=-1))
            failure = None
            for n in range(2000):
                try:
                    space.write(Task(job=BLOB, n=n))
                except outrig.UnavailableError as err:
                    failure = err
                    break
                acknowledged.append(n)
            assert failure is not None, (
                f"{len(acknowledged)} writes of 20 KB fit under a {FILE_LIMIT}-byte limit"
            )
            assert "cannot persist" in str(failure)
            # Reads go on; changes are refused while the store is not writable.
            assert space.read(Task(job="keep"), timeout=0) == Task(job="keep", n=-1)
            assert space.count(Task()) == len(acknowledged) + 1
            with pytest.raises(outrig.UnavailableError, match="cannot persist"):
                space.take(Task(job="keep"), timeout=0)
            with pytest.raises(outrig.UnavailableError, match="cannot persist"):
                space.write(Task(job="small", n=0))

            # Space comes back: the server's probe notices and changes are accepted again.
            resource.prlimit(server.process.pid, resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY,) * 2)
            deadline = time.monotonic() + 10
            while True:
                try:
                    space.write(Task(job="after", n=10_000))
                    break
                except outrig.UnavailableError:
                    assert time.monotonic() < deadline, (
                        "changes were still refused 10 s after space came back"
                    )
                    time.sleep(0.2)
            acknowledged.append(10_000)
            assert space.take(Task(job="keep"), timeout=0) == Task(job="keep", n=-1)
    finally:
        server.stop(signal.SIGKILL)
    # The store is sound and holds exactly what was acknowledged.
    check = subprocess.run(
        [sys.executable, "-m", "outrig.service", "check", str(data_dir)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert check.returncode == 0, check.stdout + check.stderr
    restarted = start_server("--data-dir", str(data_dir))
    try:
        with outrig.connect(restarted.address, space="s", retry_deadline=0) as space:
            found: list[Any] = list(space.contents(Task()))  # Any: each n is set, not None
            assert sorted(entry.n for entry in found) == acknowledged
    finally:
        restarted.stop()


def test_a_commit_the_store_refuses_is_undone_and_the_transaction_has_aborted(tmp_path: Path) -> None:
    server = start_server("--data-dir", str(tmp_path / "data"), preexec_fn=limit_file_size)
    try:
        with outrig.connect(server.address, space="s", retry_deadline=0) as space:
            space.write(Task(job="keep", n=-1))
            txn = space.transaction()
            assert txn.take(Task(job="keep"), timeout=0) is not None
            txn.write_many([Task(job=BLOB, n=n) for n in range(200)])  # 4 MB: more than the disk holds
            with pytest.raises(outrig.UnavailableError, match="cannot persist"):
                txn.commit()
            # Undone in memory as in the store: no write shows, the take is back.
            assert space.count(Task(job=BLOB)) == 0
            assert space.read(Task(job="keep"), timeout=0) == Task(job="keep", n=-1)
            with pytest.raises(outrig.FailedPreconditionError, match="aborted"):
                txn.commit()  # a retry learns that it did not commit
    finally:
        server.stop(signal.SIGKILL)
