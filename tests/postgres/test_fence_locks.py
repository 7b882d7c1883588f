"""The fence's locks on a real PostgreSQL, statement by statement: a batch that passed
`outrig_fence` holds a shared advisory lock per space until it commits, so a claim (which takes
the lock exclusively before it changes the space's row) waits for it, and every batch after the
claim fails the fence with SQLSTATE OR001. Batches do not wait for each other."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool

from outrig.service.backends.postgres.journal import FENCED
from outrig.service.backends.postgres.ownership import Ownership
from outrig.service.backends.postgres.schema import migrate

from ..polling import wait_until_async
from ..postgres_server import PostgresServer


@pytest.fixture
async def dsn(postgres: PostgresServer) -> str:
    dsn = postgres.dsn(postgres.new_database("f"))
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as connection:
        await migrate(connection)
        # "s" and "t" are a's, under epoch 1, and a's ownership has run out: b may claim them.
        await connection.execute(
            "INSERT INTO outrig_spaces (space, owner, epoch, owner_expires_at) VALUES "
            "('s', 'a', 1, now() - interval '1 second'), ('t', 'a', 1, now() - interval '1 second')"
        )
    return dsn


async def fence(connection: psycopg.AsyncConnection[Any], spaces: list[str]) -> None:
    await connection.execute("BEGIN")
    await connection.execute(
        "SELECT outrig_fence('a', %s::text[], %s::bigint[])", (spaces, [1] * len(spaces))
    )


async def advisory_locks(connection: psycopg.AsyncConnection[Any], granted: bool) -> int:
    cursor = await connection.execute(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted = %s AND objsubid = 2",
        (granted,),
    )
    row = await cursor.fetchone()
    assert row is not None
    return int(row[0])


async def test_a_claim_waits_for_a_fenced_batch_and_later_batches_fail(dsn: str) -> None:
    async with (
        await psycopg.AsyncConnection.connect(dsn, autocommit=True) as batch,
        await psycopg.AsyncConnection.connect(dsn, autocommit=True) as other,
        await psycopg.AsyncConnection.connect(dsn, autocommit=True) as monitor,
        AsyncConnectionPool(dsn, min_size=1, max_size=2, kwargs={"autocommit": True}) as pool,
    ):
        await fence(batch, ["s", "t"])
        await fence(other, ["s"])  # batches share the lock: this one does not wait
        assert await advisory_locks(monitor, granted=True) == 3
        claim = asyncio.create_task(Ownership(pool, "b", 3.0).claim("s"))
        await wait_until_async(
            lambda: advisory_locks(monitor, granted=False), what="the claim waiting for the batches"
        )
        assert not claim.done()
        await batch.execute(
            "INSERT INTO outrig_entries (space, id, arrival, payload) VALUES ('s', 1, 1, '\\x00'::bytea)"
        )
        await batch.execute("COMMIT")
        await other.execute("COMMIT")
        assert await asyncio.wait_for(claim, 10) == 2
        with pytest.raises(psycopg.Error) as refused:
            await fence(batch, ["s"])
        assert refused.value.sqlstate == FENCED
        await batch.execute("ROLLBACK")
        await fence(batch, ["t"])  # a's other space is still a's
        await batch.execute("COMMIT")
        cursor = await monitor.execute("SELECT id FROM outrig_entries WHERE space = 's'")
        assert await cursor.fetchall() == [(1,)]  # the batch that passed the fence committed


async def test_a_hand_over_waits_for_a_fenced_batch_too(dsn: str) -> None:
    async with (
        await psycopg.AsyncConnection.connect(dsn, autocommit=True) as setup,
        await psycopg.AsyncConnection.connect(dsn, autocommit=True) as batch,
        await psycopg.AsyncConnection.connect(dsn, autocommit=True) as monitor,
        AsyncConnectionPool(dsn, min_size=1, max_size=2, kwargs={"autocommit": True}) as pool,
    ):
        await setup.execute("UPDATE outrig_spaces SET owner_expires_at = now() + interval '1 hour'")
        await fence(batch, ["s"])
        handing = asyncio.create_task(Ownership(pool, "a", 3.0).hand_over("s", "c", 1))
        await wait_until_async(
            lambda: advisory_locks(monitor, granted=False), what="the hand-over waiting for the batch"
        )
        await batch.execute("COMMIT")
        assert await asyncio.wait_for(handing, 10)
        with pytest.raises(psycopg.Error) as refused:
            await fence(batch, ["s"])
        assert refused.value.sqlstate == FENCED
