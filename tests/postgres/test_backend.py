"""The PostgreSQL backend against a real PostgreSQL, with several backends ("servers") sharing one
database: what works so far (issue 8 is in progress)."""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import psycopg
import pytest

from outrig.service.backends.postgres.backend import PostgresBackend
from outrig.service.config import ServerConfig
from outrig.service.engine import FakeClock
from outrig.service.exceptions import (
    LeaseNotFoundError,
    RegistrationBusyError,
    RequestConflictError,
    ShuttingDownError,
    TypeConflictError,
)

from ..conformance.test_backend_conformance import entry, ids, template
from ..polling import wait_for_waiters_async, wait_until_async
from ..postgres_server import PostgresServer

CONFIG = ServerConfig(reap_interval=0.05)


@pytest.fixture
async def database(postgres: PostgresServer) -> str:
    name = f"b_{uuid.uuid4().hex[:12]}"
    async with await psycopg.AsyncConnection.connect(postgres.dsn(), autocommit=True) as admin:
        await admin.execute(f"CREATE DATABASE {name}")
    return postgres.dsn(name)


@asynccontextmanager
async def servers(
    dsn: str, count: int, clock: FakeClock | None = None
) -> AsyncIterator[list[PostgresBackend]]:
    started = [PostgresBackend(CONFIG, dsn, clock or FakeClock()) for _ in range(count)]
    for backend in started:
        await backend.start()
    try:
        yield started
    finally:
        for backend in started:
            await backend.close()
            await backend.shutdown()


async def test_what_one_server_writes_another_reads_and_takes(database: str) -> None:
    async with servers(database, 2) as (first, second):
        grants = await first.write("s", [entry(n=1), entry(n=2)], 60.0)
        assert [g.granted for g in grants] == [60.0, 60.0]
        found = await second.match(
            "s", [template(n=2)], take=False, max_entries=1, timeout=0, if_exists=False
        )
        assert ids(found) == [grants[1].id]
        assert await second.count("s", [template()]) == 2
        taken = await second.match("s", [template()], take=True, max_entries=10, timeout=0, if_exists=False)
        assert ids(taken) == [g.id for g in grants]  # in arrival order
        assert await first.count("s", [template()]) == 0


async def test_a_write_through_one_server_wakes_a_take_blocked_on_another(database: str) -> None:
    async with servers(database, 2) as (first, second):
        blocked = asyncio.ensure_future(
            second.match("s", [template(n=7)], take=True, max_entries=1, timeout=30.0, if_exists=False)
        )
        await wait_for_waiters_async(second, "s", 1)  # parked on the second server
        assert not blocked.done()
        (grant,) = await first.write("s", [entry(n=7)], 60.0)
        assert ids(await asyncio.wait_for(blocked, 10)) == [grant.id]


async def test_concurrent_takes_through_many_servers_never_return_the_same_entry(database: str) -> None:
    async with servers(database, 3) as backends:
        written = await backends[0].write("s", [entry(n=i) for i in range(300)], 600.0)

        async def taker(backend: PostgresBackend) -> list[int]:
            got: list[int] = []
            while found := await backend.match(
                "s", [template()], take=True, max_entries=3, timeout=0, if_exists=False
            ):
                got += ids(found)
            return got

        results = await asyncio.gather(*(taker(backend) for backend in backends for _ in range(4)))
        taken = [entry_id for result in results for entry_id in result]
        assert Counter(taken).most_common(1)[0][1] == 1  # no entry twice
        assert sorted(taken) == sorted(g.id for g in written)  # and none left behind


async def test_supertype_templates_and_type_conflicts(database: str) -> None:
    async with servers(database, 1) as (backend,):
        (dog,) = await backend.write("s", [entry("Dog", "Animal", legs=4)], 60.0)
        found = await backend.match(
            "s", [template("Animal")], take=False, max_entries=1, timeout=0, if_exists=False
        )
        assert ids(found) == [dog.id]
        with pytest.raises(TypeConflictError, match="Dog"):
            await backend.write("s", [entry("Dog", "Plant")], 60.0)


async def test_large_values_stay_bytes_and_match_in_full(database: str) -> None:
    big = bytes(range(256)) * 16  # larger than the index key limit: keyed by a sample, compared in full
    other = big[:-1] + b"\x00"
    async with servers(database, 1) as (backend,):
        (kept,) = await backend.write("s", [entry(blob=big)], 60.0)
        await backend.write("s", [entry(blob=other)], 60.0)
        found = await backend.match(
            "s", [template(blob=big)], take=False, max_entries=5, timeout=0, if_exists=False
        )
        assert ids(found) == [kept.id]
        assert found[0].fields["blob"].data == big


async def test_leases_renew_cancel_and_expire(database: str) -> None:
    clock = FakeClock()
    async with servers(database, 1, clock) as (backend,):
        first, second = await backend.write("s", [entry(n=1), entry(n=2)], 10.0)
        (renewed,) = await backend.renew("s", [(first.id, 100.0)])
        assert isinstance(renewed, type(first)) and renewed.granted == 100.0
        cancelled, unknown = await backend.cancel("s", [second.id, 999_999])
        assert cancelled is None and isinstance(unknown, LeaseNotFoundError)
        clock.advance(50.0)
        assert await backend.count("s", [template()]) == 1  # the cancelled one is gone
        clock.advance(100.0)
        assert await backend.count("s", [template()]) == 0  # and the renewed one expired
        (missing,) = await backend.renew("s", [(first.id, 10.0)])
        assert isinstance(missing, LeaseNotFoundError)


async def test_a_registration_resumes_through_another_server_when_its_own_stops(database: str) -> None:
    async with servers(database, 1) as (survivor,):
        doomed = PostgresBackend(CONFIG, database, FakeClock())
        await doomed.start()
        first = await doomed.subscribe("s", [template()], 600.0)
        await doomed.close()  # stopping: the stream ends with UNAVAILABLE, the registration stays
        with pytest.raises(ShuttingDownError, match="resume registration"):
            [event async for event in first]
        await doomed.shutdown()
        resumed = await survivor.subscribe("s", [], None, resume=first.lease.id)
        with pytest.raises(RegistrationBusyError):
            await survivor.subscribe("s", [], None, resume=first.lease.id)
        (written,) = await survivor.write("s", [entry(n=1)], 60.0)
        async with asyncio.timeout(10):
            event = await anext(aiter(resumed))
        assert event.entry.id == written.id and event.sequence > 2**31  # the jump says: maybe missed
        resumed.close()  # closed by its listener: the registration ends (its row goes in the background)

        async def resumed_again() -> bool:
            (await survivor.subscribe("s", [], None, resume=first.lease.id)).close()
            return False  # still there: look again, until resuming raises

        with pytest.raises(LeaseNotFoundError):
            await wait_until_async(resumed_again, 5.0, what="the registration's row to go", interval=0.05)


async def test_an_entry_taken_at_once_still_reaches_a_subscription_on_another_server(database: str) -> None:
    async with servers(database, 2) as (first, second):
        subscription = await second.subscribe("s", [template()], 60.0)
        for n in range(20):  # written and taken through the first, before the second can fetch it
            await first.write("s", [entry(n=n)], 60.0)
            await first.match("s", [template(n=n)], take=True, max_entries=1, timeout=0, if_exists=False)
        events = []
        async with asyncio.timeout(10):
            async for event in subscription:
                events.append(event)
                if len(events) == 20:
                    break
        assert [e.sequence for e in events] == list(range(1, 21))
        subscription.close()


async def test_a_write_through_one_server_reaches_a_subscription_on_another(database: str) -> None:
    async with servers(database, 2) as (first, second):
        subscription = await second.subscribe("s", [template(n=1)], 60.0)
        written = await first.write("s", [entry(n=1), entry(n=2), entry(n=1)], 60.0)
        events = []
        async with asyncio.timeout(10):
            async for event in subscription:
                events.append(event)
                if len(events) == 2:
                    break
        assert [e.entry.id for e in events] == [written[0].id, written[2].id]
        assert [e.sequence for e in events] == [1, 2]
        subscription.close()


async def test_a_server_gone_mid_transaction_leaves_the_space_consistent(database: str) -> None:
    clock = FakeClock()
    async with servers(database, 1, clock) as (survivor,):
        (written,) = await survivor.write("s", [entry(n=1)], 600.0)
        doomed = PostgresBackend(CONFIG, database, clock)
        await doomed.start()
        txn = (await doomed.begin("s", 30.0)).id
        taken = await doomed.match(
            "s", [template()], take=True, max_entries=1, timeout=0, if_exists=False, transaction=txn
        )
        assert ids(taken) == [written.id]
        await doomed.write("s", [entry(n=2)], 600.0, transaction=txn)
        await doomed.close()  # the server is gone, its transaction still open
        await doomed.shutdown()
        assert await survivor.count("s", [template()]) == 0  # taken, and the write invisible
        clock.advance(31.0)  # its lease runs out: the survivor's reaper aborts it

        async def restored() -> bool:
            return await survivor.count("s", [template()]) == 1

        await wait_until_async(restored, what="the survivor's reaper to abort the transaction")
        found = await survivor.match("s", [template()], take=False, max_entries=5, timeout=0, if_exists=False)
        assert ids(found) == [written.id]  # the take undone, the write gone


async def test_request_ids_are_shared_by_all_servers(database: str) -> None:
    async with servers(database, 2) as (first, second):
        grants = await first.write("s", [entry(n=1)], 60.0, request_id="w-1")
        assert await second.write("s", [entry(n=1)], 60.0, request_id="w-1") == grants  # a retry elsewhere
        assert await first.count("s", [template()]) == 1
        taken = await first.match(
            "s", [template()], take=True, max_entries=1, timeout=0, if_exists=False, request_id="t-1"
        )
        again = await second.match(
            "s", [template()], take=True, max_entries=1, timeout=0, if_exists=False, request_id="t-1"
        )
        assert ids(again) == ids(taken) == [grants[0].id]
        assert again[0].payload == taken[0].payload
        with pytest.raises(RequestConflictError, match="w-1"):
            await second.match(
                "s", [template()], take=True, max_entries=1, timeout=0, if_exists=False, request_id="w-1"
            )
