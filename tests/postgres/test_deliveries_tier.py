"""Takes with an acknowledgement deadline, delayed entries and dead letters on the owner tier,
against a real PostgreSQL, several backends ("servers") of one tier in this process (as
test_owners.py): a pending delivery and a delayed entry through a takeover, an old owner that
acknowledges nothing, and dead letters moved in one fenced batch, within one server and between
two (docs/postgres.md, "Takes with an acknowledgement deadline, delayed entries and dead letters").

Each backend has a fake clock of its own, all starting at the same time: a deadline passes at the
new owner when the test moves its clock.
"""

from __future__ import annotations

import signal
import threading
import time
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest

import outrig
from outrig.service.backends.postgres.backend import PostgresBackend
from outrig.service.engine.model import Delivery
from outrig.service.exceptions import DeliveryExpiredError, NotOwnerError

from ..conformance.test_backend_conformance import entry, ids, template
from ..conftest import start_server
from ..polling import wait_until, wait_until_async
from ..postgres_server import PostgresServer
from .test_owners import owner_is, peek, silence, tier

ACK = 30.0


@pytest.fixture
async def database(postgres: PostgresServer) -> str:
    return postgres.dsn(postgres.new_database("d"))


async def rows(dsn: str, sql: str, *parameters: Any) -> list[tuple[Any, ...]]:
    async with await psycopg.AsyncConnection.connect(dsn) as connection:
        cursor = await connection.execute(sql, parameters)
        return list(await cursor.fetchall())


async def deliver(
    backend: PostgresBackend, space: str, most: int = 1, *, max_deliveries: int = 0
) -> list[Delivery]:
    return await backend.deliver(
        space, [template()], max_entries=most, timeout=0, ack=ACK, max_deliveries=max_deliveries
    )


def clock_of(backend: PostgresBackend) -> Any:
    return backend.clock  # a FakeClock (test_owners.server)


async def test_a_pending_delivery_survives_a_takeover(database: str) -> None:
    async with tier(database, 2) as (a, b):
        written = [g.id for g in await a.write("s", [entry(n=i) for i in range(3)], 600.0)]
        first, second = await deliver(a, "s", 2)
        assert [first.entry.id, second.entry.id] == written[:2]
        assert (first.deliveries, second.deliveries) == (1, 1)
        (row,) = await rows(
            database, "SELECT receipt, deliveries, hidden_until FROM outrig_entries WHERE id = %s", written[0]
        )
        assert row == (first.receipt, 1, first.deadline)  # committed before deliver answered
        silence(a)
        await wait_until_async(lambda: owner_is(b, "s", "server-1:7480"), what="b's takeover")
        # At the new owner the two are still pending: invisible, and the old receipts settle them.
        assert await peek(b, "s") == written[2:]
        await b.ack("s", first.receipt)
        with pytest.raises(DeliveryExpiredError):
            await b.ack("s", first.receipt)  # acknowledged once: gone for good
        assert await rows(database, "SELECT id FROM outrig_entries WHERE id = %s", written[0]) == []
        # The deadline passes at the new owner: the second is visible again in its place, counted.
        clock_of(b).advance(ACK + 1)
        await wait_until_async(lambda: _peeked(b, "s", written[1:]), what="the redelivery")
        again = await deliver(b, "s")
        assert [(d.entry.id, d.deliveries) for d in again] == [(written[1], 2)]
        assert again[0].receipt != second.receipt
        with pytest.raises(DeliveryExpiredError):
            await b.ack("s", second.receipt)  # the first delivery's receipt settles nothing now
        await b.ack("s", again[0].receipt)


async def _peeked(backend: PostgresBackend, space: str, expected: list[int]) -> bool:
    return await peek(backend, space) == expected


async def test_a_pending_delivery_moves_with_its_space(database: str) -> None:
    async with tier(database, 2) as (a, b):
        (grant,) = await a.write("s", [entry(n=1)], 600.0)
        (delivery,) = await deliver(a, "s")
        assert await a.move("s", "server-1:7480") == "server-1:7480"
        with pytest.raises(NotOwnerError):
            await a.ack("s", delivery.receipt)  # moved: refused here, naming b
        assert await b.extend("s", delivery.receipt, 60.0) == clock_of(b).time() + 60.0
        await b.ack("s", delivery.receipt)
        assert await rows(database, "SELECT id FROM outrig_entries WHERE id = %s", grant.id) == []


async def test_a_nack_with_a_delay_and_a_delayed_write_survive_a_takeover(database: str) -> None:
    async with tier(database, 2) as (a, b):
        now = clock_of(a).time()
        (delayed,) = await a.write("s", [entry(n=1)], 600.0, visible_at=now + 60)
        (returned,) = [g.id for g in await a.write("s", [entry(n=2)], 600.0)]
        (delivery,) = await deliver(a, "s")
        assert delivery.entry.id == returned
        outcome = await a.nack("s", delivery.receipt, 120.0)
        assert outcome.visible_at == now + 120 and not outcome.dead_letter
        assert await peek(a, "s") == []
        silence(a)
        await wait_until_async(lambda: owner_is(b, "s", "server-1:7480"), what="b's takeover")
        assert await peek(b, "s") == []  # both still hidden at the new owner
        clock_of(b).advance(61)
        await wait_until_async(lambda: _peeked(b, "s", [delayed.id]), what="the delayed entry")
        clock_of(b).advance(60)
        await wait_until_async(lambda: _peeked(b, "s", [delayed.id, returned]), what="the nacked entry")
        (later,) = await deliver(b, "s", max_deliveries=0)
        assert (later.entry.id, later.deliveries) == (delayed.id, 1)


async def test_an_old_owner_acknowledges_nothing(database: str) -> None:
    """An owner that lost the space (whose own clock wrongly says it still owns it: the fence's
    case) cannot ack, nack or extend: NOT_OWNER, and the delivery is still pending at the new owner."""
    async with tier(database, 2) as (a, b):
        (grant,) = await a.write("s", [entry(n=1)], 600.0)
        (delivery,) = await deliver(a, "s")
        silence(a)
        await wait_until_async(lambda: owner_is(b, "s", "server-1:7480"), what="b's takeover")
        a.owners._trust(["s"], time.monotonic())  # a believes it still owns "s"
        with pytest.raises(NotOwnerError):
            await a.ack("s", delivery.receipt)
        with pytest.raises(NotOwnerError):  # dropped when the fence refused the ack
            await a.nack("s", delivery.receipt, 0.0)
        assert await rows(database, "SELECT receipt FROM outrig_entries WHERE id = %s", grant.id) == [
            (delivery.receipt,)
        ]
        assert await b.extend("s", delivery.receipt, 5.0) == clock_of(b).time() + 5.0
        await b.ack("s", delivery.receipt)
        assert await peek(b, "s") == []


async def test_retries_with_request_ids_get_the_first_answers_at_the_new_owner(database: str) -> None:
    """A client whose ack, nack or deliver was answered by an owner that then died retries it,
    with the same request id, at the next owner: it gets the first answer, never
    DeliveryExpiredError for its own ack, and nothing is delivered twice."""
    async with tier(database, 2) as (a, b):
        written = [g.id for g in await a.write("s", [entry(n=i) for i in range(3)], 600.0)]
        taken = await a.deliver("s", [template()], max_entries=3, timeout=0, ack=ACK, request_id="d-1")
        acked, nacked, extended = taken
        await a.ack("s", acked.receipt, request_id="a-1")
        returned = await a.nack("s", nacked.receipt, 300.0, request_id="n-1")
        deadline = await a.extend("s", extended.receipt, 100.0, request_id="e-1")
        silence(a)
        await wait_until_async(lambda: owner_is(b, "s", "server-1:7480"), what="b's takeover")
        await b.ack("s", acked.receipt, request_id="a-1")  # answered, not DeliveryExpiredError
        assert await b.nack("s", nacked.receipt, 300.0, request_id="n-1") == returned
        assert await b.extend("s", extended.receipt, 100.0, request_id="e-1") == deadline
        # The deliver's retry answers its deliveries still pending (the extended one), taking nothing.
        again = await b.deliver("s", [template()], max_entries=3, timeout=0, ack=ACK, request_id="d-1")
        assert [(d.entry.id, d.receipt) for d in again] == [(written[2], extended.receipt)]
        assert await peek(b, "s") == []
        with pytest.raises(DeliveryExpiredError):
            await b.ack("s", acked.receipt)  # without its request id: a second ack, refused


async def dead_entries(backend: PostgresBackend, space: str) -> list[Delivery]:
    return await deliver(backend, space, 100)


async def test_dead_letters_move_in_one_batch_and_the_dead_space_joins_its_source(database: str) -> None:
    async with tier(database, 1) as (a,):
        written = [g.id for g in await a.write("jobs", [entry(n=i) for i in range(2)], 600.0)]
        (first,) = await deliver(a, "jobs", max_deliveries=1)
        returned = await a.nack("jobs", first.receipt, 0.0)
        assert returned.dead_letter == "jobs.dead"
        # Nobody served "jobs.dead": the entry waited in outrig_dead_letters (written with the
        # delete of its row), and this server claimed the dead space, whose load took it in.
        await wait_until_async(
            lambda: owner_is(a, "jobs.dead", "server-0:7480"), what="the dead space's claim"
        )
        await wait_until_async(
            lambda: _counted(database, "SELECT count(*) FROM outrig_dead_letters", 0), what="the take-in"
        )
        (second,) = await deliver(a, "jobs", max_deliveries=1)
        assert second.entry.id == written[1]
        await a.nack("jobs", second.receipt, 0.0)  # served here now: straight in, one change of both
        assert await rows(database, "SELECT count(*) FROM outrig_dead_letters") == [(0,)]
        assert await rows(database, "SELECT id FROM outrig_entries WHERE space = 'jobs'") == []
        dead = await rows(
            database,
            "SELECT deliveries, dead_letter_reason FROM outrig_entries WHERE space = 'jobs.dead' ORDER BY id",
        )
        reason = "max_deliveries=1 reached in space 'jobs'"
        assert dead == [(1, reason), (1, reason)]
        got = await dead_entries(a, "jobs.dead")
        assert [(d.deliveries, d.dead_letter_reason) for d in got] == [(2, reason), (2, reason)]


async def _count(dsn: str, sql: str) -> int:
    ((found,),) = await rows(dsn, sql)
    return int(found)


async def _counted(dsn: str, sql: str, expected: int) -> bool:
    return await _count(dsn, sql) == expected


async def test_a_deadline_that_passes_dead_letters_too(database: str) -> None:
    async with tier(database, 1) as (a,):
        await a.write("jobs.dead", [entry(n=0)], 600.0)  # served here before the letter comes
        (grant,) = await a.write("jobs", [entry(n=1)], 600.0)
        await deliver(a, "jobs", max_deliveries=1)
        clock_of(a).advance(ACK + 1)  # the worker died: the reaper ends the delivery
        await wait_until_async(
            lambda: _counted(database, "SELECT count(*) FROM outrig_entries WHERE space = 'jobs.dead'", 2),
            what="the dead letter's commit",
        )
        assert (
            await rows(database, "SELECT id FROM outrig_entries WHERE space = 'jobs' AND id = %s", grant.id)
            == []
        )
        assert await peek(a, "jobs") == []
        assert len(await peek(a, "jobs.dead")) == 2


async def test_dead_letters_reach_a_dead_space_another_server_owns_exactly_once(database: str) -> None:
    async with tier(database, 3) as (a, b, c):
        (marker,) = await b.write("jobs.dead", [entry(n=0)], 600.0)  # b owns the dead space
        written = [g.id for g in await a.write("jobs", [entry(n=i) for i in range(1, 4)], 600.0)]
        deliveries = await deliver(a, "jobs", 3, max_deliveries=1)
        assert [d.entry.id for d in deliveries] == written
        await a.nack("jobs", deliveries[0].receipt, 0.0)
        # Through outrig_dead_letters: b takes it in at its next look.
        await wait_until_async(lambda: _dead_count(b, 2), what="b taking the first letter in")
        # b goes silent before it can take the next two in: they wait in the database, and the
        # server that claims "jobs.dead" next takes them in, once each.
        silence(b)
        await a.nack("jobs", deliveries[1].receipt, 0.0)
        await a.nack("jobs", deliveries[2].receipt, 0.0)
        assert await _count(database, "SELECT count(*) FROM outrig_entries WHERE space = 'jobs'") == 0

        async def taken_over() -> bool:
            return any([await owner_is(s, "jobs.dead", s.owners.address) for s in (a, c)])

        await wait_until_async(taken_over, what="a takeover of the dead space")
        owner = a if "jobs.dead" in a._spaces else c
        await wait_until_async(lambda: _dead_count(owner, 4), what="the waiting letters taken in")
        await wait_until_async(
            lambda: _counted(database, "SELECT count(*) FROM outrig_dead_letters", 0), what="their commit"
        )
        found = await peek(owner, "jobs.dead")
        assert marker.id in found and len(found) == len(set(found)) == 4
        assert await _count(database, "SELECT count(*) FROM outrig_entries WHERE space = 'jobs.dead'") == 4


async def test_a_dead_letter_whose_lease_runs_out_on_the_way_is_gone(database: str) -> None:
    async with tier(database, 2) as (a, b):
        await b.write("jobs.dead", [entry(n=0)], 600.0)  # b owns the dead space, then goes silent
        silence(b)
        await a.write("jobs", [entry(n=1)], 60.0)
        (delivery,) = await deliver(a, "jobs", max_deliveries=1)
        await a.nack("jobs", delivery.receipt, 0.0)
        assert await _count(database, "SELECT count(*) FROM outrig_dead_letters") == 1
        clock_of(a).advance(120)  # past the letter's lease when a claims the dead space
        await wait_until_async(lambda: owner_is(a, "jobs.dead", "server-0:7480"), what="a's claim")
        # Deleted by the load, which follows the claim.
        await wait_until_async(
            lambda: _counted(database, "SELECT count(*) FROM outrig_dead_letters", 0), what="the load"
        )
        assert len(await peek(a, "jobs.dead")) == 1  # b's entry alone


async def _dead_count(backend: PostgresBackend, count: int) -> bool:
    try:
        return len(await peek(backend, "jobs.dead")) == count
    except NotOwnerError:
        return False


async def test_the_entry_is_in_exactly_one_space_when_the_source_is_lost(database: str) -> None:
    """A dead letter put straight into a dead space served here is one change of both spaces:
    refused whole when the source was lost meanwhile (nothing in the dead space, the delivery
    still pending at the source's new owner)."""
    async with tier(database, 2) as (a, b):
        await a.write("jobs.dead", [entry(n=0)], 600.0)
        (grant,) = await a.write("jobs", [entry(n=1)], 600.0)
        (delivery,) = await deliver(a, "jobs", max_deliveries=1)
        # b claims "jobs" behind a's back (a silent, its lease forced to an end in the database).
        silence(a)
        await _force_takeover(database, b, "jobs")
        a.owners._trust(["jobs", "jobs.dead"], time.monotonic())
        with pytest.raises(NotOwnerError):
            await a.nack("jobs", delivery.receipt, 0.0)
        assert await _count(database, "SELECT count(*) FROM outrig_entries WHERE space = 'jobs.dead'") == 1
        assert (
            ids(await b.match("jobs", [template()], take=False, max_entries=5, timeout=0, if_exists=False))
            == []
        )
        await b.ack("jobs", delivery.receipt)  # still pending at b under its receipt
        assert (
            await rows(database, "SELECT id FROM outrig_entries WHERE space = 'jobs' AND id = %s", grant.id)
            == []
        )


async def _force_takeover(dsn: str, claimer: PostgresBackend, space: str) -> None:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as connection:
        await connection.execute(
            "UPDATE outrig_spaces SET owner_expires_at = now() - interval '1 second' WHERE space = %s",
            (space,),
        )
    await claimer.count(space, [template()])  # its first call claims and loads it


# ---------------------------------------------------------------------- real server processes


@dataclass
class Job(outrig.Entry, type_name="pg.AckJob"):
    n: int | None = None


def test_deliveries_pending_on_a_killed_owner_are_settled_at_the_next(postgres: PostgresServer) -> None:
    """Three `outrig serve --backend postgres` processes; the owner of the space is SIGKILLed with
    two deliveries pending and a delayed entry. Through the SDK (which follows the new owner) one
    delivery is acked under its receipt, the other nacked and delivered again with its count, and
    the delayed entry turns up at its time; nothing is lost or delivered twice at once."""
    database = postgres.dsn(postgres.new_database("k"))
    servers = [
        start_server("--backend", "postgres", "--dsn", database, "--owner-lease", "1.0") for _ in range(3)
    ]
    try:
        with outrig.connect(servers[0].address, space="acks", retry_deadline=0) as claim:
            claim.write_many([Job(n=1), Job(n=2)])
            owner_address = claim.locate().address
        owner = next(server for server in servers if server.address == owner_address)
        via = next(server for server in servers if server is not owner)
        with outrig.connect(via.address, space="acks", retry_deadline=60) as space:
            first = space.take(Job(), timeout=0, ack=120.0)
            second = space.take(Job(), timeout=0, ack=120.0)
            assert first is not None and second is not None
            assert (first.entry, second.entry, first.deliveries) == (Job(n=1), Job(n=2), 1)
            space.write(Job(n=3), delay=4.0)
            owner.stop(signal.SIGKILL)
            first.ack()  # at the new owner, once it has loaded the space
            assert space.take_nowait(Job()) is None  # n=2 is still pending, n=3 delayed
            second.nack(delay=0.0)
            again = space.take(Job(n=2), timeout=10.0, ack=120.0)
            assert again is not None and again.deliveries == 2
            again.ack()
            with pytest.raises(outrig.DeliveryExpiredError):
                second.ack()
            late = space.take(Job(), timeout=30.0)
            assert late == Job(n=3)
            assert space.take_nowait(Job()) is None
    finally:
        for server in servers:
            server.stop()


def test_workers_ack_every_job_once_through_a_killed_owner(postgres: PostgresServer) -> None:
    """Worker threads take jobs with an ack deadline and ack them, through two servers that are
    not the owner, while the owner is SIGKILLed: every job is acked, and acked once (a second
    successful ack of one job would mean an entry delivered twice at once, or an ack undone);
    no worker saw DeliveryExpiredError for its own ack (retried with its request id)."""
    database = postgres.dsn(postgres.new_database("w"))
    servers = [
        start_server("--backend", "postgres", "--dsn", database, "--owner-lease", "1.0") for _ in range(3)
    ]
    jobs = 120
    try:
        with outrig.connect(servers[0].address, space="work", retry_deadline=0) as claim:
            claim.write_many([Job(n=i) for i in range(jobs)])
            owner_address = claim.locate().address
        owner = next(server for server in servers if server.address == owner_address)
        others = [server for server in servers if server is not owner]
        acked: list[int] = []
        expired: list[int] = []
        lock = threading.Lock()

        def worker(address: str) -> None:
            with outrig.connect(address, space="work", retry_deadline=60) as space:
                while (delivery := space.take(Job(), timeout=3.0, ack=60.0)) is not None:
                    assert isinstance(delivery.entry, Job) and delivery.entry.n is not None
                    try:
                        delivery.ack()
                    except outrig.DeliveryExpiredError:
                        with lock:
                            expired.append(delivery.entry.n)
                        continue
                    with lock:
                        acked.append(delivery.entry.n)

        threads = [threading.Thread(target=worker, args=(others[i % 2].address,)) for i in range(4)]
        for thread in threads:
            thread.start()
        wait_until(lambda: len(acked) >= jobs // 4, what="a quarter of the jobs acked")
        owner.stop(signal.SIGKILL)
        for thread in threads:
            thread.join(120)
        assert not any(thread.is_alive() for thread in threads)
        assert expired == []
        assert sorted(acked) == list(range(jobs))  # each once
        with outrig.connect(others[0].address, space="work", retry_deadline=30) as space:
            assert space.take_nowait(Job()) is None
    finally:
        for server in servers:
            server.stop()
