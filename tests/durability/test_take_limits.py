"""A take's own max_deliveries is durable (SQLite store format 3): after a restart, or a crash
right after the last reply, a pending delivery's take's limit still applies when the delivery
ends unacknowledged (by a nack, or its deadline passing while the server was down), not the
space's setting; and a format-2 data dir is migrated on open."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from outrig.service.backends.embedded.store.check import check_store
from outrig.service.backends.embedded.store.schema import FORMAT_VERSION, database_path
from outrig.service.config import ServerConfig
from outrig.service.engine import FakeClock

from ..polling import wait_until_async
from ..service.test_embedded_deliveries import JOBS, SPACE, deliver, job, make_config, numbers, visible
from ..store_formats import as_format_3
from .test_restart import running


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(1_000_000.0)


@pytest.fixture
def durable(tmp_path: Path) -> ServerConfig:
    return make_config(tmp_path / "data", max_deliveries=5)  # the space's: far off


async def dead_letters(backend: object) -> list[object]:
    found = await backend.deliver("jobs.dead", [JOBS], max_entries=10, timeout=0, ack=30.0)  # type: ignore[attr-defined]
    return numbers(found)


@pytest.mark.parametrize("crash", [False, True])
async def test_a_takes_max_deliveries_survives_a_restart(
    durable: ServerConfig, clock: FakeClock, crash: bool
) -> None:
    async with running(durable, clock, crash=crash) as backend:
        await backend.write(SPACE, [job(n) for n in range(3)], None)
        (nacked,) = await deliver(backend, ack=60.0, max_deliveries=1)
        (lapsing,) = await deliver(backend, ack=5.0, max_deliveries=1)
        (plain,) = await deliver(backend, ack=5.0)  # no limit of its own: the space's 5
        await backend.extend(SPACE, nacked.receipt, 120.0)  # an extension keeps the limit too
    with sqlite3.connect(database_path(durable.data_dir)) as db:  # type: ignore[arg-type]
        limits = dict(db.execute("SELECT id, max_deliveries FROM entries WHERE receipt IS NOT NULL"))
    assert limits == {nacked.entry.id: 1, lapsing.entry.id: 1, plain.entry.id: 0}
    clock.advance(10.0)  # two deadlines pass while the server is down
    async with running(durable, clock) as backend:
        # At its first pass the reaper ends both: the take's limit (1) sends its entry to the
        # dead-letter space; the other, counted, is visible again.
        async def reaped() -> bool:
            return await visible(backend) == numbers([plain])

        await wait_until_async(reaped, what="the lapsed deliveries to end")
        assert (await backend.nack(SPACE, nacked.receipt, 0.0)).dead_letter == "jobs.dead"
        assert set(await dead_letters(backend)) == set(numbers([nacked, lapsing]))
    assert check_store(durable.data_dir).ok  # type: ignore[arg-type]


async def test_a_format_2_data_dir_is_migrated(tmp_path: Path, clock: FakeClock) -> None:
    config = make_config(tmp_path / "data")
    async with running(config, clock) as backend:
        await backend.write(SPACE, [job(0)], None)
        (delivery,) = await deliver(backend, max_deliveries=3)
    path = database_path(tmp_path / "data")
    with sqlite3.connect(path) as db:  # what a format-2 server left: no max_deliveries column
        as_format_3(db)
        db.execute("ALTER TABLE entries DROP COLUMN max_deliveries")
        for table in ("change_logs", "changes", "change_subscriptions"):  # format 3's too
            db.execute(f"DROP TABLE {table}")
        db.execute("PRAGMA user_version = 2")
    assert check_store(tmp_path / "data").format_version == 2  # outrig check reads it as it is
    async with running(config, clock) as backend:
        assert await visible(backend) == []  # still pending, its limit unknown (the space's)
        await backend.ack(SPACE, delivery.receipt)
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == FORMAT_VERSION == 5
        assert "max_deliveries" in [row[1] for row in db.execute("PRAGMA table_info(entries)")]
