"""`outrig serve --workers N` for tests: the supervisor's process, its public address, and each
worker's own address and pid as it prints them (and prints them again when one restarts)."""

from __future__ import annotations

import os
import queue
import re
import threading
from dataclasses import dataclass, field

from outrig.service.workers import worker_of

from .conftest import ServerProcess, start_server
from .polling import wait_until

_WORKER = re.compile(r"outrig worker (\d+) listening on (\S+): pid (\d+)")
_RESTARTED = re.compile(r"outrig worker (\d+) restarted: pid (\d+)")


@dataclass
class Workers:
    """A running supervisor (`server`) and what its standard output said of its workers."""

    server: ServerProcess
    addresses: list[str]
    pids: list[int]
    lines: queue.Queue[str] = field(default_factory=queue.Queue)
    durable: bool = False  # a test's note: whether they keep their spaces in a data dir

    @property
    def public(self) -> str:
        return self.server.address

    def owner(self, space: str) -> int:
        return worker_of(space, len(self.addresses))

    def spaces_of(self, index: int, count: int = 1, prefix: str = "s") -> list[str]:
        """`count` space names worker `index` serves."""
        names = (f"{prefix}{n}" for n in range(10_000))
        found = [name for name in names if self.owner(name) == index]
        return found[:count]

    def wait_restarted(self, index: int, timeout: float = 20.0) -> int:
        """The pid of worker `index` once the supervisor says it restarted."""
        seen: list[str] = []

        def restarted() -> int | None:
            try:
                line = self.lines.get(timeout=0.05)
            except queue.Empty:
                return None
            seen.append(line)
            match = _RESTARTED.search(line)
            if match is not None and int(match.group(1)) == index:
                self.pids[index] = int(match.group(2))
                return self.pids[index]
            return None

        return wait_until(restarted, timeout, what=lambda: f"worker {index} restarted (saw {seen})")

    def stop(self) -> int:
        return self.server.stop()


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (the supervisor was killed before it reaped it) is no running worker
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rpartition(")")[2].split()[0] != "Z"
    except FileNotFoundError:
        return False


def start_workers(count: int, *args: str, env: dict[str, str] | None = None) -> Workers:
    """Start `outrig serve --listen 127.0.0.1:0 --workers COUNT ARGS...` and read its workers."""
    server = start_server("--workers", str(count), *args, env=env)
    stdout = server.process.stdout
    assert stdout is not None
    addresses, pids = [""] * count, [0] * count
    for _ in range(count):
        match = _WORKER.search(stdout.readline())
        assert match is not None, server.log.read_text()
        index = int(match.group(1))
        addresses[index], pids[index] = match.group(2), int(match.group(3))
    workers = Workers(server, addresses, pids)

    def read() -> None:
        try:
            for line in stdout:
                workers.lines.put(line)
        except (ValueError, OSError):  # the test stopped the server and closed its output
            return

    threading.Thread(target=read, name="workers-stdout", daemon=True).start()
    return workers
