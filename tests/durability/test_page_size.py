"""The store's page size (store/schema.py, `PAGE_SIZE`): a new store is made with it; a store made
with SQLite's default 4096-byte pages keeps them and is read and written as before, across a
restart; an entry larger than a page (kept on overflow pages) comes back whole."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from outrig.service.backends.embedded.store import schema
from outrig.service.backends.embedded.store.schema import PAGE_SIZE, database_path
from outrig.service.config import ServerConfig
from outrig.service.engine import FakeClock

from .test_restart import clock, config, entry, numbers, read_all, running, take, template

__all__ = ["clock", "config"]  # the fixtures


def _page_size(data_dir: Path) -> int:
    with sqlite3.connect(database_path(data_dir)) as db:
        size: int = db.execute("PRAGMA page_size").fetchone()[0]
    return size


async def test_a_new_store_has_the_page_size_and_keeps_an_entry_larger_than_a_page(
    config: ServerConfig, clock: FakeClock
) -> None:
    assert config.data_dir is not None
    big = "x" * (3 * PAGE_SIZE)
    async with running(config, clock) as backend:
        await backend.write("s", [entry(n=1, note=big), entry(n=2)], None, request_id="w")
    assert _page_size(config.data_dir) == PAGE_SIZE
    async with running(config, clock) as backend:
        found = await read_all(backend)
        assert sorted(numbers(found)) == [1, 2]
        (taken,) = await take(backend, template(n=1))
        assert taken.fields["note"].data == big
    async with running(config, clock) as backend:
        assert numbers(await read_all(backend)) == [2]


async def test_a_store_made_with_4096_byte_pages_keeps_them(
    config: ServerConfig, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert config.data_dir is not None
    with monkeypatch.context() as patched:
        patched.setattr(schema, "PAGE_SIZE", 4096)  # the size stores were made with before
        async with running(config, clock) as backend:
            await backend.write("s", [entry(n=1)], None, request_id="w1")
    assert _page_size(config.data_dir) == 4096
    async with running(config, clock) as backend:  # opened with today's PAGE_SIZE
        await backend.write("s", [entry(n=2)], None, request_id="w2")
        assert sorted(numbers(await read_all(backend))) == [1, 2]
    assert _page_size(config.data_dir) == 4096
    async with running(config, clock) as backend:
        assert sorted(numbers(await read_all(backend))) == [1, 2]
