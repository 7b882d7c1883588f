"""`outrig serve --workers N`: N worker processes serving one machine's spaces, and their supervisor.

A Python process serves on one core (the event loop, the engine and the journal share one GIL);
the supervisor runs N of them. It is process management only: it imports neither gRPC nor a
backend, serves no call, and each worker is `outrig serve` itself, started again with its role
(service/workers.py) in its environment.

**Addresses.** Every worker listens on the public `listen` address, shared through SO_REUSEPORT
(the kernel spreads new connections over the workers), so any worker's port accepts any call, and
on an address of its own: the listen port + 1 + i for worker i, or, with port 0, a free port each.
The supervisor binds all of them first (with SO_REUSEPORT, never listening): port 0 becomes a
port number the workers can be told, a worker restarted gets its ports back, and no other program
takes them meanwhile. A worker's own address is what Locate answers and the other workers forward
to. Metrics: worker i serves them on the metrics port + i; the console is worker 0's.

A port given (not 0) must be free: it is first bound without SO_REUSEPORT, as gRPC checks its own
(the kernel would otherwise let a second supervisor, or a stale worker, share it silently).

**Restarts.** A worker that ends without being asked to (a crash, SIGKILL) is started again after
a backoff that doubles from RESTART_BACKOFF up to RESTART_BACKOFF_MAX and starts over once a
worker has run RESTART_RESET seconds; each restart is logged. A worker that ends before it ever
served (a bad configuration, a port in use) stops them all: the supervisor exits with its status.

**Signals.** SIGTERM and SIGINT stop the workers gracefully (SIGTERM each: its grace period,
then SIGKILL after STOP_MARGIN more), then the supervisor; SIGHUP is passed on to every worker
(each reloads its policy). If the supervisor itself is killed, the kernel sends each worker
SIGTERM (PR_SET_PDEATHSIG, service/process.py): no worker outlives it.

**The data dir** (embedded, with a data dir): worker i keeps its spaces in DATA_DIR/workers/i,
recovered when it restarts; DATA_DIR/workers.json records N, and another N, or a single
process's data dir, is refused (workers.check_layout). Without a data dir each worker holds its
spaces in memory, and a restarted worker starts empty.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import secrets
import signal
import socket
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from outrig.service.config import ServerConfig
from outrig.service.exceptions import ConfigError
from outrig.service.workers import WorkerRole, check_layout, record_workers, worker_data_dir

if TYPE_CHECKING:
    from outrig.service.backends.embedded.store.schema import DataDirLock

log = logging.getLogger("outrig.service")

#: Seconds before the first restart of a worker that ended; doubled at each restart in a row.
RESTART_BACKOFF = 0.1
RESTART_BACKOFF_MAX = 10.0
#: A worker that has served this long before it ended is restarted after RESTART_BACKOFF again.
RESTART_RESET = 30.0
#: Seconds past the grace period that a worker may take to stop before it is killed.
STOP_MARGIN = 5.0
#: The most workers one supervisor runs.
MAX_WORKERS = 256

_WILDCARDS = ("", "0.0.0.0", "::", "[::]")


def _split(address: str, setting: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ConfigError(f"{setting}: expected HOST:PORT, got {address!r}")
    return host, int(port)


def _reserve(host: str, port: int, setting: str) -> socket.socket:
    """A socket bound to (host, port) with SO_REUSEPORT, not listening: it keeps the port for the
    workers, which bind it too, and receives no connection itself."""
    try:
        family, kind, proto, _, where = socket.getaddrinfo(
            host.strip("[]") or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        reserved = socket.socket(family, kind, proto)
    except OSError as err:
        raise ConfigError(f"{setting}: cannot bind {host}:{port}: {err}") from None
    try:
        if port:  # free, not only shareable: nothing listens there, ours or not
            with socket.socket(family, kind, proto) as probe:
                # SO_REUSEADDR: connections of an earlier server left in TIME_WAIT do not count.
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                probe.bind(where)
        reserved.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        reserved.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        reserved.bind(where)
    except OSError as err:
        reserved.close()
        raise ConfigError(f"{setting}: cannot bind {host}:{port}: {err}") from None
    return reserved


def _port_plus(address: str, offset: int, setting: str) -> str:
    host, port = _split(address, setting)
    if port + offset > 65535:
        raise ConfigError(f"{setting}: the port of worker {offset} would be {port + offset}, beyond 65535")
    return f"{host}:{port + offset if port else 0}"


def restart_delay(backoff: float, ran: float) -> tuple[float, float]:
    """(seconds to wait before restarting a worker that ended after `ran` seconds of service,
    the backoff for its next restart), given its current `backoff`."""
    delay = RESTART_BACKOFF if ran >= RESTART_RESET else backoff
    return delay, min(RESTART_BACKOFF_MAX, delay * 2)


def worker_config(config: ServerConfig, role: WorkerRole) -> ServerConfig:
    """A worker's configuration: its supervisor's, with the worker's addresses and data dir."""
    return dataclasses.replace(
        config,
        worker=role,
        listen=role.public,
        data_dir=role.data_dir,
        metrics_listen=role.metrics_listen,
        console=role.console,
    )


@dataclasses.dataclass
class _Worker:
    """One worker process of the supervisor, and what it knows of it."""

    role: WorkerRole
    process: asyncio.subprocess.Process | None = None
    ready: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    started_at: float = 0.0  # monotonic
    restarts: int = 0
    backoff: float = RESTART_BACKOFF
    relay: asyncio.Task[None] | None = None


class Supervisor:
    """Starts `count` workers of `config` (an `outrig serve` command line: `argv`), restarts those
    that end, and stops them all on SIGTERM or SIGINT (`run`)."""

    def __init__(self, config: ServerConfig, argv: Sequence[str], count: int) -> None:
        if not 1 < count <= MAX_WORKERS:
            raise ConfigError(
                f"server.workers: {count} workers (expected 2 to {MAX_WORKERS}, or 1: no supervisor)"
            )
        self.config = config
        self.count = count
        self._command = [sys.executable, "-m", "outrig.service", *argv]
        self._reserved: list[socket.socket] = []
        self._lock: DataDirLock | None = None
        self._workers: list[_Worker] = []
        self._stopping = asyncio.Event()
        self.public = ""

    # ------------------------------------------------------------------ setting up

    def _data_dirs(self) -> list[Path | None]:
        config = self.config
        if config.backend != "embedded" or config.data_dir is None or config.in_memory:
            return [None] * self.count
        from outrig.service.backends.embedded.store.schema import DataDirLock

        data_dir = config.data_dir
        data_dir.mkdir(parents=True, exist_ok=True)
        lock = DataDirLock(data_dir)  # one supervisor, or one lone server, per data dir
        lock.acquire()
        self._lock = lock
        check_layout(data_dir, self.count)
        record_workers(data_dir, self.count)
        return [worker_data_dir(data_dir, i) for i in range(self.count)]

    def _addresses(self) -> tuple[str, list[str]]:
        """The public address and each worker's own, all bound (`_reserve`)."""
        host, port = _split(self.config.listen, "listen")
        public = self._keep(host, port, "listen")
        own = [
            self._keep(host, port + 1 + i if port else 0, f"listen (worker {i}'s own port)")
            for i in range(self.count)
        ]
        return f"{host}:{public}", [f"{host}:{p}" for p in own]

    def _keep(self, host: str, port: int, setting: str) -> int:
        if port > 65535:
            raise ConfigError(f"{setting}: port {port} is beyond 65535 (choose a lower listen port)")
        reserved = _reserve(host, port, setting)
        self._reserved.append(reserved)
        return int(reserved.getsockname()[1])

    def _roles(self) -> list[WorkerRole]:
        data_dirs = self._data_dirs()
        self.public, addresses = self._addresses()
        secret = secrets.token_urlsafe(32)
        config = self.config
        return [
            WorkerRole(
                index=i,
                count=self.count,
                public=self.public,
                addresses=tuple(addresses),
                secret=secret,
                supervisor=os.getpid(),
                data_dir=data_dirs[i],
                metrics_listen=_port_plus(config.metrics_listen, i, "metrics_listen")
                if config.metrics_listen
                else "",
                console=config.console if i == 0 else "",
            )
            for i in range(self.count)
        ]

    # ------------------------------------------------------------------ the workers

    async def _start(self, worker: _Worker) -> None:
        worker.ready = asyncio.Event()
        environment = dict(os.environ, **worker.role.to_environ())
        worker.process = await asyncio.create_subprocess_exec(
            *self._command, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, env=environment
        )
        worker.started_at = time.monotonic()
        worker.relay = asyncio.create_task(
            self._relay(worker, worker.process), name=f"outrig-{worker.role.name}-stdout"
        )

    async def _relay(self, worker: _Worker, process: asyncio.subprocess.Process) -> None:
        """Read a worker's standard output: its listening line says it serves; anything else is
        passed on."""
        assert process.stdout is not None
        ready = f"outrig worker {worker.role.index} listening on "
        async for line in process.stdout:
            text = line.decode(errors="replace")
            if text.startswith(ready):
                worker.ready.set()
            else:
                sys.stdout.write(text)
                sys.stdout.flush()

    async def _until_ready(self, worker: _Worker) -> int | None:
        """Wait until `worker` serves (None), the supervisor stops (None) or the worker ends
        first (its exit status)."""
        assert worker.process is not None
        ended = asyncio.ensure_future(worker.process.wait())
        waits = (
            ended,
            asyncio.ensure_future(worker.ready.wait()),
            asyncio.ensure_future(self._stopping.wait()),
        )
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()
        if worker.ready.is_set() or not ended.done() or ended.cancelled():
            return None
        return ended.result()

    async def _watch(self, worker: _Worker) -> None:
        """Restart `worker` each time it ends, until the supervisor stops."""
        while not self._stopping.is_set():
            assert worker.process is not None
            status = await worker.process.wait()
            if self._stopping.is_set():
                return
            ran = time.monotonic() - worker.started_at
            delay, worker.backoff = restart_delay(worker.backoff, ran)
            log.warning(
                "%s (pid %d) ended %s after %.1f s; restarting it in %.1f s",
                worker.role.name,
                worker.process.pid,
                f"by signal {signal.Signals(-status).name}" if status < 0 else f"with status {status}",
                ran,
                delay,
            )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), delay)
            if self._stopping.is_set():
                return
            await self._start(worker)
            worker.restarts += 1
            if await self._until_ready(worker) is None and worker.ready.is_set():
                assert worker.process is not None
                log.info(
                    "%s restarted (pid %d, restart %d)", worker.role.name, worker.process.pid, worker.restarts
                )
                print(f"outrig worker {worker.role.index} restarted: pid {worker.process.pid}", flush=True)

    def _signal_all(self, signum: int) -> None:
        for worker in self._workers:
            process = worker.process
            if process is not None and process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    process.send_signal(signum)

    async def _stop_all(self) -> None:
        self._signal_all(signal.SIGTERM)
        waits = [w.process.wait() for w in self._workers if w.process is not None]
        try:
            await asyncio.wait_for(asyncio.gather(*waits), self.config.grace_seconds + STOP_MARGIN)
        except TimeoutError:
            log.warning(
                "workers still running %.1f s after SIGTERM: killed", self.config.grace_seconds + STOP_MARGIN
            )
            self._signal_all(signal.SIGKILL)
            await asyncio.gather(*(w.process.wait() for w in self._workers if w.process is not None))

    # ------------------------------------------------------------------ running

    async def run(self) -> int:
        """Serve until SIGTERM or SIGINT: 0 once every worker stopped; a worker's exit status if
        one ended before it ever served."""
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, self._stopping.set)
        loop.add_signal_handler(signal.SIGHUP, self._signal_all, signal.SIGHUP)
        try:
            self._workers = [_Worker(role) for role in self._roles()]
            for worker in self._workers:
                await self._start(worker)
            statuses = await asyncio.gather(*(self._until_ready(w) for w in self._workers))
            failed = next((status for status in statuses if status is not None), None)
            if failed is not None or self._stopping.is_set():
                await self._stop_all()
                if failed is not None:
                    log.error("a worker ended (status %d) before it served: stopping", failed)
                    return failed if failed > 0 else 1
                return 0
            # Tests and scripts read these lines to find the ports when listening on port 0.
            print(f"outrig listening on {self.public}", flush=True)
            for worker in self._workers:
                assert worker.process is not None
                role, pid = worker.role, worker.process.pid
                print(f"outrig worker {role.index} listening on {role.address}: pid {pid}", flush=True)
            log.info("%d workers serving on %s", self.count, self.public)
            watches = [
                asyncio.create_task(self._watch(w), name=f"outrig-{w.role.name}") for w in self._workers
            ]
            await self._stopping.wait()
            log.info("shutting down %d workers (grace %.1f s)", self.count, self.config.grace_seconds)
            await self._stop_all()
            for watch in watches:
                watch.cancel()
            return 0
        finally:
            if self._workers:
                self._signal_all(signal.SIGKILL)  # only those still running: an error above
            for reserved in self._reserved:
                reserved.close()
            if self._lock is not None:
                self._lock.release()


async def supervise(config: ServerConfig, argv: Sequence[str], count: int) -> int:
    """Run `count` workers of the `outrig serve` command line `argv` (see `Supervisor`)."""
    return await Supervisor(config, argv, count).run()
