"""Several `outrig serve --backend postgres` processes on one real database, through the SDK."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

import outrig

from ..conftest import ServerProcess, start_server
from ..postgres_server import PostgresServer


@dataclass
class Job(outrig.Entry, type_name="pg.Job"):
    n: int | None = None


def drained(space: outrig.Space) -> list[int]:
    """Take every Job left in the space: their numbers, sorted."""
    numbers = []
    while (job := space.take_nowait(Job())) is not None:
        assert isinstance(job, Job) and job.n is not None
        numbers.append(job.n)
    return sorted(numbers)


@pytest.fixture
def database(postgres: PostgresServer) -> str:
    return postgres.dsn(postgres.new_database("s"))


@pytest.fixture
def three(database: str) -> Iterator[list[ServerProcess]]:
    servers = [start_server("--backend", "postgres", "--dsn", database) for _ in range(3)]
    yield servers
    for server in servers:
        server.stop()


def test_three_servers_serve_one_space(three: list[ServerProcess]) -> None:
    first, second, third = (outrig.connect(s.address, space="jobs", retry_deadline=0) for s in three)
    with first, second, third:
        got: list[object] = []
        blocked = threading.Thread(target=lambda: got.append(second.take(Job(n=1), timeout=20.0)))
        blocked.start()
        first.write(Job(n=1))  # through one server; the take blocked on another gets it
        blocked.join(30)
        assert got == [Job(n=1)]
        first.write_many([Job(n=i) for i in range(100)])
        taken: list[int] = []
        takers = [
            threading.Thread(target=lambda space=space: taken.extend(
                job.n for job in iter(lambda: space.take_nowait(Job()), None)
            ))
            for space in (first, second, third)
        ]  # fmt: skip
        for thread in takers:
            thread.start()
        for thread in takers:
            thread.join(60)
        assert sorted(taken) == list(range(100))  # each entry once, through whichever server
        with first.transaction() as txn:
            txn.write(Job(n=500))
            assert third.read_nowait(Job(n=500)) is None
        assert third.read_nowait(Job(n=500)) == Job(n=500)


def test_a_server_killed_mid_transaction_leaves_the_space_consistent(three: list[ServerProcess]) -> None:
    doomed, survivor = three[0], three[1]
    with outrig.connect(survivor.address, space="jobs", retry_deadline=0) as space:
        space.write(Job(n=1))
    with outrig.connect(doomed.address, space="jobs", retry_deadline=0) as space:
        txn = space.transaction(lease=1.0)
        assert txn.take(Job(n=1), timeout=0) == Job(n=1)
        txn.write(Job(n=2))
    doomed.stop(signal.SIGKILL)
    with outrig.connect(survivor.address, space="jobs", retry_deadline=0) as space:
        # The transaction's lease runs out; a surviving server's reaper aborts it.
        assert space.take(Job(n=1), timeout=20.0) == Job(n=1)
        assert space.read_nowait(Job(n=2)) is None


def test_a_transaction_open_on_a_killed_owner_goes_on_at_the_next(database: str) -> None:
    """The owner of a space is killed (SIGKILL) with two transactions open on it. Through another
    server of the tier, each goes on where it was: the server that claims the space rebuilt them
    from the database (their takes, writes and read locks), one commits exactly what it did, the
    other aborts, and the space holds what it must."""
    servers = [
        start_server("--backend", "postgres", "--dsn", database, "--owner-lease", "1.0") for _ in range(3)
    ]
    try:
        with outrig.connect(servers[0].address, space="txn", retry_deadline=0) as claim:
            claim.write_many([Job(n=1), Job(n=3), Job(n=5)])
            owner_address = claim.locate().address
        owner = next(server for server in servers if server.address == owner_address)
        via = next(server for server in servers if server is not owner)
        with outrig.connect(via.address, space="txn", direct=False, retry_deadline=60) as space:
            kept = space.transaction(lease=120.0)
            assert kept.take(Job(n=1), timeout=0) == Job(n=1)
            kept.write(Job(n=2))
            assert kept.read(Job(n=3), timeout=0) == Job(n=3)
            dropped = space.transaction(lease=120.0)
            assert dropped.take(Job(n=5), timeout=0) == Job(n=5)
            dropped.write(Job(n=6))
            owner.stop(signal.SIGKILL)
            # Served again (the first call waits out the takeover), as the transactions left it.
            assert space.read_nowait(Job(n=2)) is None
            assert space.take_nowait(Job(n=1)) is None
            assert space.take_nowait(Job(n=3)) is None  # read-locked by `kept`
            assert kept.read_nowait(Job(n=2)) == Job(n=2)
            kept.commit()
            dropped.abort()
            assert drained(space) == [2, 3, 5]
    finally:
        for server in servers:
            server.stop()
