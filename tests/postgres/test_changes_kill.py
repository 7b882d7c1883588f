"""The change log through a SIGKILL of the owner: three `outrig serve --backend postgres`
processes on one database, clients through a server that is not the owner (the SDK follows the
owner). A writer writes a burst, one write at a time, while the owner is killed; then:

- a stream that was reading live across the kill (the SDK resumes it by itself from its cursor
  at the new owner) saw every acknowledged write exactly once, in order;
- a cursor taken before the kill resumes through the new owner with exactly the changes after
  it, none twice;
- a durable subscription acked before the kill attaches at the new owner right after its ack.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

import outrig

from ..conftest import ServerProcess, start_server
from ..polling import wait_until
from ..postgres_server import PostgresServer

BURST = 300


@dataclass
class Tick(outrig.Entry, type_name="pgchanges.Tick"):
    n: int | None = None


@pytest.fixture
def three(postgres: PostgresServer) -> Iterator[list[ServerProcess]]:
    database = postgres.dsn(postgres.new_database("k"))
    servers = [
        start_server("--backend", "postgres", "--dsn", database, "--owner-lease", "1.0") for _ in range(3)
    ]
    yield servers
    for server in servers:
        server.stop()


def _numbers(changes: list[outrig.Change]) -> list[tuple[str, int | None]]:
    return [(change.kind, change.entry.n) for change in changes]  # type: ignore[union-attr]


def test_cursors_and_durable_subscriptions_survive_a_killed_owner(three: list[ServerProcess]) -> None:
    with outrig.connect(three[0].address, space="ticks", retry_deadline=0) as claim:
        claim.write(Tick(n=-1))
        owner_address = claim.locate().address
    owner = next(server for server in three if server.address == owner_address)
    via = next(server for server in three if server is not owner)
    acknowledged: list[int] = []
    live: list[outrig.Change] = []
    with outrig.connect(via.address, space="ticks", retry_deadline=60) as space:
        with space.changes(Tick(), durable="d") as durable:
            start = durable.cursor
        for n in range(20):
            space.write(Tick(n=n))
            acknowledged.append(n)
        with space.changes(Tick(), since=start) as stream:
            before = [next(stream) for _ in range(20)]
        cursor = before[9].cursor  # a subscriber handled ten, then went away
        with space.changes(Tick(), durable="d") as durable:
            durable.ack(before[4].cursor)

        reading = threading.Event()

        failed: list[BaseException] = []

        def listen() -> None:
            try:
                with (
                    outrig.connect(via.address, space="ticks", retry_deadline=60) as listener,
                    listener.changes(Tick(), since=before[-1].cursor) as changes,
                ):
                    reading.set()
                    for change in changes:
                        live.append(change)
                        if change.entry.n == BURST - 1:  # type: ignore[union-attr]
                            return
            except BaseException as err:  # told below, with what the stream had read
                failed.append(err)

        listener = threading.Thread(target=listen)
        listener.start()
        assert reading.wait(10)

        def burst() -> None:
            for n in range(20, BURST):
                space.write(Tick(n=n))
                acknowledged.append(n)

        writer = threading.Thread(target=burst)
        writer.start()
        wait_until(lambda: len(acknowledged) >= 100, what="a third of the burst")
        owner.stop(signal.SIGKILL)
        writer.join(120)
        listener.join(120)
        assert not writer.is_alive() and not listener.is_alive()
        assert acknowledged == list(range(BURST))
        assert not failed, f"the live stream failed after {len(live)} changes: {failed[0]!r}"
        # Live across the kill: every write after its cursor once, in order.
        assert _numbers(live) == [("write", n) for n in range(20, BURST)]
        # From the cursor taken before the kill, through the new owner: exactly what followed.
        with space.changes(Tick(), since=cursor) as resumed:
            after = [next(resumed) for _ in range(BURST - 10)]
            assert resumed.cursor == after[-1].cursor
        assert _numbers(after) == [("write", n) for n in range(10, BURST)]
        assert [change.cursor for change in after[:10]] == [change.cursor for change in before[10:]]
        # The durable subscription's position survived: it starts right after its ack.
        with space.changes(Tick(), durable="d") as durable:
            assert next(durable).entry == Tick(n=5)
