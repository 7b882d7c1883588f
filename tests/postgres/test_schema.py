"""Migrations against a real PostgreSQL: applied once, by one of several servers at a time, and a
newer database refused."""

from __future__ import annotations

import asyncio

import psycopg
import pytest

from outrig.service.backends.postgres.schema import SCHEMA_VERSION, migrate
from outrig.service.exceptions import IncompatibleStoreError

from ..postgres_server import PostgresServer


async def _fresh_database(postgres: PostgresServer) -> str:
    return postgres.dsn(postgres.new_database("t"))


async def test_migrations_apply_once_even_from_several_servers_at_once(postgres: PostgresServer) -> None:
    dsn = await _fresh_database(postgres)

    async def start() -> list[int]:
        async with await psycopg.AsyncConnection.connect(dsn) as connection:
            return await migrate(connection)

    results = await asyncio.gather(*(start() for _ in range(4)))
    assert sorted(results, key=len) == [[], [], [], list(range(1, SCHEMA_VERSION + 1))]
    async with await psycopg.AsyncConnection.connect(dsn) as connection:
        cursor = await connection.execute("SELECT version FROM outrig_schema ORDER BY version")
        assert [row[0] for row in await cursor.fetchall()] == list(range(1, SCHEMA_VERSION + 1))
        cursor = await connection.execute(
            "SELECT indexname FROM pg_indexes WHERE tablename = 'outrig_entries'"
        )
        # The owner layout: no match indexes (matching never runs in SQL); the taker's index,
        # and the writing transaction's (its end deletes what it wrote and did not commit).
        assert {row[0] for row in await cursor.fetchall()} == {
            "outrig_entries_pkey",
            "outrig_entries_arrival",  # a load reads a space in arrival order
            "outrig_entries_taken_by",
            "outrig_entries_taken_until",  # the prune of takes whose request window has passed
            "outrig_entries_written_by",
        }
        cursor = await connection.execute("SELECT count(*) FROM outrig_tier WHERE key = 'peer_secret'")
        assert await cursor.fetchone() == (1,)


async def test_a_newer_database_is_refused(postgres: PostgresServer) -> None:
    dsn = await _fresh_database(postgres)
    async with await psycopg.AsyncConnection.connect(dsn) as connection:
        await migrate(connection)
        await connection.execute("INSERT INTO outrig_schema (version) VALUES (%s)", (SCHEMA_VERSION + 1,))
        await connection.commit()
        with pytest.raises(IncompatibleStoreError, match=f"version {SCHEMA_VERSION + 1}"):
            await migrate(connection)
