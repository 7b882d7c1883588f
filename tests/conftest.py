"""Shared fixtures: a real outrig server process, started once per session on port 0."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

_LISTENING = re.compile(r"outrig listening on (\S+)")


@dataclass
class ServerProcess:
    """A running `outrig serve` and the address it listens on."""

    process: subprocess.Popen[str]
    address: str
    log: Path

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
) -> ServerProcess:
    """Start `outrig serve --listen 127.0.0.1:0 ARGS...` and wait for its listening line.
    `preexec_fn` runs in the child before outrig starts (to set resource limits)."""
    command = [sys.executable, "-m", "outrig.service", "serve", "--listen", "127.0.0.1:0", *args]
    environment = {k: v for k, v in os.environ.items() if not k.startswith("OUTRIG_")}
    environment.update(env or {})
    log = Path(tempfile.mkstemp(prefix="outrig-server-", suffix=".log")[1])
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
    return ServerProcess(process, match.group(1), log)


@pytest.fixture(scope="session")
def server() -> Iterator[ServerProcess]:
    running = start_server()
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
