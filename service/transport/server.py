"""The outrig gRPC server: the space service, health checking and reflection on one grpc.aio server."""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
import socket
from typing import TYPE_CHECKING

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer
from grpc_reflection.v1alpha import reflection

from outrig.service import process
from outrig.service.backends import backend_for
from outrig.service.backends.base import SpaceBackend, TierFigures
from outrig.service.config import ServerConfig
from outrig.service.engine.clock import Clock
from outrig.service.exceptions import ConfigError
from outrig.service.security.settings import build_guard, check_listen, is_loopback, server_credentials
from outrig.service.transport import handlers
from outrig.service.transport.metrics import Metrics
from outrig.service.transport.mux import MuxService
from outrig.service.transport.peers import Peers
from outrig.service.transport.servicer import SpaceServicer

if TYPE_CHECKING:
    from outrig.service.transport.console.app import Console
from outrig.v1 import space_pb2

log = logging.getLogger("outrig.service")

_SERVING = health_pb2.HealthCheckResponse.SERVING
_NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
#: Seconds between two looks at whether the backend can serve (the health of outrig.v1.Space).
HEALTH_INTERVAL = 0.5

SERVICE_NAME = space_pb2.DESCRIPTOR.services_by_name["Space"].full_name


def split_listen(listen: str) -> tuple[str, int]:
    host, sep, port = listen.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ConfigError(f"listen: expected HOST:PORT, got {listen!r}")
    return host, int(port)


class OutrigServer:
    """A running outrig server. `start()` returns the bound port (useful with port 0)."""

    def __init__(
        self, config: ServerConfig, *, clock: Clock | None = None, backend: SpaceBackend | None = None
    ) -> None:
        self.config = config
        # Security files first: a bad policy or certificate stops the start before a store is opened.
        self.guard = build_guard(config)
        self._credentials = server_credentials(config)
        self.backend = backend or backend_for(config, clock)
        self.port = 0
        self._watch: asyncio.Task[None] | None = None
        self._serving: asyncio.Task[None] | None = None
        self._health = HealthServicer()
        limit = config.max_message_bytes
        pending = max(1000, config.limits.max_waiters)
        self._server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", limit),
                ("grpc.max_send_message_length", limit),
                # A worker shares the public port with the others (`outrig serve --workers N`);
                # a lone server refuses a port another process listens on (gRPC's default on
                # Linux would share it).
                ("grpc.so_reuseport", 0 if config.worker is None else 1),
                # gRPC cancels calls that wait to be picked up once more than 1,000 do (its default):
                # a burst of blocked takes would be cut off long before max_waiters. Allow a
                # burst as large as the waiters the quota admits.
                ("grpc.server.max_pending_requests", pending),
                ("grpc.server.max_pending_requests_hard_limit", 2 * pending),
            ]
        )
        # The console shows calls a second and latency from the metrics, served or not.
        self.metrics = Metrics() if config.metrics_listen or config.console else None
        if self.metrics is not None:
            self.guard.on_denied = self.metrics.denied
        # The channels to the tier's other servers, for the calls this one forwards (peers.py).
        self.peers = Peers(config)
        servicer = SpaceServicer(self.backend, config.limits, self.guard, self.metrics, self.peers, config)
        self._servicer = servicer
        # A lone server (no workers, no tier) forwards nothing: its Mux operations that cannot
        # wait run without a task of their own (transport/mux.py).
        lone = config.worker is None and self.backend.tier_figures() is None
        self._mux = MuxService(servicer, config.limits.max_stream_ops, limit, lone=lone)
        handlers.add_to_server(servicer, self._server, self._mux.handle)
        self.console: Console | None = None  # the web console (transport/console), with `console`
        if config.console:
            from outrig.service.transport.console.app import Console

            self.console = Console(servicer, self.metrics, authenticates=self.guard.authenticates)
        health_pb2_grpc.add_HealthServicer_to_server(self._health, self._server)
        reflection.enable_server_reflection(
            (
                SERVICE_NAME,
                health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
                reflection.SERVICE_NAME,
            ),
            self._server,
        )

    @property
    def address(self) -> str:
        host, _ = split_listen(self.config.listen)
        return f"{host}:{self.port}"

    @property
    def advertised(self) -> str:
        """Where other servers and clients reach this one: `advertise`, else the bound listen
        address, with this host's name in place of a wildcard host. A worker's is its own
        address (with the host of `advertise`, if one is configured)."""
        worker = self.config.worker
        if worker is not None:
            host, port = split_listen(worker.address)
            if self.config.advertise:
                host, _ = split_listen(self.config.advertise)
            elif host in ("", "0.0.0.0", "::", "[::]"):
                host = socket.gethostname()
            return f"{host}:{port}"
        if self.config.advertise:
            return self.config.advertise
        host, _ = split_listen(self.config.listen)
        if host in ("", "0.0.0.0", "::", "[::]"):
            host = socket.gethostname()
        return f"{host}:{self.port}"

    async def start(self) -> int:
        host, port = split_listen(self.config.listen)
        check_listen(
            self.config, host, tls=self._credentials is not None, authenticated=self.guard.authenticates
        )
        try:
            if self._credentials is None:
                self.port = self._server.add_insecure_port(f"{host}:{port}")
            else:
                self.port = self._server.add_secure_port(f"{host}:{port}", self._credentials)
        except RuntimeError as err:
            raise ConfigError(f"listen: cannot bind {self.config.listen}: {err}") from err
        if self.config.worker is not None:
            self._listen_own(self.config.worker.address)
        self.backend.serving_at(self.advertised)
        self._servicer.advertised = self.advertised
        await self.backend.start()
        if self.metrics is not None:
            self._serve_metrics(self.metrics)
        await self._server.start()
        for service in ("", SERVICE_NAME):
            await self._health.set(service, health_pb2.HealthCheckResponse.SERVING)
        self._serving = asyncio.create_task(self._report_serving(), name="outrig-health")
        if self.console is not None:
            await self._serve_console()
        if self.guard.policy is not None:
            self._watch = asyncio.create_task(self.guard.policy.watch(self.config.policy_poll_interval))
        return self.port

    def _listen_own(self, address: str) -> None:
        """A worker's own port, besides the public one: where Locate sends clients and the
        other workers forward calls."""
        try:
            if self._credentials is None:
                self._server.add_insecure_port(address)
            else:
                self._server.add_secure_port(address, self._credentials)
        except RuntimeError as err:
            raise ConfigError(f"workers: cannot bind this worker's own address {address}: {err}") from err

    def _serve_metrics(self, metrics: Metrics) -> None:
        loop = asyncio.get_running_loop()
        backend = self.backend
        # Scrapes run on prometheus_client's thread; the figures are read on the event loop.
        metrics.watch_spaces(
            lambda: asyncio.run_coroutine_threadsafe(backend.space_figures(), loop).result(10)
        )
        metrics.watch_streams(self._mux.figures)

        async def tier_figures() -> TierFigures | None:
            return backend.tier_figures()

        metrics.watch_tier(lambda: asyncio.run_coroutine_threadsafe(tier_figures(), loop).result(10))
        backend.observe_commits(metrics.committed)
        if not self.config.metrics_listen:
            return  # kept for the console only
        try:
            metrics.serve(self.config.metrics_listen)
        except (OSError, ValueError) as err:
            raise ConfigError(
                f"metrics_listen: cannot serve on {self.config.metrics_listen!r}: {err}"
            ) from err
        log.info("metrics on http://%s/metrics", self.config.metrics_listen)

    async def _serve_console(self) -> None:
        """Start the web console on `console` (HOST:PORT): on loopback only unless the server
        authenticates its callers, whom the console calls the API as."""
        host, port = split_listen(self.config.console)
        if not self.guard.authenticates and not is_loopback(host):
            raise ConfigError(
                f"console: refusing to serve on {host} without authentication (configure "
                "--token-public-key, whose tokens the console's users log in with)"
            )
        assert self.console is not None
        try:
            await self.console.start(host.strip("[]"), port)
        except OSError as err:
            raise ConfigError(f"console: cannot serve on {self.config.console!r}: {err}") from err
        log.info("console on http://%s:%d/", host, self.console.port)

    async def _report_serving(self) -> None:
        """Keep outrig.v1.Space's health in step with whether the backend can serve (a tier's
        server cut off from PostgreSQL is NOT_SERVING, so a readiness probe takes it out of the
        load balancer). The server's own health ("") stays SERVING: the process is alive, and a
        liveness probe must not restart it for a database that is away."""
        reported = True
        while True:
            await asyncio.sleep(HEALTH_INTERVAL)
            serving = self.backend.serving
            if serving != reported:
                reported = serving
                await self._health.set(SERVICE_NAME, _SERVING if serving else _NOT_SERVING)
                log.warning("outrig.v1.Space health: %s", "SERVING" if serving else "NOT_SERVING")

    async def reload_policy(self) -> bool:
        """Reload the policy file now (SIGHUP does this); False if it was rejected or there is none."""
        if self.guard.policy is None:
            log.warning("SIGHUP: no policy file configured, nothing to reload")
            return False
        return await self.guard.policy.reload_async()

    async def stop(self, grace: float | None = None) -> None:
        """Stop taking calls, end notify streams, give in-flight calls `grace` seconds, then stop."""
        if self._watch is not None:
            self._watch.cancel()
        if self._serving is not None:
            self._serving.cancel()
        await self._health.enter_graceful_shutdown()
        await self.backend.close()
        self._mux.close()
        if self.console is not None:
            await self.console.stop()
        await self._server.stop(self.config.grace_seconds if grace is None else grace)
        await self.peers.close()
        await self.backend.shutdown()
        if self.metrics is not None:
            self.metrics.close()

    async def wait(self) -> None:
        await self._server.wait_for_termination()


async def serve(config: ServerConfig) -> None:
    """Run until SIGTERM or SIGINT, then shut down gracefully."""
    # This process is the server's own: large entries reuse freed memory, given back when idle,
    # and the objects of a request in flight are not promoted by a young collection. A preloaded
    # allocator (tcmalloc in the container image) keeps its own settings.
    releasing = None
    release = process.tune_allocator()
    if release is not None and config.idle_release_seconds > 0:
        releasing = asyncio.create_task(process.release_when_idle(config.idle_release_seconds, trim=release))
    process.tune_collector()
    if config.worker is not None:
        process.end_with_supervisor(config.worker.supervisor)
    server = OutrigServer(config)
    await server.start()
    # What start-up built (the modules, a policy's grants, a recovered store) lives as long as the
    # server: move it out of the cyclic collector's reach, so that full collections, which requests
    # trigger, do not walk it again and again (docs/security.md has the figures). Only here, in the
    # server's own process: an application embedding OutrigServer keeps its heap as it was.
    gc.collect()
    gc.freeze()
    if config.backend == "embedded" and (config.data_dir is None or config.in_memory):
        log.warning("no data dir (or --in-memory): spaces live in memory only and end with the server")
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stopping.set)
    reloads: set[asyncio.Task[bool]] = set()

    def reload() -> None:
        task = loop.create_task(server.reload_policy())
        reloads.add(task)
        task.add_done_callback(reloads.discard)

    loop.add_signal_handler(signal.SIGHUP, reload)
    # Tests and scripts read this line to find the port when listening on port 0 (a worker's:
    # its supervisor, which prints the public one once every worker is up).
    if config.worker is None:
        print(f"outrig listening on {server.address}", flush=True)
    else:
        print(f"outrig worker {config.worker.index} listening on {server.advertised}", flush=True)
    await stopping.wait()
    log.info("shutting down (grace %.1f s)", config.grace_seconds)
    if releasing is not None:
        releasing.cancel()
    await server.stop()
