"""A tier whose servers speak mutual TLS: a call forwarded from one server to the owner goes over
TLS too (the forwarding server trusts the tier's CA and presents its own certificate), and
forwarding never lets a caller skip authentication at the server it called."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import outrig
from outrig.service.security import certs

from ..conftest import ServerProcess, start_server
from ..postgres_server import PostgresServer
from .test_servers import Job


@pytest.fixture
def tier(postgres: PostgresServer, tmp_path: Path) -> Iterator[tuple[Path, ServerProcess, ServerProcess]]:
    certs.write_dev_certificates(tmp_path, client="carol")
    name = postgres.new_database("l")
    flags = [
        *("--backend", "postgres", "--dsn", postgres.dsn(name)),
        *("--tls-cert", str(tmp_path / "server.pem"), "--tls-key", str(tmp_path / "server.key")),
        *("--tls-client-ca", str(tmp_path / "ca.pem")),
    ]
    owner = start_server(*flags)
    receiver = start_server(*flags)
    try:
        yield tmp_path, owner, receiver
    finally:
        receiver.stop()
        owner.stop()


def test_a_call_forwarded_between_tls_servers(tier: tuple[Path, ServerProcess, ServerProcess]) -> None:
    pki, owner, receiver = tier
    tls = outrig.TLS(ca=pki / "ca.pem", cert=pki / "client.pem", key=pki / "client.key")
    with outrig.connect(owner.address, space="jobs", tls=tls) as on_owner:
        on_owner.write(Job(n=1))  # the owner claims the space
    with outrig.connect(receiver.address, space="jobs", tls=tls, direct=False, retry_deadline=0) as through:
        assert through.locate().address == owner.address  # served by the other server
        through.write(Job(n=2))  # forwarded to it, over TLS
        assert sorted(job.n for job in through.contents(Job()) if isinstance(job, Job) and job.n) == [1, 2]
    # A caller without a client certificate is refused where it calls: nothing is forwarded.
    with (
        outrig.connect(
            receiver.address, space="jobs", tls=outrig.TLS(ca=pki / "ca.pem"), direct=False, retry_deadline=0
        ) as anonymous,
        pytest.raises(outrig.OutrigError),
    ):
        anonymous.write(Job(n=3))
    with outrig.connect(owner.address, space="jobs", tls=tls) as on_owner:
        assert on_owner.count(Job()) == 2
