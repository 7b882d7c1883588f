"""A real, throwaway PostgreSQL for the tests, from the server binaries on the machine.

`initdb` refuses to run as root, so when the tests run as root (as CI does) the cluster is made and
run as the `postgres` user, in a directory that user owns. The server listens on a free loopback
port and on a Unix socket in its own directory, with trust authentication for one superuser,
`outrig`, and stops (and its directory goes) when the context ends: for the tests, when the session
ends (the `postgres` fixture of tests/conftest.py).
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

__all__ = ["PostgresServer", "find_bindir", "running_postgres"]


def find_bindir() -> Path | None:
    """The directory of initdb and postgres: $OUTRIG_PG_BINDIR, pg_config's, or Debian's newest."""
    if given := os.environ.get("OUTRIG_PG_BINDIR"):
        return Path(given)
    if pg_config := shutil.which("pg_config"):
        found = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True, check=False)
        candidate = Path(found.stdout.strip())
        if (candidate / "initdb").exists():
            return candidate
    versions = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4]))
    return Path(versions[-1]).parent if versions else None


@dataclass(frozen=True)
class PostgresServer:
    port: int
    socket_dir: Path
    version: str

    def dsn(self, database: str = "outrig") -> str:
        return f"postgresql://outrig@127.0.0.1:{self.port}/{database}"

    def new_database(self, prefix: str) -> str:
        """The name of a fresh, empty database, `prefix` and a random suffix (so that no test sees
        another's spaces); `dsn(name)` reaches it."""
        import psycopg

        name = f"{prefix}_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(self.dsn(), autocommit=True) as admin:
            admin.execute(f"CREATE DATABASE {name}")
        return name


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _as_postgres(command: list[str]) -> list[str]:
    """Run as the postgres user when we are root (initdb and postgres refuse root)."""
    if os.geteuid() != 0:
        return command
    return ["runuser", "-u", "postgres", "--", *command]


#: A cluster without fsync lives in memory (`_SHARED_MEMORY`, a tmpfs) when this much of it is free.
MEMORY_NEEDED = 8 * 2**30
_SHARED_MEMORY = Path("/dev/shm")


def _scratch(fsync: bool) -> Path | None:
    """Where a cluster's directory goes: in memory for the tests (no fsync), which make a database
    per test (7.5 MB each, copied from template1): on disk the session's 300-odd of them took
    57 s to stop and remove, the page cache writing back what nobody would read; None: the
    system's temporary directory."""
    if fsync or not _SHARED_MEMORY.is_dir() or not os.access(_SHARED_MEMORY, os.W_OK):
        return None
    free = os.statvfs(_SHARED_MEMORY)
    return _SHARED_MEMORY if free.f_bavail * free.f_frsize >= MEMORY_NEEDED else None


@contextlib.contextmanager
def running_postgres(bindir: Path, *, fsync: bool = False) -> Iterator[PostgresServer]:
    """Make a cluster in a temporary directory, start it, create database `outrig`, stop it after.
    Tests run it without fsync (nothing survives it anyway), in memory where there is room
    (`_scratch`); a benchmark asks for `fsync`, on disk."""
    root = Path(tempfile.mkdtemp(prefix="outrig-pg-", dir=_scratch(fsync)))
    data, sockets = root / "data", root / "sockets"
    sockets.mkdir()
    if os.geteuid() == 0:
        postgres = pwd.getpwnam("postgres")
        for path in (root, sockets):
            os.chown(path, postgres.pw_uid, postgres.pw_gid)
    port = _free_port()
    subprocess.run(
        _as_postgres(
            [
                str(bindir / "initdb"),
                "-D",
                str(data),
                "-U",
                "outrig",
                "-A",
                "trust",
                "-E",
                "UTF8",
                "--no-sync",
            ]
        ),
        check=True,
        capture_output=True,
    )
    log = (root / "postgres.log").open("w")  # the child writes through it, whoever owns the file
    server = subprocess.Popen(
        _as_postgres(
            [
                str(bindir / "postgres"), "-D", str(data), "-p", str(port), "-k", str(sockets),
                "-c", "listen_addresses=127.0.0.1", "-c", "max_connections=200",
                *([] if fsync else ["-c", "fsync=off", "-c", "synchronous_commit=off"]),
                *([] if fsync else ["-c", "full_page_writes=off"]),
            ]
        ),
        stdout=subprocess.DEVNULL,
        stderr=log,
        text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while True:
            ready = subprocess.run(
                [str(bindir / "pg_isready"), "-h", "127.0.0.1", "-p", str(port), "-U", "outrig"],
                capture_output=True,
                check=False,
            )
            if ready.returncode == 0:
                break
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"PostgreSQL did not start (status {server.poll()})")
            time.sleep(0.1)
        subprocess.run(
            [str(bindir / "createdb"), "-h", "127.0.0.1", "-p", str(port), "-U", "outrig", "outrig"],
            check=True,
            capture_output=True,
        )
        version = subprocess.run(
            [str(bindir / "postgres"), "--version"], capture_output=True, text=True, check=True
        ).stdout.strip()
        yield PostgresServer(port, sockets, version)
    finally:
        _stop(bindir, data, server)
        log.close()
        shutil.rmtree(root, ignore_errors=True)


def _stop(bindir: Path, data: Path, server: subprocess.Popen[str]) -> None:
    """A fast shutdown through pg_ctl (clients disconnected, the postmaster waits for its children),
    then the signals if that did not work. As root the child is `runuser`, which answers a SIGTERM
    by killing postgres about 2 s later (seen here: 2 s per stop, the postmaster's children left
    to init as zombies); pg_ctl stops it in about 0.15 s."""
    if server.poll() is None:
        subprocess.run(
            _as_postgres([str(bindir / "pg_ctl"), "stop", "-D", str(data), "-m", "fast", "-w", "-t", "30"]),
            capture_output=True,
            check=False,
        )
    try:
        server.wait(30)
    except subprocess.TimeoutExpired:
        server.terminate()
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
