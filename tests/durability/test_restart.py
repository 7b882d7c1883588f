"""The embedded backend on a real SQLite store: what a restart on the same data dir gives back.

Each test runs a backend, stops it (or abandons it, as a crash would), and starts a new one on
the same directory. Lease times follow a FakeClock, so "expired while the server was down" is a
clock step, not a sleep.
"""

from __future__ import annotations

import asyncio
import dataclasses
import sqlite3
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path

import pytest

from outrig.service.backends.embedded.backend import EmbeddedBackend
from outrig.service.backends.embedded.store.recovery import SEQUENCE_JUMP
from outrig.service.backends.embedded.store.schema import FORMAT_VERSION, database_path
from outrig.service.config import ServerConfig
from outrig.service.engine import FakeClock, NewEntry, Template
from outrig.service.exceptions import (
    IncompatibleStoreError,
    LeaseNotFoundError,
    RegistrationBusyError,
    RequestConflictError,
    StoreError,
    StoreLockedError,
    StoreUnavailableError,
    TransactionAbortedError,
    TypeConflictError,
)
from outrig.service.protocol import codec
from outrig.v1 import space_pb2 as pb

from ..field_values import value
from ..polling import wait_for_waiters_async, wait_until_async
from ..store_formats import as_format_3, as_format_4

SPACE = "s"


def entry(type_name: str = "Task", *supertypes: str, **fields: object) -> NewEntry:
    message = pb.Entry(
        type_name=type_name,
        supertypes=supertypes,
        fields={name: codec.value_message(value(x)) for name, x in fields.items()},
    )
    return codec.new_entry(message, "entry", ServerConfig().limits)


def template(type_name: str = "Task", **fields: object) -> Template:
    return Template(type_name, {name: value(x) for name, x in fields.items()})


def numbers(found: list) -> list[object]:
    return [stored.fields["n"].data for stored in found]


Runner = Callable[[], AbstractAsyncContextManager[EmbeddedBackend]]


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(1_000_000.0)


@pytest.fixture
def config(tmp_path: Path) -> ServerConfig:
    return ServerConfig(data_dir=tmp_path / "data", reap_interval=0.01)


@asynccontextmanager
async def running(
    config: ServerConfig, clock: FakeClock, *, crash: bool = False
) -> AsyncIterator[EmbeddedBackend]:
    """A started backend; on exit it stops cleanly, or with crash=True is abandoned after its
    queued changes were written (what a SIGKILL right after the last reply leaves)."""
    backend = EmbeddedBackend(config, clock)
    await backend.start()
    try:
        yield backend
    finally:
        if crash:
            journal = backend.journal
            assert journal is not None
            if journal.pending is not None:
                await journal.pending
        await backend.close()
        await backend.shutdown()


async def take(backend: EmbeddedBackend, *templates: Template, **options: object) -> list:
    kwargs: dict[str, object] = {"take": True, "max_entries": 1, "timeout": 0, "if_exists": False}
    kwargs.update(options)
    return await backend.match(SPACE, templates or (template(),), **kwargs)  # type: ignore[arg-type]


async def read_all(backend: EmbeddedBackend) -> list:
    chunks = [chunk async for chunk in backend.contents(SPACE, [template()], 0)]
    return [stored for chunk in chunks for stored in chunk]


async def test_entries_come_back_with_their_ids_order_and_leases(
    config: ServerConfig, clock: FakeClock
) -> None:
    async with running(config, clock) as backend:
        grants = await backend.write(SPACE, [entry(n=i) for i in range(5)], 100.0)
        forever = await backend.write(SPACE, [entry(n=5)], float("inf"))
        await take(backend, template(n=2))
    async with running(config, clock) as backend:
        found = await read_all(backend)
        assert numbers(found) == [0, 1, 3, 4, 5]
        assert [stored.id for stored in found] == [g.id for g in grants if g.id != grants[2].id] + [
            forever[0].id
        ]
        assert found[0].expires_at == grants[0].expires_at
        assert found[-1].expires_at is None
        assert found[0].payload == entry(n=0).payload


async def test_leases_that_ran_out_while_down_are_expired(config: ServerConfig, clock: FakeClock) -> None:
    async with running(config, clock) as backend:
        await backend.write(SPACE, [entry(n=1)], 10.0)
        await backend.write(SPACE, [entry(n=2)], 1000.0)
    clock.advance(60.0)
    async with running(config, clock) as backend:
        assert numbers(await read_all(backend)) == [2]
        assert backend.recovery is not None and backend.recovery.expired == 1
    with sqlite3.connect(database_path(config.data_dir)) as db:  # type: ignore[arg-type]
        assert db.execute("SELECT count(*) FROM entries").fetchone()[0] == 1


async def test_renewals_and_cancels_are_kept(config: ServerConfig, clock: FakeClock) -> None:
    async with running(config, clock) as backend:
        short, cancelled = await backend.write(SPACE, [entry(n=1), entry(n=2)], 10.0)
        (renewed,) = await backend.renew(SPACE, [(short.id, 500.0)])
        assert await backend.cancel(SPACE, [cancelled.id]) == [None]
    clock.advance(60.0)
    async with running(config, clock) as backend:
        (found,) = await read_all(backend)
        assert found.id == short.id
        assert found.expires_at == renewed.expires_at  # type: ignore[union-attr]


async def test_ids_are_never_handed_out_twice(config: ServerConfig, clock: FakeClock) -> None:
    async with running(config, clock) as backend:
        grants = await backend.write(SPACE, [entry(n=i) for i in range(3)], None)
        await take(backend, template(n=2))  # the highest id leaves the space
    async with running(config, clock) as backend:
        (again,) = await backend.write(SPACE, [entry(n=9)], None)
        assert again.id > max(g.id for g in grants)
        # The old lease of the taken entry names nothing, not the new entry.
        (result,) = await backend.renew(SPACE, [(grants[2].id, 10.0)])
        assert isinstance(result, LeaseNotFoundError)


async def test_type_declarations_survive_even_without_entries(config: ServerConfig, clock: FakeClock) -> None:
    async with running(config, clock) as backend:
        await backend.write(SPACE, [entry("Dog", "Animal", n=1)], None)
        await take(backend, template("Dog"))
    async with running(config, clock) as backend:
        with pytest.raises(TypeConflictError):
            await backend.write(SPACE, [entry("Dog", "Plant", n=1)], None)


async def test_a_crash_keeps_what_was_acknowledged(config: ServerConfig, clock: FakeClock) -> None:
    async with running(config, clock, crash=True) as backend:
        await backend.write(SPACE, [entry(n=1), entry(n=2)], None)
        await take(backend, template(n=1))
    async with running(config, clock) as backend:
        assert numbers(await read_all(backend)) == [2]


async def test_interval_replies_at_once_and_commits_within_the_interval(
    config: ServerConfig, clock: FakeClock
) -> None:
    config = dataclasses.replace(config, durability="interval", commit_interval_ms=50)
    path = database_path(config.data_dir)  # type: ignore[arg-type]
    async with running(config, clock) as backend:
        journal = backend.journal
        assert journal is not None
        await backend.write(SPACE, [entry(n=1)], None)
        assert journal.pending is not None  # acknowledged, not yet durable
        await wait_until_async(lambda: journal.pending is None, 2.0, what="an interval of 50 ms to commit")
        with sqlite3.connect(path) as db:
            assert db.execute("SELECT count(*) FROM entries").fetchone()[0] == 1


# ---------------------------------------------------------------- notify registrations


async def test_a_registration_resumes_after_a_restart_with_a_jump(
    config: ServerConfig, clock: FakeClock
) -> None:
    async with running(config, clock, crash=True) as backend:
        subscription = await backend.subscribe(SPACE, [template("Task")], 600.0)
        registration = subscription.lease.id
        await backend.write(SPACE, [entry(n=1)], None)
        first = await anext(aiter(subscription))
        assert first.sequence == 1
    async with running(config, clock) as backend:
        resumed = await backend.subscribe(SPACE, (), None, resume=registration)
        assert resumed.lease.id == registration
        with pytest.raises(RegistrationBusyError):
            await backend.subscribe(SPACE, (), None, resume=registration)
        await backend.write(SPACE, [entry("Other", n=0), entry(n=2)], None)
        event = await asyncio.wait_for(anext(aiter(resumed)), 5.0)
        # Numbered from the stored sequence (0, as registered) + 2**31: a gap after event 1.
        assert event.sequence == SEQUENCE_JUMP + 1 > first.sequence + 1
        assert numbers([event.entry]) == [2]
        resumed.close()
    async with running(config, clock) as backend:
        with pytest.raises(LeaseNotFoundError):  # the listener left, so the registration ended
            await backend.subscribe(SPACE, (), None, resume=registration)


async def test_a_registration_that_expired_while_down_is_gone(config: ServerConfig, clock: FakeClock) -> None:
    async with running(config, clock, crash=True) as backend:
        registration = (await backend.subscribe(SPACE, [template()], 30.0)).lease.id
    clock.advance(60.0)
    async with running(config, clock) as backend:
        with pytest.raises(LeaseNotFoundError):
            await backend.subscribe(SPACE, (), None, resume=registration)


# ---------------------------------------------------------------- request ids


async def test_a_retried_write_acts_once_across_a_restart(config: ServerConfig, clock: FakeClock) -> None:
    async with running(config, clock, crash=True) as backend:
        first = await backend.write(SPACE, [entry(n=1)], 60.0, request_id="w-1")
    async with running(config, clock) as backend:
        again = await backend.write(SPACE, [entry(n=1)], 60.0, request_id="w-1")
        assert again == first
        assert numbers(await read_all(backend)) == [1]
        with pytest.raises(RequestConflictError, match="w-1"):
            await take(backend, request_id="w-1")


async def test_a_retried_take_returns_the_same_entries_across_a_restart(
    config: ServerConfig, clock: FakeClock
) -> None:
    async with running(config, clock, crash=True) as backend:
        await backend.write(SPACE, [entry(n=i) for i in range(3)], None)
        first = await take(backend, max_entries=2, request_id="t-1")
    async with running(config, clock) as backend:
        again = await take(backend, max_entries=2, request_id="t-1")
        assert [s.id for s in again] == [s.id for s in first]
        assert [s.payload for s in again] == [s.payload for s in first]
        assert numbers(await read_all(backend)) == [2]  # nothing was taken twice


async def test_request_ids_of_a_refused_batch_act_afresh_and_those_of_a_committed_one_once(
    config: ServerConfig, clock: FakeClock
) -> None:
    """The end of a batch settles every request id in it (Recorder: one callback per batch): two
    writes refused in one batch are forgotten, so their retries act; a committed one's retry is
    answered from the store and writes nothing."""
    assert config.data_dir is not None
    path = database_path(config.data_dir)
    async with running(config, clock) as backend:
        assert backend.journal is not None
        backend.journal._probe_interval = 0.01  # type: ignore[attr-defined]
        (kept,) = await backend.write(SPACE, [entry(n=1)], None, request_id="w-ok")
        with sqlite3.connect(path) as db:  # a real SQLite error for the next batch with an entry
            db.execute("CREATE TRIGGER refuse BEFORE INSERT ON entries BEGIN SELECT RAISE(ABORT, 'no'); END")
        refused = await asyncio.gather(
            backend.write(SPACE, [entry(n=2)], None, request_id="w-a"),
            backend.write(SPACE, [entry(n=3)], None, request_id="w-b"),
            return_exceptions=True,
        )
        assert [type(error) for error in refused] == [StoreUnavailableError, StoreUnavailableError]
        with sqlite3.connect(path) as db:
            db.execute("DROP TRIGGER refuse")

        async def accepted() -> bool:
            try:
                await backend.write(SPACE, [entry(n=2)], None, request_id="w-a")
            except StoreUnavailableError:
                return False
            return True

        await wait_until_async(accepted, 10.0, what="the store to accept changes again")
        await backend.write(SPACE, [entry(n=3)], None, request_id="w-b")
        assert await backend.write(SPACE, [entry(n=1)], None, request_id="w-ok") == [kept]
        assert numbers(await read_all(backend)) == [1, 2, 3]  # in arrival order


async def test_a_call_cancelled_while_its_change_commits_still_counts(
    config: ServerConfig, clock: FakeClock
) -> None:
    """The client gave up waiting (its call was cancelled) after the change was queued: the retry
    must get that change's result, not act a second time."""
    async with running(config, clock) as backend:
        await backend.write(SPACE, [entry(n=1)], None)
        writing = asyncio.create_task(backend.write(SPACE, [entry(n=2)], None, request_id="w-2"))
        taking = asyncio.create_task(take(backend, template(n=1), request_id="t-1"))
        await asyncio.sleep(0)  # both are now waiting for their batch
        writing.cancel()
        taking.cancel()
        with pytest.raises(asyncio.CancelledError):
            await writing
        with pytest.raises(asyncio.CancelledError):
            await taking
        (grant,) = await backend.write(SPACE, [entry(n=2)], None, request_id="w-2")
        (taken,) = await take(backend, template(n=1), request_id="t-1")
        assert numbers([taken]) == [1]
        found = await read_all(backend)
        assert numbers(found) == [2]
        assert found[0].id == grant.id


async def test_request_ids_are_forgotten_after_their_window(config: ServerConfig, clock: FakeClock) -> None:
    config = dataclasses.replace(config, request_window=30.0)
    async with running(config, clock) as backend:
        await backend.write(SPACE, [entry(n=1)], None, request_id="w-1")
    clock.advance(60.0)
    async with running(config, clock) as backend:
        await backend.write(SPACE, [entry(n=1)], None, request_id="w-1")  # acts again
        assert numbers(await read_all(backend)) == [1, 1]


async def test_the_reaper_deletes_request_ids_past_their_window(
    config: ServerConfig, clock: FakeClock
) -> None:
    config = dataclasses.replace(config, request_window=30.0)
    path = database_path(config.data_dir)  # type: ignore[arg-type]
    async with running(config, clock) as backend:
        await backend.write(SPACE, [entry(n=1)], None, request_id="w-1")
        await take(backend, request_id="t-1")
        with sqlite3.connect(path) as db:  # the take's id is in its taken row only (format 5)
            assert db.execute("SELECT id FROM requests").fetchall() == [("w-1",)]
            assert db.execute("SELECT count(*) FROM entries WHERE taken_by = 't-1'").fetchone()[0] == 1
        clock.advance(60.0)

        def pruned() -> bool:
            with sqlite3.connect(path) as db:
                left = db.execute(
                    "SELECT (SELECT count(*) FROM requests)"
                    " + (SELECT count(*) FROM entries WHERE taken_by IS NOT NULL)"
                )
                return bool(left.fetchone()[0] == 0)

        # The reaper passes every 10 ms of real time.
        await wait_until_async(pruned, 5.0, what="the request ids past their window to leave the store")


async def test_request_ids_work_in_memory_too(clock: FakeClock) -> None:
    async with running(ServerConfig(in_memory=True, data_dir=None), clock) as backend:
        first = await backend.write(SPACE, [entry(n=1)], None, request_id="w-1")
        assert await backend.write(SPACE, [entry(n=1)], None, request_id="w-1") == first
        taken = await take(backend, request_id="t-1")
        assert [s.id for s in await take(backend, request_id="t-1")] == [s.id for s in taken]


async def test_a_retry_in_flight_waits_for_the_first_call(config: ServerConfig, clock: FakeClock) -> None:
    async with running(config, clock) as backend:
        first = asyncio.create_task(take(backend, timeout=5.0, request_id="t-1"))
        await wait_for_waiters_async(backend, SPACE, 1)
        second = asyncio.create_task(take(backend, timeout=5.0, request_id="t-1"))
        # One step of the loop runs the retry up to its wait for the first call (nothing before it
        # awaits): it does not park a waiter of its own.
        await asyncio.sleep(0)
        assert (await backend.space_figures())[SPACE].waiters == 1
        await backend.write(SPACE, [entry(n=7)], None)
        one, two = await asyncio.wait_for(asyncio.gather(first, second), 5.0)
        assert numbers(one) == numbers(two) == [7]


# ---------------------------------------------------------------- refusing a data dir


async def test_a_second_server_on_the_same_data_dir_is_refused(
    config: ServerConfig, clock: FakeClock
) -> None:
    async with running(config, clock):
        second = EmbeddedBackend(config, clock)
        with pytest.raises(StoreLockedError, match="in use by another outrig server"):
            await second.start()


async def test_a_store_of_another_format_is_refused(config: ServerConfig, clock: FakeClock) -> None:
    async with running(config, clock) as backend:
        await backend.write(SPACE, [entry(n=1)], None)
    with sqlite3.connect(database_path(config.data_dir)) as db:  # type: ignore[arg-type]
        db.execute(f"PRAGMA user_version = {FORMAT_VERSION + 1}")
    with pytest.raises(
        IncompatibleStoreError, match=f"format {FORMAT_VERSION + 1}, written by a newer outrig"
    ):
        await EmbeddedBackend(config, clock).start()
    # The refusal released the lock: the right version could start at once.


async def test_a_store_with_a_row_that_does_not_decode_is_refused_clearly(
    config: ServerConfig, clock: FakeClock
) -> None:
    async with running(config, clock) as backend:
        await backend.write(SPACE, [entry(n=1)], None)
    with sqlite3.connect(database_path(config.data_dir)) as db:  # type: ignore[arg-type]
        db.execute("UPDATE entries SET payload = x'ff00ff'")
    with pytest.raises(StoreError, match=r"cannot be loaded .*outrig check"):
        await EmbeddedBackend(config, clock).start()


async def test_a_registration_made_last_still_reserves_its_id(config: ServerConfig, clock: FakeClock) -> None:
    async with running(config, clock) as backend:
        await backend.write(SPACE, [entry(n=1)], None)
        subscription = await backend.subscribe(SPACE, [template()], 60.0)
        registration = subscription.lease.id
        assert await backend.cancel(SPACE, [registration]) == [None]
    async with running(config, clock) as backend:
        (grant,) = await backend.write(SPACE, [entry(n=2)], None)
        assert grant.id > registration


async def test_a_file_that_is_not_a_store_is_refused(config: ServerConfig, clock: FakeClock) -> None:
    assert config.data_dir is not None
    config.data_dir.mkdir()
    database_path(config.data_dir).write_bytes(b"not a database" * 100)
    with pytest.raises(IncompatibleStoreError):
        await EmbeddedBackend(config, clock).start()


async def test_a_retried_commit_is_answered_across_a_restart_in_each_space(
    config: ServerConfig, clock: FakeClock
) -> None:
    """Two spaces committed a transaction of the same id (each numbers its own leases): after a
    restart, a retry of either commit is answered OK, and an abort of it is told it committed."""
    async with running(config, clock, crash=True) as backend:
        grants = {space: await backend.begin(space, 60.0) for space in (SPACE, "other")}
        assert grants[SPACE].id == grants["other"].id
        for space, grant in grants.items():
            await backend.write(space, [entry(n=1)], None, transaction=grant.id)
            await backend.commit(space, grant.id)
    async with running(config, clock) as backend:
        for space, grant in grants.items():
            await backend.commit(space, grant.id)
            with pytest.raises(TransactionAbortedError, match="has committed"):
                await backend.abort(space, grant.id)
        assert numbers(await read_all(backend)) == [1]


async def test_a_format_4_data_dir_is_migrated_with_its_takes_request_ids(
    config: ServerConfig, clock: FakeClock
) -> None:
    """Format 5 keeps a take's request id in its taken rows only: a format-4 take's request row
    goes at the migration and its retry is still answered from the rows, after the migration and
    after a second restart; a take whose request row is there but whose rows are gone is still
    remembered (its retry takes nothing) until its window ends."""
    async with running(config, clock) as backend:
        await backend.write(SPACE, [entry(n=1), entry(n=2), entry(n=3)], None, request_id="w-1")
        first = await take(backend, max_entries=2, request_id="t-1")
        await take(backend, request_id="t-gone")
    path = database_path(config.data_dir)  # type: ignore[arg-type]
    with sqlite3.connect(path) as db:
        as_format_4(db)
        db.execute("DELETE FROM entries WHERE taken_by = 't-gone'")  # its request row stays
        assert sorted(db.execute("SELECT id FROM requests").fetchall()) == [("t-1",), ("t-gone",), ("w-1",)]
    for _ in range(2):
        async with running(config, clock) as backend:
            again = await take(backend, max_entries=2, request_id="t-1")
            assert [s.id for s in again] == [s.id for s in first]
            assert [s.payload for s in again] == [s.payload for s in first]
            assert await take(backend, request_id="t-gone") == []  # remembered: it takes nothing
            assert numbers(await read_all(backend)) == []
            await backend.write(SPACE, [entry(n=4)], None)
            assert await take(backend, request_id="t-gone") == []  # still: not entry 4
        with sqlite3.connect(path) as db:
            assert db.execute("PRAGMA user_version").fetchone()[0] == FORMAT_VERSION == 5
            assert sorted(db.execute("SELECT id FROM requests").fetchall()) == [("t-gone",), ("w-1",)]
        async with running(config, clock) as backend:  # entry 4 back for the next round
            assert numbers(await take(backend)) == [4]


async def test_a_format_3_data_dir_is_migrated_with_its_request_ids(
    config: ServerConfig, clock: FakeClock
) -> None:
    """Format 4 keys request ids by their window's end: a write's and a take's ids recorded by a
    format-3 server still answer their retries after the migration, and a taken row whose request
    row is gone is removed at start instead of kept for ever."""
    async with running(config, clock) as backend:
        grants = await backend.write(SPACE, [entry(n=1), entry(n=2), entry(n=3)], None, request_id="w-1")
        first = await take(backend, max_entries=2, request_id="t-1")
        await take(backend, request_id="t-gone")
    path = database_path(config.data_dir)  # type: ignore[arg-type]
    with sqlite3.connect(path) as db:
        as_format_3(db)
        db.execute("DELETE FROM requests WHERE id = 't-gone'")
    async with running(config, clock) as backend:
        retried = await backend.write(SPACE, [entry(n=1), entry(n=2), entry(n=3)], None, request_id="w-1")
        assert retried == grants
        again = await take(backend, max_entries=2, request_id="t-1")
        assert [s.id for s in again] == [s.id for s in first]
        assert [s.payload for s in again] == [s.payload for s in first]
        assert numbers(await read_all(backend)) == []
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == FORMAT_VERSION == 5
        taken = db.execute("SELECT taken_by, taken_until FROM entries ORDER BY id").fetchall()
        (until,) = db.execute("SELECT expires_at FROM requests WHERE id = 'w-1'").fetchone()
        assert taken == [("t-1", until), ("t-1", until)]  # t-gone's row left at the start
        # format 5: the take's id is in its taken rows only, its request row gone at the migration
        assert db.execute("SELECT id FROM requests").fetchall() == [("w-1",)]
