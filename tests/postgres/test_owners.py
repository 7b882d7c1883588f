"""The owner backend against a real PostgreSQL, several backends ("servers") of one tier in this
process: one owner per space, claims, hand-over at a clean stop, takeover of a silent owner,
fencing, idempotency and registrations across owners, and a database that is not there.

(A call on a space another server owns is refused here with NotOwnerError: forwarding it is the
transport's work, tested with real server processes in tests/postgres/test_servers.py.)
"""

from __future__ import annotations

import asyncio
import functools
import random
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import psycopg
import pytest

from outrig.service.backends.postgres.backend import PostgresBackend
from outrig.service.backends.postgres.schema import MIGRATIONS
from outrig.service.config import ServerConfig
from outrig.service.engine import FakeClock
from outrig.service.engine.model import LeaseGrant, StoredEntry
from outrig.service.exceptions import (
    NotOwnerError,
    StoreError,
    TransactionAbortedError,
    TransactionNotFoundError,
)
from outrig.service.protocol import codec

from ..conformance.test_backend_conformance import entry, ids, template
from ..polling import wait_until_async
from ..postgres_server import PostgresServer

LEASE = 1.5
CONFIG = ServerConfig(reap_interval=0.05, owner_lease=LEASE)


@pytest.fixture
async def database(postgres: PostgresServer) -> str:
    return postgres.dsn(postgres.new_database("o"))


def server(dsn: str, number: int) -> PostgresBackend:
    backend = PostgresBackend(CONFIG, dsn, FakeClock())
    backend.serving_at(f"server-{number}:7480")
    return backend


@asynccontextmanager
async def tier(dsn: str, count: int) -> AsyncIterator[list[PostgresBackend]]:
    started = [server(dsn, i) for i in range(count)]
    for backend in started:
        await backend.start()
    try:
        yield started
    finally:
        for backend in started:
            await backend.close()
            await backend.shutdown()


async def owner_is(backend: PostgresBackend, space: str, address: str) -> bool:
    placements = {p.space: p for p in await backend.placements()}
    found = placements.get(space)
    return found is not None and found.address == address and found.expires_in is not None


async def peek(backend: PostgresBackend, space: str, most: int = 1000) -> list[int]:
    found = await backend.match(space, [template()], take=False, max_entries=most, timeout=0, if_exists=False)
    return ids(found)


def silence(backend: PostgresBackend) -> None:
    """Stop the backend renewing its ownership, as a paused or cut-off server stops: it does not
    release anything, it just goes quiet."""
    assert backend._tending is not None
    backend._tending.cancel()


async def test_a_space_has_one_owner_and_the_others_are_told_where(database: str) -> None:
    async with tier(database, 2) as (a, b):
        (grant,) = await a.write("s", [entry(n=1)], 600.0)
        with pytest.raises(NotOwnerError) as refused:
            await b.write("s", [entry(n=2)], 600.0)
        assert refused.value.owner == "server-0:7480"
        assert await a.locate("s") is None
        assert await b.locate("s") == "server-0:7480"
        (placement,) = await b.placements()
        assert (placement.space, placement.address, placement.epoch, placement.here) == (
            "s",
            "server-0:7480",
            1,
            False,
        )
        assert (await a.placements())[0].here
        assert ids(
            await a.match("s", [template()], take=False, max_entries=5, timeout=0, if_exists=False)
        ) == [grant.id]


async def test_concurrent_first_calls_from_several_servers_make_one_owner(database: str) -> None:
    async with tier(database, 3) as backends:
        results = await asyncio.gather(
            *(backend.write("fresh", [entry(n=i)], 600.0) for i, backend in enumerate(backends)),
            return_exceptions=True,
        )
        won = [r for r in results if not isinstance(r, BaseException)]
        lost = [r for r in results if isinstance(r, BaseException)]
        assert len(won) == 1 and all(isinstance(r, NotOwnerError) for r in lost)
        epochs = {p.epoch for backend in backends for p in await backend.placements()}
        assert epochs == {1}


async def test_a_stopped_owner_hands_its_spaces_over_and_nothing_is_lost(database: str) -> None:
    async with tier(database, 1) as (survivor,):
        doomed = server(database, 9)
        await doomed.start()
        written = await doomed.write("s", [entry(n=i) for i in range(100)], 600.0)
        first = await doomed.write("s", [entry(n=100)], 600.0, request_id="r-1")
        registration = await doomed.subscribe("s", [template()], 600.0)
        taken = await doomed.match(
            "s", [template()], take=True, max_entries=10, timeout=0, if_exists=False, request_id="t-1"
        )
        await doomed.close()
        await doomed.shutdown()  # a clean stop releases the space at once
        await wait_until_async(lambda: owner_is(survivor, "s", "server-0:7480"), what="the survivor's claim")
        left = await survivor.match(
            "s", [template()], take=False, max_entries=1000, timeout=0, if_exists=False
        )
        assert sorted(ids(left)) == sorted({g.id for g in written + first} - set(ids(taken)))
        # A retried write and a retried take get the first call's answers from the new owner.
        assert await survivor.write("s", [entry(n=100)], 600.0, request_id="r-1") == first
        retried = await survivor.match(
            "s", [template()], take=True, max_entries=10, timeout=0, if_exists=False, request_id="t-1"
        )
        assert ids(retried) == ids(taken)
        # The registration resumes at the new owner, its sequence numbers jumped (events may be missed).
        resumed = await survivor.subscribe("s", [], None, resume=registration.lease.id)
        (new,) = await survivor.write("s", [entry(n=7)], 60.0)
        async with asyncio.timeout(10):
            event = await anext(aiter(resumed))
        assert event.entry.id == new.id and event.sequence > 2**31
        assert new.id > max(g.id for g in written + first)  # ids go on above the old owner's


async def test_a_silent_owner_is_taken_over_and_can_no_longer_serve(database: str) -> None:
    async with tier(database, 2) as (a, b):
        written = await a.write("s", [entry(n=i) for i in range(20)], 600.0)
        silence(a)
        await wait_until_async(lambda: owner_is(b, "s", "server-1:7480"), what="b's takeover")
        # a can no longer prove it owns the space: it refuses reads as well as changes.
        with pytest.raises(NotOwnerError):
            await a.match("s", [template()], take=False, max_entries=1, timeout=0, if_exists=False)
        got = await b.match("s", [template()], take=True, max_entries=100, timeout=0, if_exists=False)
        assert sorted(ids(got)) == sorted(g.id for g in written)


async def test_a_late_owner_is_fenced_by_the_database(database: str) -> None:
    """Even an owner whose own clock wrongly says it still owns the space (the fence's case: a
    paused process, a clock that jumped) acknowledges nothing once another has claimed it."""
    async with tier(database, 2) as (a, b):
        acknowledged = await a.write("s", [entry(n=i) for i in range(10)], 600.0)
        silence(a)
        await wait_until_async(lambda: owner_is(b, "s", "server-1:7480"), what="b's takeover")
        a.owners._trust(["s"], time.monotonic())  # a believes it still owns "s"
        with pytest.raises(NotOwnerError):
            await a.write("s", [entry(n=99)], 600.0)
        with pytest.raises(NotOwnerError):  # a dropped the space when the fence refused it
            await a.match("s", [template()], take=True, max_entries=1, timeout=0, if_exists=False)
        figures = a.tier_figures()
        assert figures.dropped == {"fenced": 1} and figures.owned == 0 and figures.claims == 1
        got = await b.match("s", [template()], take=True, max_entries=100, timeout=0, if_exists=False)
        assert sorted(ids(got)) == sorted(g.id for g in acknowledged)  # all of a's, none refused


async def test_takes_through_a_takeover_return_each_entry_once(database: str) -> None:
    async with tier(database, 2) as (a, b):
        written = {g.id for g in await a.write("s", [entry(n=i) for i in range(300)], 600.0)}
        taken: list[int] = []

        async def taker() -> None:
            while True:
                for backend in (a, b):
                    try:
                        found = await backend.match(
                            "s", [template()], take=True, max_entries=3, timeout=0, if_exists=False
                        )
                    except NotOwnerError:
                        await asyncio.sleep(0.01)
                        continue
                    if not found and backend is b:
                        return
                    taken.extend(ids(found))

        takers = [asyncio.create_task(taker()) for _ in range(4)]
        await wait_until_async(lambda: len(taken) > 30, what="some takes at a")
        silence(a)
        async with asyncio.timeout(30):
            await asyncio.gather(*takers)
        assert Counter(taken).most_common(1)[0][1] == 1
        assert set(taken) == written


async def test_an_unreachable_database_at_start_is_named_without_its_password(
    postgres: PostgresServer,
) -> None:
    with socket_closed() as port:
        dsn = f"postgresql://outrig:sekrit@127.0.0.1:{port}/nothing"
        backend = PostgresBackend(CONFIG, dsn, FakeClock())
        with pytest.raises(StoreError) as refused:
            await backend.start()
    assert f"127.0.0.1:{port}/nothing" in str(refused.value)
    assert "sekrit" not in str(refused.value)


async def test_a_version_1_database_keeps_its_committed_entries(postgres: PostgresServer) -> None:
    dsn = postgres.dsn(postgres.new_database("v1"))
    kept = codec.entry_bytes(entry(n=1).payload)
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as connection:
        await connection.execute(
            "CREATE TABLE outrig_schema (version integer PRIMARY KEY, applied_at timestamptz NOT NULL "
            "DEFAULT now())"
        )
        await connection.execute(MIGRATIONS[0][1])
        await connection.execute("INSERT INTO outrig_schema (version) VALUES (1)")
        await connection.execute("SELECT setval('outrig_ids', 40)")
        row = "INSERT INTO outrig_entries (space, id, arrival, lineage, fields, payload, size{}) VALUES "
        await connection.execute(row.format("") + "('old', 7, 7, ARRAY['Thing'], '{}', %s, 10)", (kept,))
        await connection.execute(  # a transaction's uncommitted write: it aborted
            row.format(", written_by") + "('old', 8, 8, ARRAY['Thing'], '{}', %s, 10, 30)", (kept,)
        )
    async with tier(dsn, 1) as (backend,):
        found = await backend.match(
            "old", [template()], take=False, max_entries=10, timeout=0, if_exists=False
        )
        assert ids(found) == [7]
        (grant,) = await backend.write("old", [entry(n=2)], 60.0)
        assert grant.id > 40  # above every id the old layout handed out


def socket_closed() -> _PortGuard:
    return _PortGuard()


class _PortGuard:
    """A loopback port nothing listens on (bound, not listening, for the test's duration)."""

    def __enter__(self) -> int:
        import socket

        self._socket = socket.socket()
        self._socket.bind(("127.0.0.1", 0))
        return int(self._socket.getsockname()[1])

    def __exit__(self, *exc: object) -> None:
        self._socket.close()


async def numbers(backend: PostgresBackend, space: str) -> list[int]:
    """The n of every entry others can read in `space`, sorted."""
    found = await backend.match(space, [template()], take=False, max_entries=1000, timeout=0, if_exists=False)
    return sorted(n_of(stored) for stored in found)


def n_of(stored: StoredEntry) -> int:
    data = stored.fields["n"].data
    assert isinstance(data, int)
    return data


async def test_an_open_transaction_is_rebuilt_by_the_new_owner(database: str) -> None:
    """A silent owner (as a killed one) had a transaction open: the server that claims the space
    rebuilds it from the database, holding what it held (a take, a write, a read lock, its lease),
    answers its retried calls from what was recorded, and commits exactly that."""
    async with tier(database, 2) as (a, b):
        await a.write("s", [entry(n=1), entry(n=3), entry(n=4)], 600.0)
        txn = await a.begin("s", 60.0)
        written = await a.write("s", [entry(n=2)], 600.0, transaction=txn.id, request_id="w-1")
        taken = await a.match(
            "s", [template(n=1)], take=True, max_entries=1, timeout=0, if_exists=False,
            request_id="t-1", transaction=txn.id,
        )  # fmt: skip
        assert len(taken) == 1
        read = await a.match(
            "s", [template(n=3)], take=False, max_entries=1, timeout=0, if_exists=False, transaction=txn.id
        )
        assert len(read) == 1
        listed = [chunk async for chunk in a.contents("s", [template(n=4)], 0, transaction=txn.id)]
        assert len(listed) == 1  # contents read-locks what it lists
        await a.write("s", [entry(n=7)], 600.0, transaction=txn.id)
        took_back = await a.match(
            "s", [template(n=7)], take=True, max_entries=1, timeout=0, if_exists=False,
            request_id="t-2", transaction=txn.id,
        )  # fmt: skip
        assert len(took_back) == 1  # its own write, taken back: as if never written
        (renewed,) = await a.renew("s", [(txn.id, 900.0)])
        assert isinstance(renewed, LeaseGrant)
        silence(a)
        await wait_until_async(lambda: owner_is(b, "s", "server-1:7480"), what="b's takeover")
        # Others see what they saw at a: the take and the write are the transaction's; the read
        # entry can be read but not taken.
        assert await numbers(b, "s") == [3, 4]
        assert await b.match("s", [template()], take=True, max_entries=5, timeout=0, if_exists=False) == []
        # The transaction's lease is the renewed one, and its retried calls are answered, not redone.
        assert b.engine("s").lease_expiry(txn.id) == renewed.expires_at
        assert await b.write("s", [entry(n=2)], 600.0, transaction=txn.id, request_id="w-1") == written
        retried = await b.match(
            "s", [template(n=1)], take=True, max_entries=1, timeout=0, if_exists=False,
            request_id="t-1", transaction=txn.id,
        )  # fmt: skip
        assert ids(retried) == ids(taken)
        retried = await b.match(
            "s", [template(n=7)], take=True, max_entries=1, timeout=0, if_exists=False,
            request_id="t-2", transaction=txn.id,
        )  # fmt: skip
        assert ids(retried) == ids(took_back)
        mine = await b.match(
            "s", [template()], take=False, max_entries=5, timeout=0, if_exists=False, transaction=txn.id
        )
        assert sorted(map(n_of, mine)) == [2, 3, 4]
        await b.commit("s", txn.id)
        assert await numbers(b, "s") == [2, 3, 4]
        got = await b.match("s", [template()], take=True, max_entries=5, timeout=0, if_exists=False)
        assert sorted(map(n_of, got)) == [2, 3, 4]  # its read locks went with it


async def test_a_rebuilt_transaction_aborts_and_one_whose_lease_ran_out_is_gone(database: str) -> None:
    async with tier(database, 2) as (a, b):
        await a.write("s", [entry(n=1), entry(n=2)], 600.0)
        kept = await a.begin("s", 600.0)
        lapsing = await a.begin("s", 5.0)
        for txn, n in ((kept, 1), (lapsing, 2)):
            await a.match(
                "s", [template(n=n)], take=True, max_entries=1, timeout=0, if_exists=False, transaction=txn.id
            )
            await a.write("s", [entry(n=n * 10)], 600.0, transaction=txn.id)
        ended = await a.begin("s", 600.0)
        await a.commit("s", ended.id)
        assert isinstance(b.clock, FakeClock)
        b.clock.advance(10.0)  # by b's clock, `lapsing` ran out before b claims the space
        silence(a)
        await wait_until_async(lambda: owner_is(b, "s", "server-1:7480"), what="b's takeover")
        assert await numbers(b, "s") == [2]  # lapsing's take is undone, its write gone
        with pytest.raises(TransactionAbortedError, match="has aborted"):
            await b.commit("s", lapsing.id)
        await b.abort("s", lapsing.id)  # an abort of an aborted transaction is a retry: fine
        await b.commit("s", ended.id)  # a retry of a commit that happened is answered OK
        await b.abort("s", kept.id)
        assert await numbers(b, "s") == [1, 2]
    async with tier(database, 1) as (c,):  # and the database agrees
        assert await numbers(c, "s") == [1, 2]
        with pytest.raises(TransactionNotFoundError):
            await c.write("s", [entry(n=5)], 600.0, transaction=kept.id)


async def test_a_version_2_open_transaction_aborted_with_its_server(database: str) -> None:
    """A row of schema version 2 says only that a transaction was open: it lived in its owner's
    memory, so it aborted with it, and a late commit is told so."""
    async with tier(database, 1) as (a,):
        await a.write("s", [entry(n=1)], 600.0)
    async with await psycopg.AsyncConnection.connect(database, autocommit=True) as connection:
        await connection.execute("INSERT INTO outrig_open_transactions (space, id) VALUES ('s', 77)")
    async with tier(database, 1) as (b,):
        with pytest.raises(TransactionAbortedError, match="moved to another server"):
            await b.commit("s", 77)
        assert await numbers(b, "s") == [1]


async def test_what_the_database_holds_is_what_memory_held_after_concurrent_work(database: str) -> None:
    """Many calls at once keep two batches in flight (journal.IN_FLIGHT) whenever their rows
    differ; whatever order they commit in, the database ends as memory was: a new owner loads
    exactly the entries, leases and registrations the old one served."""
    rng = random.Random(19)
    first = server(database, 1)
    await first.start()
    registration = await first.subscribe("s", [template()], 600.0)

    async def worker(number: int) -> None:
        mine: list[int] = []
        for step in range(60):
            # Arrivals spread out, as a server's calls come (not in lockstep, all waiting on one
            # batch): some changes then arrive while a batch is in flight.
            await asyncio.sleep(rng.random() * 0.003)
            roll = rng.random()
            if roll < 0.45 or not mine:
                grants = await first.write(
                    "s", [entry(n=number * 1000 + step)], 600.0, request_id=f"w{number}-{step}"
                )
                mine.append(grants[0].id)
            elif roll < 0.75:
                await first.match(
                    "s", [template(n=number * 1000 + step - 1)], take=True, max_entries=1, timeout=0,
                    if_exists=False, request_id=f"t{number}-{step}",
                )  # fmt: skip
            elif roll < 0.9:
                await first.renew("s", [(rng.choice(mine), 900.0)])
            else:
                await first.cancel("s", [mine.pop(rng.randrange(len(mine)))])

    await asyncio.gather(*(worker(number) for number in range(12)))
    served = sorted(await peek(first, "s", 100_000))
    expiries = {stored.id: stored.expires_at for stored in await first.match(
        "s", [template()], take=False, max_entries=100_000, timeout=0, if_exists=False
    )}  # fmt: skip
    journal = first._pg_journal
    assert served and journal is not None and journal.batches > 1 and journal.overlapped > 0
    await first.close()
    await first.shutdown()
    async with tier(database, 1) as (second,):
        assert sorted(await peek(second, "s", 100_000)) == served
        loaded = await second.match(
            "s", [template()], take=False, max_entries=100_000, timeout=0, if_exists=False
        )
        assert {stored.id: stored.expires_at for stored in loaded} == expiries
        resumed = await second.subscribe("s", [], None, resume=registration.lease.id)
        resumed.close()


async def test_request_ids_past_their_window_leave_the_database(database: str) -> None:
    """A take's request id lives on the rows it took (taken_until), a write's in its own row; once
    the window has passed, the reaper's prune deletes both, and a retry acts afresh."""
    async with tier(database, 1) as (a,):
        await a.write("s", [entry(n=1), entry(n=2)], 600.0, request_id="w-1")
        taken = await a.match(
            "s", [template(n=1)], take=True, max_entries=1, timeout=0, if_exists=False, request_id="t-1"
        )
        assert len(taken) == 1
        async with await psycopg.AsyncConnection.connect(database, autocommit=True) as connection:

            async def marks() -> tuple[int, int]:
                cursor = await connection.execute(
                    "SELECT (SELECT count(*) FROM outrig_entries WHERE taken_by IS NOT NULL), "
                    "(SELECT count(*) FROM outrig_requests)"
                )
                row = await cursor.fetchone()
                assert row is not None
                return int(row[0]), int(row[1])

            assert await wait_until_async(lambda: marks_if(marks, (1, 1)), what="the marks recorded")
            assert isinstance(a.clock, FakeClock)
            a.clock.advance(CONFIG.request_window + 1)
            await wait_until_async(lambda: marks_if(marks, (0, 0)), what="the prune")
        retried = await a.match(
            "s", [template(n=1)], take=True, max_entries=1, timeout=0, if_exists=False, request_id="t-1"
        )
        assert retried == []  # acted afresh: the entry it took is gone
        assert await numbers(a, "s") == [2]


async def marks_if(marks: Callable[[], Awaitable[tuple[int, int]]], wanted: tuple[int, int]) -> bool:
    return await marks() == wanted


async def test_ended_transactions_are_answered_by_the_next_owner(database: str) -> None:
    """A commit or abort that an owner answered and then died is answered again by the next one
    (a retry gets OK; the other end, TRANSACTION_ABORTED), even when two spaces had a transaction
    of the same id (each space numbers its leases)."""
    async with tier(database, 2) as (a, b):
        committed = {space: await a.begin(space, 600.0) for space in ("s", "t")}
        assert committed["s"].id == committed["t"].id  # the same id in both spaces
        for space, txn in committed.items():
            await a.write(space, [entry(n=1)], 600.0, transaction=txn.id)
            await a.commit(space, txn.id)
        aborted = await a.begin("s", 600.0)
        await a.write("s", [entry(n=2)], 600.0, transaction=aborted.id)
        await a.abort("s", aborted.id)
        silence(a)
        for space in ("s", "t"):
            await wait_until_async(
                functools.partial(owner_is, b, space, "server-1:7480"), what="b's takeover"
            )
        await b.commit("s", committed["s"].id)  # retries: answered OK
        await b.commit("t", committed["t"].id)
        await b.abort("s", aborted.id)
        with pytest.raises(TransactionAbortedError, match="has committed"):
            await b.abort("s", committed["s"].id)
        with pytest.raises(TransactionAbortedError, match="has aborted"):
            await b.commit("s", aborted.id)
        assert await numbers(b, "s") == [1] and await numbers(b, "t") == [1]
