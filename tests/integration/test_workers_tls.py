"""`outrig serve --workers 2` speaking mutual TLS: a call forwarded from one worker to another goes
over TLS (each worker trusts the client CA's certificates and presents the server's own), the SDK
reaches a worker's own port over TLS, and a partitioned space spreads over both; a caller without
a client certificate is refused where it calls."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import outrig
from outrig.service.security import certs

from ..worker_processes import Workers, start_workers


@dataclass
class Job(outrig.Entry, type_name="wtls.Job"):
    region: str | None = None
    n: int | None = None


@pytest.fixture
def tls_workers(tmp_path: Path) -> Iterator[tuple[Path, Workers]]:
    certs.write_dev_certificates(tmp_path, client="carol")
    config = tmp_path / "partitions.toml"
    config.write_text('[spaces.jobs]\npartition_by = "region"\npartitions = 4\n')
    workers = start_workers(
        2,
        *("--tls-cert", str(tmp_path / "server.pem"), "--tls-key", str(tmp_path / "server.key")),
        *("--tls-client-ca", str(tmp_path / "ca.pem"), "--config", str(config)),
    )
    try:
        yield tmp_path, workers
    finally:
        workers.stop()


def test_calls_cross_the_workers_over_tls(tls_workers: tuple[Path, Workers]) -> None:
    pki, workers = tls_workers
    tls = outrig.TLS(ca=pki / "ca.pem", cert=pki / "client.pem", key=pki / "client.key")
    (space_name,) = workers.spaces_of(1, prefix="tls")
    at_zero = outrig.connect(workers.addresses[0], space=space_name, tls=tls, direct=False, retry_deadline=0)
    with at_zero as through:
        through.write(Job(region="eu", n=1))  # forwarded by worker 0 to worker 1, over TLS
        assert through.read_nowait(Job()) == Job(region="eu", n=1)
    with outrig.connect(workers.public, space="jobs", tls=tls) as space:  # four partitions, two a worker
        for n in range(16):
            space.write(Job(region=f"r{n}", n=n))
        assert space.count(Job()) == 16  # fanned out over both workers
        assert sorted(job.n for job in space.take_many(Job(), max_entries=20, timeout=0)) == list(range(16))  # type: ignore[union-attr]
        targets = {space._connection.route_of(f"jobs~{k}") for k in range(4)}
        assert set(workers.addresses) <= targets | {None}  # partitions reached at workers' own ports
    anonymous = outrig.connect(
        workers.public, space="jobs", tls=outrig.TLS(ca=pki / "ca.pem"), retry_deadline=0
    )
    with anonymous, pytest.raises(outrig.OutrigError):
        anonymous.count(Job())
