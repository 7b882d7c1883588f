"""A tier's server and its database going away: at start (exit status 2, the database named, its
password not), and while serving (calls answer UNAVAILABLE, outrig.v1.Space turns NOT_SERVING
while the process stays SERVING, and once the database is back the server serves its space
again with everything it had acknowledged)."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

import outrig

from ..conftest import ServerProcess, start_server
from ..polling import scrape, wait_until
from ..postgres_server import PostgresServer
from ..tcp_proxy import CutMode, TcpProxy
from .test_servers import Job, drained

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


@pytest.fixture
def database(postgres: PostgresServer) -> str:
    return postgres.new_database("u")


@pytest.fixture
def proxied(postgres: PostgresServer, database: str) -> Iterator[tuple[TcpProxy, ServerProcess]]:
    with TcpProxy("127.0.0.1", postgres.port) as proxy:
        server = start_server(
            "--backend",
            "postgres",
            "--dsn",
            f"postgresql://outrig@{proxy.address}/{database}",
            "--owner-lease",
            "1.5",
            metrics=True,
        )
        try:
            yield proxy, server
        finally:
            server.stop()


def health(address: str, service: str) -> int:
    with grpc.insecure_channel(address) as channel:
        # types-grpcio-health-checking declares no methods on HealthStub: say what Check is.
        check = health_pb2_grpc.HealthStub(channel).Check  # type: ignore[attr-defined]
        reply = check(health_pb2.HealthCheckRequest(service=service), timeout=5)
        return int(reply.status)


@pytest.mark.parametrize("cut", ["reset", "blackhole"])
def test_a_database_lost_and_back(proxied: tuple[TcpProxy, ServerProcess], cut: CutMode) -> None:
    """`reset`: the database's connections drop; `blackhole`: they stay open and go silent, as in a
    partition, which only the server's own deadlines (a lease) notice."""
    proxy, server = proxied
    with outrig.connect(server.address, space="jobs", retry_deadline=0) as space:
        space.write_many([Job(n=i) for i in range(20)])
        proxy.cut(mode=cut)
        wait_until(lambda: health(server.address, "outrig.v1.Space") == NOT_SERVING, what="NOT_SERVING")
        assert health(server.address, "") == SERVING  # alive: a liveness probe must not restart it
        assert server.metrics is not None
        assert scrape(server.metrics)["outrig_tier_serving"] == 0  # and its metrics say so
        with pytest.raises(outrig.UnavailableError):
            space.write(Job(n=100))

        def refuses_reads() -> bool:
            try:
                space.read_nowait(Job())
            except outrig.UnavailableError:
                return True
            return False

        # Reads go on only while the server can still prove it owns the space (a share of the
        # lease from its last renewal), never after.
        wait_until(refuses_reads, what="reads refused")
        proxy.restore()
        wait_until(lambda: health(server.address, "outrig.v1.Space") == SERVING, what="SERVING again")

        def served() -> bool:
            try:
                return space.count(Job()) >= 20
            except outrig.UnavailableError:
                return False

        wait_until(served, what="the space served again")
        assert scrape(server.metrics)["outrig_tier_serving"] == 1
        assert [n for n in drained(space) if n < 20] == list(range(20))  # every acknowledged write is there


def test_a_database_unreachable_at_start_exits_2_naming_it_without_its_password() -> None:
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
        dsn = f"postgresql://outrig:sekrit@127.0.0.1:{port}/tier"
        # Port 0: another server on the default port (7480) must not decide what this one says.
        command = [sys.executable, "-m", "outrig.service", "serve", "--listen", "127.0.0.1:0"]
        done = subprocess.run(
            [*command, "--backend", "postgres", "--dsn", dsn],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert done.returncode == 2
    assert f"127.0.0.1:{port}/tier" in done.stderr
    assert "sekrit" not in done.stderr + done.stdout
