"""Shared fixtures: a real outrig server process, started once per session on port 0, and a
throwaway PostgreSQL (tests/postgres_server.py), started for the first test that needs it and
stopped when the session ends."""

from __future__ import annotations

import atexit
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import pytest
from hypothesis import settings

from .postgres_server import PostgresServer, find_bindir, running_postgres

_LISTENING = re.compile(r"outrig listening on (\S+)")

# The servers' stderr logs, one file each, in one directory removed when the test run ends (a
# failing test reads its server's log before then: ServerProcess.log).
_SERVER_LOGS = tempfile.mkdtemp(prefix="outrig-test-servers-")
atexit.register(shutil.rmtree, _SERVER_LOGS, ignore_errors=True)

# No per-example deadline in any property test: hypothesis' default (200 ms) is a timing assertion,
# which a loaded machine fails on an example that is merely slow (test_wire's 70 kB entries did).
# A test keeps its own `@settings`; only the deadline's default changes.
settings.register_profile("outrig", deadline=None)
settings.load_profile("outrig")


def missing_tool(what: str, install: str) -> NoReturn:
    """A test needs a program this machine lacks (`what`; Debian's package: `install`). On a
    machine of the README's test command it is skipped, saying so; in CI, which installs every
    such program (.ci/run sets OUTRIG_REQUIRE_TOOLS=1), it fails: a skip there would hide a missing
    install step."""
    message = f"{what} is missing: apt-get install {install} (.ci/run does)"
    if os.environ.get("OUTRIG_REQUIRE_TOOLS") == "1":
        pytest.fail(message)
    pytest.skip(message)


def free_port() -> int:
    """A loopback port nobody listens on now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class ServerProcess:
    """A running `outrig serve`, the address it listens on, and its metrics' (if it serves them)."""

    process: subprocess.Popen[str]
    address: str
    log: Path
    metrics: str | None = None

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15.0) -> int:
        if self.process.poll() is None:
            self.process.send_signal(sig)
        try:
            code = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            code = self.process.wait()
        if self.process.stdout is not None:
            self.process.stdout.close()
        return code


def start_server(
    *args: str,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    preexec_fn: Callable[[], None] | None = None,
    metrics: bool = False,
    allocator: str | None = "glibc",
) -> ServerProcess:
    """Start `outrig serve --listen 127.0.0.1:0 ARGS...` and wait for its listening line.
    `preexec_fn` runs in the child before outrig starts (to set resource limits). With `metrics`,
    it also serves Prometheus metrics on a free port, whose state tests can poll (tests/polling.py).

    `allocator` is its OUTRIG_ALLOCATOR (a flag in ARGS or the variable in `env` wins): glibc, the
    allocator it starts with, unless a test asks for another; None leaves `outrig serve`'s default
    (auto), which re-executes the process on tcmalloc where it is installed, 0.2-0.3 s of every
    start that a test not about the allocator need not pay. The session's `server` runs on the
    default, and tests/service/test_process.py checks each choice."""
    metrics_listen = f"127.0.0.1:{free_port()}" if metrics else None
    command = [sys.executable, "-m", "outrig.service", "serve", "--listen", "127.0.0.1:0", *args]
    if metrics_listen is not None:
        command += ["--metrics-listen", metrics_listen]
    environment = {k: v for k, v in os.environ.items() if not k.startswith("OUTRIG_")}
    if allocator is not None:
        environment["OUTRIG_ALLOCATOR"] = allocator
    environment.update(env or {})
    log = Path(tempfile.mkstemp(prefix="outrig-server-", suffix=".log", dir=_SERVER_LOGS)[1])
    with log.open("w") as stderr:
        process = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            env=environment,
            cwd=cwd,
            preexec_fn=preexec_fn,
        )
    assert process.stdout is not None
    line = process.stdout.readline()
    match = _LISTENING.search(line)
    if match is None:
        process.kill()
        process.wait()
        process.stdout.close()
        raise RuntimeError(f"outrig serve did not start: {line!r} {log.read_text()}")
    return ServerProcess(process, match.group(1), log, metrics_listen)


@pytest.fixture(scope="session")
def server() -> Iterator[ServerProcess]:
    # On `outrig serve`'s default allocator, as operators run it; tests poll its parked waiters
    # (tests/polling.py).
    running = start_server(metrics=True, allocator=None)
    yield running
    assert running.stop() == 0, "the server did not shut down cleanly on SIGTERM"


@pytest.fixture
def server_factory() -> Iterator[Callable[..., ServerProcess]]:
    """Start servers with their own flags or environment; all are stopped after the test."""
    started: list[ServerProcess] = []

    def factory(*args: str, env: dict[str, str] | None = None) -> ServerProcess:
        running = start_server(*args, env=env)
        started.append(running)
        return running

    yield factory
    for running in started:
        running.stop()


@pytest.fixture
def space_name() -> str:
    """A fresh space per test, so tests on the shared server never see each other's entries."""
    return f"t-{uuid.uuid4().hex[:12]}"


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    """A throwaway PostgreSQL, shared by the session's tests (tests/postgres, the conformance
    suite's postgresql backend); stopped, and its directory removed, when the session ends."""
    bindir = find_bindir()
    if bindir is None:  # pragma: no cover - the machine image has the server binaries
        pytest.fail("no PostgreSQL server binaries (initdb): install postgresql or set OUTRIG_PG_BINDIR")
    with running_postgres(bindir) as server:
        yield server
