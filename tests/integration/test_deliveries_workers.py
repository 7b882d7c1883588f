"""Takes with ack on `outrig serve --workers 2` (real processes) and a space in 4 partitions, two
a worker: a fanned-out take with ack through the public port, and each delivery settled at the
worker that serves its partition, which the SDK finds by the receipt (its partition's number)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import pytest

import outrig
from outrig._routing import ID_STRIDE

from ..worker_processes import Workers, start_workers


@dataclass
class Job(outrig.Entry, type_name="wacks.Job"):
    region: str | None = None
    n: int | None = None


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[Workers]:
    config = tmp_path / "partitions.toml"
    config.write_text('[spaces.jobs]\npartition_by = "region"\npartitions = 4\n')
    running = start_workers(2, "--config", str(config))
    try:
        yield running
    finally:
        running.stop()


def test_settlements_go_to_the_worker_of_the_receipt(workers: Workers) -> None:
    with outrig.connect(workers.public, space="jobs") as space:
        space.write_many([Job(region=f"r{n}", n=n) for n in range(16)])
        deliveries = space.take_many(Job(), max_entries=20, timeout=1.0, ack=30.0)  # fanned out
        assert sorted(cast(int, cast(Job, d.entry).n) for d in deliveries) == list(range(16))
        partitions = {d.receipt % ID_STRIDE for d in deliveries}
        assert partitions == {0, 1, 2, 3}
        assert space.count(Job()) == 0  # all pending
        returned = deliveries[0]
        returned.nack(delay=0)
        for delivery in deliveries[1:]:
            delivery.extend(60.0)
            delivery.ack()
        # Each partition's settlements went to its worker's own port (located by the receipt).
        targets = {space._connection.route_of(f"jobs~{k}") for k in partitions}
        assert targets == set(workers.addresses)
        again = space.take(Job(region=cast(Job, returned.entry).region), timeout=1.0, ack=30.0)
        assert again is not None and again.deliveries == 2 and again.entry == returned.entry
        with pytest.raises(outrig.DeliveryExpiredError):
            returned.ack()
        assert again.nack(delay=0) == outrig.Returned(None)
        last = space.take(Job(), timeout=1.0, ack=30.0, max_deliveries=3)
        assert last is not None and last.deliveries == 3
        dead_letter = last.nack().dead_letter
        assert dead_letter == "jobs.dead"  # partition k's dead letters go to jobs.dead~k
        dead = space.with_space("jobs.dead").take(Job(), timeout=1.0, ack=30.0)  # fanned out too
        assert dead is not None and dead.entry == returned.entry and dead.deliveries == 4
        assert "max_deliveries=3" in dead.dead_letter_reason
        dead.ack()
        assert space.browse().entries == [] and space.with_space("jobs.dead").browse().entries == []
