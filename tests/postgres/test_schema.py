"""Migrations against a real PostgreSQL: applied once, by one of several servers at a time, and a
newer database refused."""

from __future__ import annotations

import asyncio
import uuid

import psycopg
import pytest

from outrig.service.backends.postgres.schema import SCHEMA_VERSION, field_key, migrate
from outrig.service.engine.values import FieldValue
from outrig.service.exceptions import IncompatibleStoreError

from ..postgres_server import PostgresServer


async def _fresh_database(postgres: PostgresServer) -> str:
    name = f"t_{uuid.uuid4().hex[:12]}"
    async with await psycopg.AsyncConnection.connect(postgres.dsn(), autocommit=True) as admin:
        await admin.execute(f"CREATE DATABASE {name}")
    return postgres.dsn(name)


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
        assert {"outrig_entries_fields", "outrig_entries_lineage"} <= {
            row[0] for row in await cursor.fetchall()
        }


async def test_a_newer_database_is_refused(postgres: PostgresServer) -> None:
    dsn = await _fresh_database(postgres)
    async with await psycopg.AsyncConnection.connect(dsn) as connection:
        await migrate(connection)
        await connection.execute("INSERT INTO outrig_schema (version) VALUES (%s)", (SCHEMA_VERSION + 1,))
        await connection.commit()
        with pytest.raises(IncompatibleStoreError, match=f"version {SCHEMA_VERSION + 1}"):
            await migrate(connection)


def test_field_keys_tell_kinds_and_values_apart() -> None:
    keys = {
        field_key(FieldValue("int", 1)),
        field_key(FieldValue("bool", True)),
        field_key(FieldValue("double", (1.0).hex().encode())),
        field_key(FieldValue("string", "1")),
        field_key(FieldValue("bytes", b"1")),
        field_key(FieldValue("null", None)),
    }
    assert len(keys) == 6
    big = bytes(range(256)) * 20
    assert field_key(FieldValue("array:int32", big)).startswith(f"array:int32:L{len(big)}:")
    assert len(field_key(FieldValue("array:int32", big))) < 200  # never the whole value
