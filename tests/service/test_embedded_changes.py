"""Change feeds through the embedded backend, in memory and recorded in a real SQLite store: replay
then live with no seam, templates and kinds, the head, compacted, foreign-epoch and ahead-of-head
positions, a log turned off, durable subscriptions (made, busy, acked, deleted), feeds ending at
close; and on the durable store: a restart keeps the log, its epoch, its payloads and the durable
subscriptions, entries that expired while down are logged, age retention is recorded, a batch the
store refuses rewinds the log (and no feed ever shows it), and a format-2 data dir is migrated."""

from __future__ import annotations

import asyncio
import dataclasses
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from outrig.service.backends.embedded.backend import EmbeddedBackend
from outrig.service.backends.embedded.store.check import check_store
from outrig.service.backends.embedded.store.schema import FORMAT_VERSION, database_path
from outrig.service.backends.memory.changes import MemoryChangeFeed
from outrig.service.engine import FakeClock, Template
from outrig.service.engine.changes import CHANGE_KINDS, Change, ChangeLog
from outrig.service.exceptions import (
    ChangesOffError,
    CompactedError,
    InvalidCursorError,
    ShuttingDownError,
    StoreUnavailableError,
    SubscriptionBusyError,
    SubscriptionNotFoundError,
)

from ..durability.test_restart import running
from ..polling import wait_until_async
from ..store_formats import as_format_3, as_format_4
from .test_embedded_deliveries import JOBS, SPACE, WAIT, job, make_config

ALL = frozenset(CHANGE_KINDS)


async def read(feed: MemoryChangeFeed, count: int) -> list[Change]:
    """The next `count` changes the feed yields (failing after WAIT seconds)."""
    got: list[Change] = []
    async with asyncio.timeout(WAIT):
        async for batch in feed:
            got += batch.changes
            if len(got) >= count:
                return got
    return got


async def read_through(feed: MemoryChangeFeed, position: int) -> tuple[list[Change], int]:
    """What the feed yields until it has read through `position`."""
    got: list[Change] = []
    async with asyncio.timeout(WAIT):
        async for batch in feed:
            got += batch.changes
            if batch.position >= position:
                return got, batch.position
    raise AssertionError("the feed ended")


def summary(changes: list[Change]) -> list[tuple[int, str, object]]:
    return [(c.seq, c.kind, c.entry.fields["n"].data) for c in changes]


async def take(backend: EmbeddedBackend, n: int | None = None) -> None:
    template = JOBS if n is None else Template("Job", {"n": job(n).fields["n"]})
    await backend.match(SPACE, [template], take=True, max_entries=1, timeout=0, if_exists=False)


async def test_a_feed_replays_then_goes_live_without_a_seam(data_dir: Path | None, clock: FakeClock) -> None:
    async with running(make_config(data_dir), clock) as backend:
        await backend.write(SPACE, [job(0), job(1), job(2)], None)
        await take(backend, 1)
        epoch = backend.engine(SPACE).changes.epoch  # type: ignore[union-attr]
        feed = await backend.changes(SPACE, [], ALL, since=(epoch, 0))
        assert (feed.epoch, feed.start, feed.oldest) == (epoch, 0, 0)
        assert summary(await read(feed, 4)) == [
            (1, "write", 0),
            (2, "write", 1),
            (3, "write", 2),
            (4, "take", 1),
        ]

        async def more() -> None:
            await backend.write(SPACE, [job(3)], None)
            await take(backend, 0)

        writer = asyncio.create_task(more())
        assert summary(await read(feed, 2)) == [(5, "write", 3), (6, "take", 0)]
        await writer
        feed.close()


async def test_templates_and_kinds_filter_and_skipped_changes_move_the_position(
    data_dir: Path | None, clock: FakeClock
) -> None:
    async with running(make_config(data_dir), clock) as backend:
        one = Template("Job", {"n": job(1).fields["n"]})
        feed = await backend.changes(SPACE, [one], frozenset({"take"}), since=None)
        assert feed.start == 0
        await backend.write(SPACE, [job(0), job(1)], None)
        await take(backend, 0)
        await take(backend, 1)
        changes, position = await read_through(feed, 4)
        assert summary(changes) == [(4, "take", 1)] and position == 4
        feed.close()
        feed = await backend.changes(SPACE, [], ALL, since=None)  # from the head
        assert feed.start == 4
        await backend.write(SPACE, [job(5)], None)
        assert summary(await read(feed, 1)) == [(5, "write", 5)]
        feed.close()


async def test_compacted_foreign_and_ahead_positions_are_refused(
    data_dir: Path | None, clock: FakeClock
) -> None:
    async with running(make_config(data_dir, changes_max_count=3), clock) as backend:
        await backend.write(SPACE, [job(n) for n in range(5)], None)
        log = backend.engine(SPACE).changes
        assert log is not None and log.oldest == 3
        feed = await backend.changes(SPACE, [], ALL, since=(log.epoch, 2))
        assert summary(await read(feed, 3)) == [(3, "write", 2), (4, "write", 3), (5, "write", 4)]
        feed.close()
        with pytest.raises(CompactedError) as compacted:
            await backend.changes(SPACE, [], ALL, since=(log.epoch, 1))
        assert (compacted.value.epoch, compacted.value.oldest) == (log.epoch, 2)
        with pytest.raises(CompactedError) as foreign:
            await backend.changes(SPACE, [], ALL, since=(log.epoch ^ 1, 4))
        assert foreign.value.oldest == 2 and "another epoch" in str(foreign.value)
        with pytest.raises(InvalidCursorError, match="ahead of the log's head 5"):
            await backend.changes(SPACE, [], ALL, since=(log.epoch, 6))


async def test_a_reader_left_behind_by_retention_ends_compacted(clock: FakeClock) -> None:
    async with running(make_config(None, changes_max_count=2), clock) as backend:
        await backend.write(SPACE, [job(0)], None)
        feed = await backend.changes(SPACE, [], ALL, since=None)
        await backend.write(SPACE, [job(n) for n in range(1, 5)], None)  # before it reads
        with pytest.raises(CompactedError):
            await read(feed, 1)


async def test_a_space_with_its_log_off_refuses_changes(clock: FakeClock) -> None:
    async with running(make_config(None, changes=False), clock) as backend:
        with pytest.raises(ChangesOffError, match="changes = false"):
            await backend.changes(SPACE, [], ALL, since=None)


async def test_durable_subscriptions_are_made_busy_acked_and_deleted(
    data_dir: Path | None, clock: FakeClock
) -> None:
    config = make_config(data_dir)
    async with running(config, clock) as backend:
        await backend.write(SPACE, [job(0)], None)
        feed = await backend.changes(SPACE, [], ALL, since=None, durable="billing")
        assert feed.start == 1
        with pytest.raises(SubscriptionBusyError, match="'billing'"):
            await backend.changes(SPACE, [], ALL, since=None, durable="billing")
        await backend.write(SPACE, [job(1), job(2)], None)
        assert summary(await read(feed, 2)) == [(2, "write", 1), (3, "write", 2)]
        await backend.ack_changes(SPACE, "billing", 2)
        await backend.ack_changes(SPACE, "billing", 1)  # older: nothing
        with pytest.raises(InvalidCursorError):
            await backend.ack_changes(SPACE, "billing", 9)
        feed.close()
        again = await backend.changes(SPACE, [], ALL, since=(123, 0), durable="billing")  # `since` ignored
        assert again.start == 2
        assert summary(await read(again, 1)) == [(3, "write", 2)]
        again.close()
        assert (await backend.describe(SPACE)).changes.subscriptions == {"billing": 2}  # type: ignore[union-attr]
    if data_dir is None:
        return
    async with running(config, clock) as backend:  # the position survives a restart
        feed = await backend.changes(SPACE, [], ALL, since=None, durable="billing")
        assert feed.start == 2
        assert summary(await read(feed, 1)) == [(3, "write", 2)]
        feed.close()
        await backend.delete_subscription(SPACE, "billing")
        with pytest.raises(SubscriptionNotFoundError, match="'billing'"):
            await backend.delete_subscription(SPACE, "billing")
        with pytest.raises(SubscriptionNotFoundError):
            await backend.ack_changes(SPACE, "billing", 1)
    async with running(config, clock) as backend:
        assert backend.engine(SPACE).changes.subscriptions == {}  # type: ignore[union-attr]


async def test_feeds_end_when_the_backend_closes(data_dir: Path | None, clock: FakeClock) -> None:
    backend = EmbeddedBackend(make_config(data_dir), clock)
    await backend.start()
    feed = await backend.changes(SPACE, [], ALL, since=None, durable="d")
    reader = asyncio.create_task(read(feed, 1))
    await asyncio.sleep(0)
    await backend.close()
    with pytest.raises(ShuttingDownError):
        await reader
    await backend.shutdown()


# ---------------------------------------------------------------- the durable store


async def test_a_restart_keeps_the_log_its_epoch_and_its_payloads(tmp_path: Path, clock: FakeClock) -> None:
    config = make_config(tmp_path / "data")
    async with running(config, clock) as backend:
        await backend.write(SPACE, [job(0), job(1), job(2)], None)
        await take(backend, 1)  # its row goes: the write's payload comes from the take's change
        await backend.write(SPACE, [job(3)], 5.0)  # expires while the server is down
        txn = await backend.begin(SPACE, None)
        await backend.write(SPACE, [job(4)], None, transaction=txn.id)
        await backend.match(
            SPACE,
            [Template("Job", {"n": job(0).fields["n"]})],
            take=True,
            max_entries=1,
            timeout=0,
            if_exists=False,
            transaction=txn.id,
        )
        await backend.commit(SPACE, txn.id)
        before = backend.engine(SPACE).changes
        assert before is not None
        epoch, head = before.epoch, before.head
    clock.advance(10)
    async with running(config, clock) as backend:
        log = backend.engine(SPACE).changes
        assert log is not None and log.epoch == epoch
        feed = await backend.changes(SPACE, [], ALL, since=(epoch, 0))
        changes = await read(feed, head + 1)
        assert summary(changes) == [
            (1, "write", 0),
            (2, "write", 1),
            (3, "write", 2),
            (4, "take", 1),
            (5, "write", 3),
            (6, "write", 4),
            (7, "take", 0),
            (8, "expire", 3),  # it expired while the server was down: logged at the restart
        ]
        assert [c.transaction for c in changes[5:7]] == [txn.id, txn.id]
        feed.close()
    async with running(config, clock) as backend:  # the expiry was recorded, once
        assert backend.engine(SPACE).changes.head == 8  # type: ignore[union-attr]
    assert check_store(tmp_path / "data").ok


async def test_age_retention_is_recorded_and_an_emptied_log_keeps_its_head(
    tmp_path: Path, clock: FakeClock
) -> None:
    config = make_config(tmp_path / "data", changes_max_age=60.0)
    async with running(config, clock) as backend:
        await backend.write(SPACE, [job(0), job(1)], None)
        clock.advance(61)
        log = backend.engine(SPACE).changes
        assert log is not None
        await wait_until_async(emptied(log), WAIT, what="the reaper's pass to trim the log")
        epoch = log.epoch
        await backend.write(SPACE, [job(2)], None)
        await take(backend, 2)
        clock.advance(61)
        await wait_until_async(emptied(log), WAIT, what="the second trim")
        await backend.write(SPACE, [job(9)], None)
        await take(backend, 9)
    async with running(config, clock) as backend:
        log = backend.engine(SPACE).changes
        assert log is not None and log.epoch == epoch and log.head == 6
        with pytest.raises(CompactedError):
            await backend.changes(SPACE, [], ALL, since=(epoch, 0))


def emptied(log: ChangeLog) -> Callable[[], bool]:
    return lambda: log.count == 0


def _refuse_writes(path: Path) -> None:
    """Make the store refuse the next batch that writes an entry: a real SQLite error."""
    with sqlite3.connect(path) as db:
        db.execute("CREATE TRIGGER refuse BEFORE INSERT ON entries BEGIN SELECT RAISE(ABORT, 'refused'); END")


def _accept_writes(path: Path) -> None:
    with sqlite3.connect(path) as db:
        db.execute("DROP TRIGGER refuse")


async def test_a_batch_the_store_refuses_rewinds_the_log_and_no_feed_shows_it(
    tmp_path: Path, clock: FakeClock
) -> None:
    config = make_config(tmp_path / "data")
    path = database_path(tmp_path / "data")
    backend = EmbeddedBackend(config, clock)
    await backend.start()
    assert backend.journal is not None
    backend.journal._probe_interval = 0.01  # type: ignore[attr-defined]
    try:
        await backend.write(SPACE, [job(0)], None)
        feed = await backend.changes(SPACE, [], ALL, since=None)
        reader = asyncio.create_task(read(feed, 1))
        _refuse_writes(path)
        with pytest.raises(StoreUnavailableError):
            await backend.write(SPACE, [job(1)], None)
        log = backend.engine(SPACE).changes
        assert log is not None and log.head == 1  # rewound
        _accept_writes(path)

        async def accepted() -> bool:
            try:
                await backend.write(SPACE, [job(2)], None)
            except StoreUnavailableError:
                return False
            return True

        await wait_until_async(accepted, WAIT, what="the store to accept changes again")
        assert summary(await reader) == [(2, "write", 2)]  # never the refused one
        feed.close()
    finally:
        await backend.close()
        await backend.shutdown()
    async with running(config, clock) as backend:
        feed = await backend.changes(SPACE, [], ALL, since=(backend.engine(SPACE).changes.epoch, 0))  # type: ignore[union-attr]
        assert summary(await read(feed, 2)) == [(1, "write", 0), (2, "write", 2)]
        feed.close()


async def test_a_format_2_data_dir_is_migrated(tmp_path: Path, clock: FakeClock) -> None:
    config = make_config(tmp_path / "data")
    async with running(config, clock) as backend:
        await backend.write(SPACE, [job(0)], None)
    path = database_path(tmp_path / "data")
    with sqlite3.connect(path) as db:  # what a format-2 server left: no change log
        as_format_3(db)
        for table in ("change_logs", "changes", "change_subscriptions"):
            db.execute(f"DROP TABLE {table}")
        db.execute("ALTER TABLE entries DROP COLUMN max_deliveries")  # format 3's too
        db.execute("PRAGMA user_version = 2")
    assert check_store(tmp_path / "data").format_version == 2  # outrig check reads it as it is
    async with running(config, clock) as backend:
        log = backend.engine(SPACE).changes
        assert log is not None and log.head == 0  # its log starts empty
        await take(backend, 0)
        epoch = log.epoch
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == FORMAT_VERSION == 5
        assert indexes(db) == {"entries_by_taker"}
    async with running(config, clock) as backend:
        log = backend.engine(SPACE).changes
        assert log is not None and (log.epoch, log.head) == (epoch, 1)
    assert check_store(tmp_path / "data").ok


def indexes(db: sqlite3.Connection) -> set[str]:
    """The store's own indexes (not SQLite's automatic ones for its keys)."""
    return {
        name
        for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'index' AND sql IS NOT NULL")
    }


async def test_a_store_with_the_change_log_indexed_by_entry_loses_the_index(
    tmp_path: Path, clock: FakeClock
) -> None:
    config = make_config(tmp_path / "data")
    async with running(config, clock) as backend:
        await backend.write(SPACE, [job(0), job(1)], None)
        await take(backend, 0)
    path = database_path(tmp_path / "data")
    with sqlite3.connect(path) as db:  # what an outrig of format 4 made before the index went
        as_format_4(db)
        assert indexes(db) == {"entries_by_taker", "changes_by_entry"}
    assert check_store(tmp_path / "data").ok  # outrig check reads it as it is
    async with running(config, clock) as backend:
        log = backend.engine(SPACE).changes
        assert log is not None and log.head == 3
        feed = await backend.changes(SPACE, [], ALL, since=(log.epoch, 0))
        assert summary(await read(feed, 3)) == [(1, "write", 0), (2, "write", 1), (3, "take", 0)]
        feed.close()
    with sqlite3.connect(path) as db:
        assert indexes(db) == {"entries_by_taker"}
        assert db.execute("PRAGMA user_version").fetchone()[0] == FORMAT_VERSION


async def test_a_restart_finds_each_removed_write_s_payload_in_its_own_space(
    tmp_path: Path, clock: FakeClock
) -> None:
    """Two spaces' entries of the same ids, all taken: each write's payload is its own space's
    take's; a write whose payload no change holds (a damaged store) is left out of the log, which
    is then held from after the gap (ChangeLog.restore)."""
    other = "other"
    config = make_config(tmp_path / "data")
    async with running(config, clock) as backend:
        await backend.write(SPACE, [job(0), job(1)], None)
        await backend.write(other, [job(10), job(11)], None)
        for space in (SPACE, other):
            for _ in range(2):
                await backend.match(space, [JOBS], take=True, max_entries=1, timeout=0, if_exists=False)
        ids = {space: sorted(s.id for s in backend.engine(space).snapshot()) for space in (SPACE, other)}
    assert ids == {SPACE: [], other: []}
    with sqlite3.connect(database_path(tmp_path / "data")) as db:
        (number,) = db.execute("SELECT no FROM spaces WHERE name = ?", (other,)).fetchone()
        rows = db.execute("SELECT entry_id FROM changes WHERE space = ? ORDER BY seq", (number,)).fetchall()
        first, second = rows[0][0], rows[1][0]
        assert (
            db.execute("SELECT count(*) FROM changes WHERE entry_id IN (?, ?)", (first, second)).fetchone()[0]
            == 8
        )
        db.execute(
            "UPDATE changes SET payload = NULL WHERE space = ? AND seq > 2 AND entry_id = ?", (number, second)
        )
    async with running(config, clock) as backend:
        for space, expected in (
            (SPACE, [(1, "write", 0), (2, "write", 1), (3, "take", 0), (4, "take", 1)]),
            (other, [(3, "take", 10)]),  # the writes left out make a gap: held from after it
        ):
            log = backend.engine(space).changes
            assert log is not None
            assert summary(log.after(0, 10)) == expected


async def test_a_blocked_take_is_logged_after_the_write_that_hands_it_over(
    data_dir: Path | None, clock: FakeClock
) -> None:
    config = make_config(data_dir)
    async with running(config, clock) as backend:
        taker = asyncio.create_task(
            backend.match(SPACE, [JOBS], take=True, max_entries=1, timeout=WAIT, if_exists=False)
        )
        await wait_until_async(lambda: backend.engine(SPACE).waiting == 1, WAIT, what="the take to park")
        await backend.write(SPACE, [job(7)], None)
        assert [s.fields["n"].data for s in await taker] == [7]
        feed = await backend.changes(SPACE, [], ALL, since=(backend.engine(SPACE).changes.epoch, 0))  # type: ignore[union-attr]
        assert summary(await read(feed, 2)) == [(1, "write", 7), (2, "take", 7)]
        feed.close()
    if data_dir is not None:
        async with running(config, clock) as backend:
            log = backend.engine(SPACE).changes
            assert log is not None
            assert summary(log.after(0, 10)) == [(1, "write", 7), (2, "take", 7)]


async def test_under_always_a_feed_shows_a_change_only_once_its_batch_is_durable(
    tmp_path: Path, clock: FakeClock
) -> None:
    async with running(make_config(tmp_path / "data"), clock) as backend:
        journal = backend.journal
        assert journal is not None and journal.waits
        feed = await backend.changes(SPACE, [], ALL, since=None)
        reader = asyncio.create_task(read(feed, 1))
        held = threading.Event()
        # The store's one thread is busy: the write's COMMIT (and fsync) waits behind this.
        journal._executor.submit(held.wait, WAIT)  # type: ignore[attr-defined]
        writer = asyncio.create_task(backend.write(SPACE, [job(1)], None))
        log = backend.engine(SPACE).changes
        assert log is not None
        await wait_until_async(lambda: log.head == 1, WAIT, what="the write to be applied in memory")
        for _ in range(20):  # the loop turns; the change is in memory, not durable: not shown
            await asyncio.sleep(0)
        assert not reader.done() and not writer.done()
        assert backend.readable(SPACE, log) == 0
        held.set()
        assert summary(await reader) == [(1, "write", 1)]
        await writer
        feed.close()


async def test_under_interval_a_feed_shows_a_change_before_its_batch_is_durable(
    tmp_path: Path, clock: FakeClock
) -> None:
    """Under `interval` a feed reads to the log's head, woken as a change is logged (the engine's
    `on_logged`); under `always` the batch's end wakes it, so the engine has no `on_logged`."""
    config = dataclasses.replace(make_config(tmp_path / "data"), durability="interval")
    async with running(config, clock) as backend:
        journal = backend.journal
        assert journal is not None and not journal.waits
        assert backend.engine(SPACE).on_logged is not None
        feed = await backend.changes(SPACE, [], ALL, since=None)
        reader = asyncio.create_task(read(feed, 1))
        held = threading.Event()
        journal._executor.submit(held.wait, WAIT)  # type: ignore[attr-defined]
        try:
            await backend.write(SPACE, [job(1)], None)  # answered at once: nothing is durable yet
            assert summary(await asyncio.wait_for(reader, WAIT)) == [(1, "write", 1)]
        finally:
            held.set()
        feed.close()
    async with running(make_config(tmp_path / "always"), clock) as backend:
        assert backend.journal is not None and backend.journal.waits
        assert backend.engine(SPACE).on_logged is None


async def test_check_counts_the_log_and_names_a_gap_and_a_write_without_its_payload(
    tmp_path: Path, clock: FakeClock
) -> None:
    async with running(make_config(tmp_path / "data"), clock) as backend:
        await backend.write(SPACE, [job(0), job(1), job(2)], None)
        await take(backend, 0)
    report = check_store(tmp_path / "data")
    assert report.ok and report.spaces[0].changes == 4
    assert "4 changes logged" in str(report)
    with sqlite3.connect(database_path(tmp_path / "data")) as db:
        db.execute("DELETE FROM changes WHERE seq = 2")  # a hole in the log
        db.execute("UPDATE changes SET payload = NULL WHERE seq = 4")  # the take that held entry 0's payload
        db.execute("DELETE FROM entries WHERE id = 3")  # and entry 2's row, without a change
    problems = "\n".join(check_store(tmp_path / "data").problems)
    assert "change 3 where 2 was due" in problems
    assert "change 3 is a write whose entry is gone" in problems
    assert "change 1 is a write whose entry is gone" in problems


async def test_a_memory_only_server_makes_a_new_epoch_at_each_start(clock: FakeClock) -> None:
    epochs = []
    for _ in range(2):
        async with running(make_config(None), clock) as backend:
            await backend.write(SPACE, [job(0)], None)
            log = backend.engine(SPACE).changes
            assert log is not None and log.head == 1
            epochs.append(log.epoch)
    assert epochs[0] != epochs[1]  # a cursor of the first process is compacted in the second
