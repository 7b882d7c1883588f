"""The change log on the owner tier, against a real PostgreSQL, several backends ("servers") of
one tier in this process (as test_owners.py): the log, its epoch and its durable subscriptions
survive a restart and a takeover, so that a cursor taken at one owner resumes at the next with
exactly the changes after it; a write's payload comes back at the load from its entry's row or
from the later change that removed it; retention trims the rows in the database; a change the
fence refuses is not logged, and the old owner's feeds end; an entry that ran out of lease while
nobody served the space is logged as expired at the load; a space whose log is off keeps no rows.
(tests/postgres/test_changes_kill.py kills real server processes.)
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Any

import pytest

from outrig.service.backends.base import ChangeFeed
from outrig.service.backends.postgres.backend import PostgresBackend
from outrig.service.engine import FakeClock
from outrig.service.engine.changes import CHANGE_KINDS, Change
from outrig.service.engine.space import SpaceSettings
from outrig.service.exceptions import ChangesOffError, NotOwnerError

from ..conformance.test_backend_conformance import entry, template
from ..polling import wait_until_async
from ..postgres_server import PostgresServer
from .test_deliveries_tier import rows
from .test_owners import CONFIG, owner_is, silence, tier

ALL = frozenset(CHANGE_KINDS)


@pytest.fixture
async def database(postgres: PostgresServer) -> str:
    return postgres.dsn(postgres.new_database("c"))


def head(backend: PostgresBackend, space: str) -> int:
    log = backend.engine(space).changes
    assert log is not None
    return log.head


class Reader:
    """One iteration of a feed, and the position it has read through."""

    def __init__(self, feed: ChangeFeed) -> None:
        self.batches = aiter(feed)
        self.position = feed.start

    async def through(self, seq: int) -> list[Change]:
        """The changes it yields up to position `seq`."""
        got: list[Change] = []
        async with asyncio.timeout(10):
            while self.position < seq:
                batch = await anext(self.batches)
                got += batch.changes
                self.position = batch.position
        return got


async def read(feed: ChangeFeed, through: int) -> list[Change]:
    """The changes `feed` yields from its start up to position `through`."""
    return await Reader(feed).through(through)


def n(change: Change) -> Any:
    return change.entry.fields["n"].data


def summary(changes: list[Change]) -> list[tuple[int, str, int, bytes, int]]:
    return [(c.seq, c.kind, c.entry.id, _bytes(c.entry.payload), c.transaction) for c in changes]


def _bytes(payload: object) -> bytes:
    assert isinstance(payload, bytes | memoryview)
    return bytes(payload)


async def every_kind(backend: PostgresBackend, space: str) -> int:
    """A write, a take, a cancel, a purge, a transaction's commit (a write and a take), a write
    and take in one batch (whose entry's row never reaches the database), an expiry; the
    transaction's id."""
    written = await backend.write(space, [entry(n=i) for i in range(6)], 600.0)
    await backend.match(space, [template(n=0)], take=True, max_entries=1, timeout=0, if_exists=False)
    await backend.cancel(space, [written[1].id])
    await backend.purge(space, [template(n=2)], dry_run=False, max_entries=10)
    txn = await backend.begin(space, 60.0)
    await backend.write(space, [entry(n=10)], 600.0, transaction=txn.id)
    await backend.match(
        space, [template(n=3)], take=True, max_entries=1, timeout=0, if_exists=False, transaction=txn.id
    )
    await backend.commit(space, txn.id)
    await asyncio.gather(
        backend.write(space, [entry(n=20)], 600.0),
        backend.match(space, [template(n=20)], take=True, max_entries=1, timeout=5, if_exists=False),
    )
    await backend.write(space, [entry(n=30)], 1.0)
    clock = backend.clock
    assert isinstance(clock, FakeClock)
    clock.advance(2.0)
    expired = head(backend, space) + 1
    await wait_until_async(lambda: _reached(backend, space, expired), what="the expiry logged")
    return txn.id


async def _reached(backend: PostgresBackend, space: str, seq: int) -> bool:
    return head(backend, space) >= seq


async def test_the_log_survives_a_restart_with_its_epoch_and_durable_subscriptions(database: str) -> None:
    first = PostgresBackend(CONFIG, database, FakeClock())
    first.serving_at("server-0:7480")
    await first.start()
    feed = await first.changes("s", [], ALL, since=None)
    start = feed.start
    txn = await every_kind(first, "s")
    before = await read(feed, head(first, "s"))
    assert {c.kind for c in before} == set(CHANGE_KINDS) - {"dead"}
    assert [c.seq for c in before] == list(range(start + 1, start + len(before) + 1))
    assert sorted(c.kind for c in before if c.transaction == txn) == ["take", "write"]
    durable = await first.changes("s", [], ALL, since=(feed.epoch, start), durable="d")
    await first.ack_changes("s", "d", start + 3)
    durable.close()
    epoch = feed.epoch
    await first.close()
    await first.shutdown()
    async with tier(database, 1) as (again,):
        resumed = await again.changes("s", [], ALL, since=(epoch, start + 2))
        assert resumed.epoch == epoch
        reader = Reader(resumed)
        assert summary(await reader.through(head(again, "s"))) == summary(before[2:])
        attached = await again.changes("s", [], ALL, since=None, durable="d")
        assert attached.start == start + 3
        # New changes follow on, numbered after the old ones.
        await again.write("s", [entry(n=99)], 600.0)
        (latest,) = await reader.through(head(again, "s"))
        assert (latest.seq, latest.kind) == (before[-1].seq + 1, "write")


async def test_a_cursor_resumes_at_the_new_owner_with_exactly_the_changes_after_it(database: str) -> None:
    async with tier(database, 2) as (a, b):
        feed = await a.changes("s", [template()], ALL, since=None, durable="d")
        await a.write("s", [entry(n=i) for i in range(5)], 600.0)
        await a.match("s", [template()], take=True, max_entries=2, timeout=0, if_exists=False)
        seen = await read(feed, head(a, "s"))
        cursor = seen[3].seq  # the subscriber has handled four changes
        await a.ack_changes("s", "d", cursor)
        await a.write("s", [entry(n=5)], 600.0)  # after the cursor, before the takeover
        silence(a)
        await wait_until_async(lambda: owner_is(b, "s", "server-1:7480"), what="b's takeover")
        await b.write("s", [entry(n=6)], 600.0)
        resumed = await b.changes("s", [template()], ALL, since=(feed.epoch, cursor))
        after = await read(resumed, head(b, "s"))
        assert summary(after[:3]) == summary(seen[4:])  # the rest of what a had logged
        assert [(c.kind, n(c)) for c in after[3:]] == [("write", 5), ("write", 6)]
        assert [c.seq for c in after] == list(range(cursor + 1, cursor + 6))
        durable = await b.changes("s", [template()], ALL, since=None, durable="d")
        assert (durable.epoch, durable.start) == (feed.epoch, cursor)


async def test_retention_trims_the_rows_in_the_database(database: str) -> None:
    settings = SpaceSettings(changes_max_count=5)
    config = dataclasses.replace(CONFIG, spaces={"s": settings})
    backend = PostgresBackend(config, database, FakeClock())
    backend.serving_at("server-0:7480")
    await backend.start()
    try:
        for i in range(12):
            await backend.write("s", [entry(n=i)], 600.0)

        async def trimmed() -> bool:
            return await rows(database, "SELECT min(seq), max(seq) FROM outrig_changes") == [(8, 12)]

        await wait_until_async(trimmed, what="the reaper's trim in the database")
        log = backend.engine("s").changes
        assert log is not None and (log.oldest, log.head) == (8, 12)
    finally:
        await backend.close()
        await backend.shutdown()
    # Trimmed empty by age (nothing newer than max_age), the log keeps its head: no seq again.
    aged = dataclasses.replace(config, spaces={"s": dataclasses.replace(settings, changes_max_age=10.0)})
    clock = FakeClock()
    clock.advance(60.0)  # a minute after the changes (made at the same start)
    backend = PostgresBackend(aged, database, clock)
    backend.serving_at("server-0:7480")
    await backend.start()
    try:
        await backend.count("s", [template()])
        await wait_until_async(
            lambda: _rows_are(database, "SELECT count(*) FROM outrig_changes", [(0,)]),
            what="the age trim",
        )
        assert await rows(database, "SELECT change_head FROM outrig_spaces") == [(12,)]
    finally:
        await backend.close()
        await backend.shutdown()
    async with tier(database, 1) as (again,):
        await again.write("s", [entry(n=13)], 600.0)
        assert head(again, "s") == 13


async def _rows_are(dsn: str, sql: str, expected: list[tuple[Any, ...]]) -> bool:
    return await rows(dsn, sql) == expected


async def test_a_change_the_fence_refuses_is_not_logged(database: str) -> None:
    """An old owner that believes it still owns the space (the fence's case) writes: refused, its
    change is in no row, the new owner's log does not have it, and the old owner's feed ends."""
    async with tier(database, 2) as (a, b):
        await a.write("s", [entry(n=1)], 600.0)
        feed = await a.changes("s", [], ALL, since=None)
        reader = aiter(feed)
        silence(a)
        await wait_until_async(lambda: owner_is(b, "s", "server-1:7480"), what="b's takeover")
        a.owners._trust(["s"], time.monotonic())  # a believes it still owns "s"
        with pytest.raises(NotOwnerError):
            await a.write("s", [entry(n=2)], 600.0)
        with pytest.raises(NotOwnerError):
            async with asyncio.timeout(10):
                await anext(reader)
        assert await rows(database, "SELECT seq, kind FROM outrig_changes ORDER BY seq") == [(1, "write")]
        await b.write("s", [entry(n=3)], 600.0)
        resumed = await b.changes("s", [], ALL, since=(feed.epoch, 1))
        (change,) = await read(resumed, head(b, "s"))
        assert (change.seq, n(change)) == (2, 3)


async def test_an_entry_whose_lease_ran_out_meanwhile_is_logged_as_expired_at_the_load(database: str) -> None:
    async with tier(database, 2) as (a, b):
        (short,) = await a.write("s", [entry(n=1)], 30.0)
        await a.write("s", [entry(n=2)], 600.0)
        feed = await a.changes("s", [], ALL, since=None)
        written = head(a, "s")
        silence(a)
        clock = b.clock
        assert isinstance(clock, FakeClock)
        clock.advance(60.0)  # b's clock is past the short lease when it loads the space
        await wait_until_async(lambda: owner_is(b, "s", "server-1:7480"), what="b's takeover")
        resumed = await b.changes("s", [], ALL, since=(feed.epoch, written))
        (expired,) = await read(resumed, head(b, "s"))
        assert (expired.seq, expired.kind, expired.entry.id) == (3, "expire", short.id)
        assert n(expired) == 1


async def test_a_space_whose_log_is_off_keeps_no_rows(database: str) -> None:
    async with tier(database, 1) as (a,):
        await a.write("s", [entry(n=1)], 600.0)
        await a.changes("s", [], ALL, since=None, durable="d")
        assert len(await rows(database, "SELECT seq FROM outrig_changes")) == 1
    off = dataclasses.replace(CONFIG, spaces={"s": SpaceSettings(changes=False)})
    backend = PostgresBackend(off, database, FakeClock())
    backend.serving_at("server-0:7480")
    await backend.start()
    try:
        await backend.write("s", [entry(n=2)], 600.0)
        with pytest.raises(ChangesOffError):
            await backend.changes("s", [], ALL, since=None)
        assert await rows(database, "SELECT count(*) FROM outrig_changes") == [(0,)]
        assert await rows(database, "SELECT count(*) FROM outrig_change_subscriptions") == [(0,)]
        assert await rows(database, "SELECT change_epoch FROM outrig_spaces") == [(None,)]
    finally:
        await backend.close()
        await backend.shutdown()


async def test_a_moved_space_keeps_its_log_and_the_old_owners_feeds_end(database: str) -> None:
    async with tier(database, 2) as (a, b):
        feed = await a.changes("s", [], ALL, since=None)
        reader = Reader(feed)
        await a.write("s", [entry(n=i) for i in range(3)], 600.0)
        seen = await reader.through(head(a, "s"))
        assert await a.move("s", "server-1:7480") == "server-1:7480"
        with pytest.raises(NotOwnerError) as ended:
            await reader.through(reader.position + 1)
        assert ended.value.owner == "server-1:7480"  # the client is told where to resume
        await b.write("s", [entry(n=3)], 600.0)
        resumed = await b.changes("s", [], ALL, since=(feed.epoch, seen[0].seq))
        after = await read(resumed, head(b, "s"))
        assert summary(after[:2]) == summary(seen[1:])
        assert [(c.seq, n(c)) for c in after[2:]] == [(4, 3)]
