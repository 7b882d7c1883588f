"""Owner crash harness: in a tier of three `outrig serve --backend postgres` servers on one real
PostgreSQL, the server that owns the space is SIGKILLed under load, again and again, and nothing
is lost, duplicated or resurrected.

Three servers, each on a fixed loopback port (so that a client's channel reconnects to the server
restarted there), share a fresh database with a short owner lease. Writer and taker threads, each
with its own connection through the blocking SDK to a server picked at random (which forwards to
the owner, and which the SDK retries with request ids when it answers UNAVAILABLE), keep writing
and taking. The test finds the space's owner (`list_spaces` through a live server), SIGKILLs it,
restarts a server on its port at once (the tier stays at three), waits for another server to
claim the space (after the dead owner's lease runs out) and for the load to move on, and kills
the new owner; KILLS times. Then the load stops, the space is drained with take_nowait, and what
was drained and taken is checked against what the clients were told (as tests/durability/
test_crash.py checks a single server):

- every acknowledged write was either taken, moved or drained (none lost);
- the movers (a take and a write in a transaction, committed, while the owners die) moved each
  item they were told they moved, once, and no transaction was told it aborted: the new owner
  rebuilds the transactions open on the old one;
- no entry was returned by two takes, or by a take and the drain (a take is not undone);
- nothing taken or drained was never written (sanity).

The kill moments come from a seeded random; the load's timing does not. Change SEED to explore.
"""

from __future__ import annotations

import functools
import random
import signal
import threading
import time
from collections.abc import Iterator

import pytest

import outrig

from ..conftest import ServerProcess, free_port, start_server
from ..polling import wait_until
from ..postgres_server import PostgresServer
from .load import Clients, Item, Moved, Tally, check, start_load, stop_load

SEED = 20240619
KILLS = 4
SERVERS = 3
OWNER_LEASE = 1.5
RETRY_DEADLINE = 30.0  # spans a takeover (a lease and a bit) by far
MOVERS = 2  # transactions open across the kills: the new owner rebuilds them
CLIENTS = Clients(space="owner-crash", seed=SEED, retry_deadline=RETRY_DEADLINE, movers=MOVERS)
SPACE = CLIENTS.space


@pytest.fixture
def database(postgres: PostgresServer) -> str:
    return postgres.dsn(postgres.new_database("oc"))


class Tier:
    """SERVERS servers on fixed ports; a killed one is restarted on its port."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.addresses = [f"127.0.0.1:{free_port()}" for _ in range(SERVERS)]
        self.servers: dict[str, ServerProcess] = {}
        self.logs: list[str] = []

    def start(self, address: str) -> ServerProcess:
        server = start_server(
            "--listen", address, "--backend", "postgres", "--dsn", self.dsn, "--owner-lease", str(OWNER_LEASE)
        )
        self.servers[address] = server
        self.logs.append(str(server.log))
        return server

    def kill(self, address: str) -> None:
        assert self.servers.pop(address).stop(signal.SIGKILL) == -signal.SIGKILL

    def stop_all(self) -> None:
        for server in self.servers.values():
            server.stop()
        self.servers.clear()


@pytest.fixture
def tier(database: str) -> Iterator[Tier]:
    running = Tier(database)
    try:
        yield running
    finally:
        running.stop_all()


def _placement(address: str) -> outrig.Placement | None:
    """The space's placement as the server at `address` reads it from the database (None: none,
    or the server did not answer within a short retry)."""
    try:
        with outrig.connect(address, space=SPACE, retry_deadline=1.0) as admin:
            return next((p for p in admin.list_spaces() if p.space == SPACE), None)
    except outrig.UnavailableError:
        return None


def test_owner_sigkilled_under_load_loses_duplicates_and_resurrects_nothing(tier: Tier) -> None:
    for address in tier.addresses:
        tier.start(address)
    rng = random.Random(SEED)
    stop = threading.Event()
    tally = Tally()
    threads = start_load(lambda: rng.choice(tier.addresses), stop, tally, CLIENTS)
    started = time.monotonic()
    owners: list[str] = []  # the server ids killed, in order
    epochs: list[int] = []

    def current_owner(exclude: str | None) -> outrig.Placement | None:
        """The space's live owner, if it is not the server id `exclude` (the one just killed)."""
        for address in tier.servers:
            placement = _placement(address)
            if placement is not None:
                alive = placement.expires_in is not None and placement.address in tier.servers
                return placement if alive and placement.owner != exclude else None
        return None

    def moved_on(mark: int) -> bool:
        """Some writes and takes acknowledged since `mark` writes and takes were."""
        return tally.count(tally.acknowledged) + tally.count(tally.taken) >= mark + 40

    try:
        owner = wait_until(lambda: current_owner(None), 20, what="a first owner of the space")
        for _ in range(KILLS):
            mark = tally.count(tally.acknowledged) + tally.count(tally.taken)
            wait_until(functools.partial(moved_on, mark), 30, what="load on the current owner")
            time.sleep(rng.uniform(0.0, 0.5))  # a random moment of its load, not a synchronisation
            owners.append(owner.owner)
            epochs.append(owner.epoch)
            tier.kill(owner.address)
            tier.start(owner.address)  # the tier stays at three: a new server on the dead one's port
            killed = owner.owner
            owner = wait_until(
                functools.partial(current_owner, killed), 30, what=f"a new owner after {killed} died"
            )
            assert owner.epoch > epochs[-1], f"the new owner's epoch did not grow: {owner} after {epochs}"
        mark = tally.count(tally.acknowledged) + tally.count(tally.taken)
        wait_until(lambda: moved_on(mark), 30, what="load on the last owner")
    finally:
        stop_load(threads, stop, CLIENTS)
    loaded = time.monotonic() - started
    assert not any(thread.is_alive() for thread in threads), "a client thread did not stop"
    assert not tally.errors, f"client calls failed despite retries: {tally.errors} (logs {tier.logs})"

    drained: list[str] = []
    moved: list[str] = []
    with outrig.connect(tier.addresses[0], space=SPACE, retry_deadline=RETRY_DEADLINE) as space:
        while (item := space.take_nowait(Item())) is not None:
            assert isinstance(item, Item) and item.uid is not None
            drained.append(item.uid)
        while (done := space.take_nowait(Moved())) is not None:
            assert isinstance(done, Moved) and done.uid is not None
            moved.append(done.uid)
        assert space.count(Item()) == 0

    assert len(set(owners)) == KILLS, f"the same server id was killed twice: {owners}"
    check(
        tally,
        drained,
        "drained",
        f"owner crash harness: seed {SEED}, {KILLS} owners killed ({owners}, epochs {epochs} then "
        f"{owner.epoch}) in {loaded:.1f} s",
        moved,
    )
    # The movers' transactions were open across the kills and rebuilt by each new owner: none
    # was told it aborted.
    assert sum(tally.aborted) == 0, f"{sum(tally.aborted)} movers' transactions aborted"
    assert len(moved) >= 10, f"too few moves to mean anything: {len(moved)}"
