"""A partitioned space on a tier of three `outrig serve --backend postgres` processes: each
partition is owned, fenced and taken over as a space is. SIGKILL the owner of some partitions: the
others go on being served meanwhile, the killed ones are claimed by the survivors, and nothing
acknowledged is lost or taken twice, through the SDK's retries."""

from __future__ import annotations

import signal
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import outrig
from outrig._codec import encode_value
from outrig._routing import value_partition

from ..conftest import ServerProcess, start_server
from ..polling import wait_until
from ..postgres_server import PostgresServer

PARTITIONS = 6
LEASE = "1.5"  # seconds a dead owner keeps its partitions


@dataclass
class Order(outrig.Entry, type_name="tier.Order"):
    customer: str | None = None
    n: int | None = None


def _partition(customer: str) -> int:
    k = value_partition(encode_value(customer), PARTITIONS)
    assert k is not None
    return k


@pytest.fixture
def tier(postgres: PostgresServer) -> Iterator[list[ServerProcess]]:
    config = Path(tempfile.mkstemp(prefix="outrig-tier-", suffix=".toml")[1])
    config.write_text(f'[spaces.orders]\npartition_by = "customer"\npartitions = {PARTITIONS}\n')
    flags = ("--backend", "postgres", "--dsn", postgres.dsn(postgres.new_database("pt")))
    servers = [start_server(*flags, "--config", str(config), "--owner-lease", LEASE) for _ in range(3)]
    yield servers
    for server in servers:
        server.stop()
    config.unlink()


def _owners(space: outrig.Space) -> dict[int, str]:
    return {
        int(p.space.rpartition("~")[2]): p.address
        for p in space.list_spaces()
        if p.space.startswith("orders~") and p.expires_in
    }


def test_killing_an_owner_moves_its_partitions_and_loses_nothing(tier: list[ServerProcess]) -> None:
    customers = [f"c{i}" for i in range(60)]
    by_partition: dict[int, list[str]] = {}
    for customer in customers:
        by_partition.setdefault(_partition(customer), []).append(customer)
    # Claim each partition through a server in turn: two each.
    for k in range(PARTITIONS):
        with outrig.connect(tier[k % 3].address, space="orders", direct=False) as claim:
            claim.write(Order(customer=by_partition[k][0], n=-1))
            assert claim.take_nowait(Order(n=-1)) is not None
    with outrig.connect(tier[0].address, space="orders", direct=False) as look:
        owners = _owners(look)
    assert len(owners) == PARTITIONS and len(set(owners.values())) >= 2  # spread over the tier
    victim = next(s for s in tier if s.address in owners.values())
    survivor = next(s for s in tier if s is not victim)
    lost_partitions = {k for k, address in owners.items() if address == victim.address}
    with outrig.connect(survivor.address, space="orders", retry_deadline=60) as space:
        written = [Order(customer=c, n=i) for i, c in enumerate(customers)]
        for order in written:
            space.write(order, lease=600.0)
        taken: list[Any] = []
        errors: list[BaseException] = []

        def take_all() -> None:  # a taker through the kill: fan-out takes, retried by the SDK
            try:
                with outrig.connect(survivor.address, space="orders", retry_deadline=60) as mine:
                    while len(taken) < len(written):
                        found = mine.take(Order(), timeout=10)
                        if found is None:
                            return
                        taken.append(found)
            except BaseException as err:
                errors.append(err)

        victim.process.send_signal(signal.SIGKILL)
        victim.process.wait()
        # The partitions the survivors own answer at once; the victim's after their takeover.
        alive = [k for k in range(PARTITIONS) if k not in lost_partitions]
        with outrig.connect(survivor.address, space="orders", retry_deadline=0) as no_retries:
            for k in alive:  # served meanwhile: no retry needed
                assert no_retries.count(Order(customer=by_partition[k][0])) == 1
        taker = threading.Thread(target=take_all)
        taker.start()
        taker.join(timeout=120)
        assert not errors, errors
        assert sorted(o.n for o in taken) == list(range(60))  # every acknowledged one, once
        wait_until(
            lambda: (
                lost_partitions.isdisjoint({k for k, a in _owners(space).items() if a == victim.address})
                and len(_owners(space)) == PARTITIONS
            ),
            what="the victim's partitions claimed by the survivors",
            timeout=30,
        )
        assert space.count(Order()) == 0
