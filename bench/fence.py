"""The owner tier's fence in PostgreSQL alone: its cost per batch, row lock against advisory lock.

    python bench/fence.py [--rounds N] [--batches N]

Every batch an owner commits starts with `outrig_fence`. Until schema migration 3 it locked the
space's `outrig_spaces` row FOR SHARE (a write to the row; a MultiXact when the two batches in
flight hold it at once); now it takes a shared advisory lock per space. Both are measured here on a
throwaway PostgreSQL (fsync on), as batches like the journal's (one simple query: BEGIN, the
fence, an INSERT and a DELETE of an entry, COMMIT) on 2 connections at once: the CPU seconds of
PostgreSQL (the postmaster and its children, from /proc) per batch, batches/s, and the WAL records
and bytes per batch (pg_stat_wal: steady from run to run, where CPU and rate move with the
load on a shared machine). Rounds are interleaved; figures are medians; the ratios
are advisory / row lock. Asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
from owners import PostgresCpu

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from outrig.service.backends.postgres.schema import FENCE_CLASS, migrate
from tests.postgres_server import find_bindir, running_postgres

ROW_LOCK = """
CREATE FUNCTION fence_row_lock(me text, spaces text[], epochs bigint[]) RETURNS void
LANGUAGE plpgsql AS $f$
DECLARE held integer;
BEGIN
    SELECT count(*) INTO held FROM (
        SELECT 1 FROM outrig_spaces s
        JOIN unnest(spaces, epochs) AS f (space, epoch) ON s.space = f.space AND s.epoch = f.epoch
        WHERE s.owner = me FOR SHARE OF s
    ) AS locked;
    IF held <> cardinality(spaces) THEN RAISE EXCEPTION 'fenced' USING ERRCODE = 'OR001'; END IF;
END $f$;
"""
ROW_LOCK += f"""
CREATE FUNCTION fence_advisory_join(me text, spaces text[], epochs bigint[]) RETURNS void
LANGUAGE plpgsql AS $f$
DECLARE held integer;
BEGIN
    PERFORM pg_advisory_xact_lock_shared({FENCE_CLASS}, hashtext(s)) FROM unnest(spaces) AS s ORDER BY s;
    SELECT count(*) INTO held FROM outrig_spaces s
        JOIN unnest(spaces, epochs) AS f (space, epoch) ON s.space = f.space AND s.epoch = f.epoch
        WHERE s.owner = me;
    IF held <> cardinality(spaces) THEN RAISE EXCEPTION 'fenced' USING ERRCODE = 'OR001'; END IF;
END $f$;
"""
FENCES = {
    "row lock (FOR SHARE), join": "fence_row_lock",
    "advisory lock, join": "fence_advisory_join",
    "advisory lock, a lookup per space (outrig_fence)": "outrig_fence",
}
CONNECTIONS = 2


async def batches(
    connections: list[psycopg.AsyncConnection[Any]], fence: str, count: int, ids: Iterator[int]
) -> None:
    async def send(connection: psycopg.AsyncConnection[Any]) -> None:
        for _ in range(count):
            entry = next(ids)
            await connection.execute(
                f"BEGIN; SELECT {fence}('me', ARRAY['s'], ARRAY[1::bigint]); "
                f"INSERT INTO outrig_entries (space, id, arrival, payload) VALUES ('s', {entry}, {entry}, "
                f"'\\x00'::bytea); DELETE FROM outrig_entries WHERE space = 's' AND id = {entry - 8}; "
                "COMMIT".encode()
            )

    await asyncio.gather(*(send(connection) for connection in connections))


async def wal(dsn: str) -> tuple[int, int]:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as connection:
        cursor = await connection.execute("SELECT wal_records, wal_bytes FROM pg_stat_wal")
        row = await cursor.fetchone()
        assert row is not None
        return int(row[0]), int(row[1])


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batches", type=int, default=1500, help="per connection and round")
    args = parser.parse_args()
    bindir = find_bindir()
    assert bindir is not None, "PostgreSQL's server binaries are needed (Debian's postgresql)"
    with running_postgres(bindir, fsync=True) as postgres:
        dsn = postgres.dsn(postgres.new_database("fence"))
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as connection:
            await migrate(connection)
            await connection.execute(ROW_LOCK)
            await connection.execute("INSERT INTO outrig_spaces (space, owner, epoch) VALUES ('s', 'me', 1)")
        # Each fence's connections live through every round: a backend's CPU is read from its
        # /proc entry while it lives (one that exited is counted only once the postmaster reaps it).
        connections = {
            name: [await psycopg.AsyncConnection.connect(dsn, autocommit=True) for _ in range(CONNECTIONS)]
            for name in FENCES
        }
        cpu = PostgresCpu(postgres.port)
        ids = itertools.count(10)
        results: dict[str, list[tuple[float, float, float, float]]] = {name: [] for name in FENCES}
        names = list(FENCES)
        for round_number in range(args.rounds):
            shift = round_number % len(names)
            for name in names[shift:] + names[:shift]:
                records, size = await wal(dsn)
                cpu_before, started = cpu.seconds(), time.perf_counter()
                await batches(connections[name], FENCES[name], args.batches, ids)
                seconds = time.perf_counter() - started
                cpu_after = cpu.seconds()
                records_after, size_after = await wal(dsn)
                done = CONNECTIONS * args.batches
                results[name].append(
                    (
                        (cpu_after - cpu_before) / done * 1e6,
                        done / seconds,
                        (records_after - records) / done,
                        (size_after - size) / done,
                    )
                )
        for each in connections.values():
            for connection in each:
                await connection.close()
    print(
        f"## the fence: {args.rounds} rounds of {CONNECTIONS} x {args.batches} batches, "
        f"{os.cpu_count()} cores"
    )
    print("| fence | PostgreSQL CPU us/batch | batches/s | WAL records/batch | WAL bytes/batch |")
    print("|---|---|---|---|---|")
    medians: dict[str, list[float]] = {}
    for name, rows in results.items():
        medians[name] = [statistics.median(r[i] for r in rows) for i in range(4)]
        cpu_us, rate, wal_records, wal_bytes = medians[name]
        print(f"| {name} | {cpu_us:,.0f} | {rate:,.0f} | {wal_records:.2f} | {wal_bytes:,.0f} |")
    new, old = (
        medians["advisory lock, a lookup per space (outrig_fence)"],
        medians["row lock (FOR SHARE), join"],
    )
    # A short run may read no WAL yet (PostgreSQL reports its statistics a second at a time).
    ratio = [f"{a / b:.2f}" if b else "n/a" for a, b in zip(new, old, strict=True)]
    print(
        f"\nratios outrig_fence / row lock: CPU {ratio[0]}, rate {ratio[1]}, WAL records {ratio[2]}, "
        f"WAL bytes {ratio[3]}; load average {os.getloadavg()[0]:.2f}"
    )


if __name__ == "__main__":
    asyncio.run(main())
