"""`outrig serve --loop uvloop`: the server runs on uvloop's event loop (the `uvloop` extra), serves
the SDK's stream, and stops cleanly; asyncio's own loop stays the default."""

from __future__ import annotations

from pathlib import Path

import outrig
from tests.conftest import ServerProcess, start_server

from ..integration.entries import Task


def _serve_a_pair(running: ServerProcess) -> str:
    """A write and a take through the SDK; the server's memory map, read while it serves."""
    try:
        with outrig.connect(running.address, space="default") as space:
            space.write(Task(n=1), lease=60)
            assert space.take(Task(n=1), timeout=5) == Task(n=1)
        maps = Path(f"/proc/{running.process.pid}/maps").read_text()
        assert running.stop() == 0
    finally:
        running.log.unlink()
    return maps


def test_outrig_serve_runs_on_uvloop_when_asked() -> None:
    maps = _serve_a_pair(start_server("--in-memory", "--loop", "uvloop"))
    assert "/uvloop/loop." in maps  # uvloop's extension module: its loop serves


def test_asyncios_own_loop_is_the_default() -> None:
    maps = _serve_a_pair(start_server("--in-memory"))
    assert "/uvloop/" not in maps
