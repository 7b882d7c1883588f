"""`outrig serve --backend postgres --workers 2`: two tier servers of one supervisor, each with its
own server id and advertised address (its own port), both on the shared public port. The tier's
ownership places spaces on them; Locate and ListSpaces name the workers' own addresses; a
SIGKILLed worker's spaces are taken over by the other or come back with the restarted worker, and
the SDK's calls go on with every acknowledged write kept."""

from __future__ import annotations

import dataclasses
import os
import signal
from collections.abc import Iterator

import pytest

import outrig

from ..postgres_server import PostgresServer
from ..worker_processes import Workers, alive, start_workers


@dataclasses.dataclass
class Job(outrig.Entry, type_name="pgworkers.Job"):
    n: int | None = None


@pytest.fixture
def workers(postgres: PostgresServer) -> Iterator[Workers]:
    database = postgres.dsn(postgres.new_database("w"))
    running = start_workers(2, "--backend", "postgres", "--dsn", database, "--owner-lease", "1.5")
    yield running
    running.stop()


def test_two_workers_serve_a_tier_and_survive_a_kill(workers: Workers) -> None:
    spaces = [f"pw{n}" for n in range(6)]
    for space_name in spaces:
        with outrig.connect(workers.public, space=space_name, direct=False) as space:
            space.write_many([Job(n=n) for n in range(3)])
    with outrig.connect(workers.public, direct=False) as any_space:
        placements = {p.space: p for p in any_space.list_spaces()}
    assert set(spaces) <= set(placements)
    owners = {placements[s].address for s in spaces}
    assert owners == set(workers.addresses)  # the tier spreads them over both workers
    ids = {placements[s].owner for s in spaces}
    assert len(ids) == len(owners)  # a server id per worker
    # A space's calls through the other worker's port go to its owner's own address.
    (victim_space,) = spaces[:1]
    owner = placements[victim_space].address
    other = next(a for a in workers.addresses if a != owner)
    with outrig.connect(other, space=victim_space) as routed:
        assert routed.count(Job()) == 3
        assert routed.target == owner
    index = workers.addresses.index(owner)
    old = workers.pids[index]
    os.kill(old, signal.SIGKILL)
    with outrig.connect(workers.public, space=victim_space, direct=False, retry_deadline=30) as space:
        space.write(Job(n=99))  # retried until the space is served again (taken over or restarted)
        assert sorted(j.n or 0 for j in space.take_many(Job(), max_entries=100) if isinstance(j, Job)) == [
            0,
            1,
            2,
            99,
        ]
    new = workers.wait_restarted(index)
    assert new != old and not alive(old)
    for space_name in spaces[1:]:
        with outrig.connect(workers.public, space=space_name, direct=False, retry_deadline=30) as space:
            assert space.count(Job()) == 3
    with outrig.connect(workers.public, direct=False) as any_space:
        assert {p.address for p in any_space.list_spaces() if p.space in spaces} <= set(workers.addresses)
