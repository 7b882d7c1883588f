"""Takes with an acknowledgement deadline through the embedded backend, in memory and recorded in
a real SQLite store: deliver (nowait, blocking, many, in order), ack/nack/extend with their request
ids, delayed writes, dead letters into the dead-letter space, the metrics figures, describe and
browse; and across restarts of the durable store: a pending delivery stays ackable, one whose
deadline passed while down is visible with its count, a delayed entry and a dead letter survive,
and a format-1 data dir is migrated on open."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest

from outrig.service.backends.embedded.backend import EmbeddedBackend
from outrig.service.backends.embedded.store.check import check_store
from outrig.service.backends.embedded.store.schema import FORMAT_VERSION, database_path
from outrig.service.config import ServerConfig
from outrig.service.engine import FakeClock, NewEntry, SpaceSettings, StoredEntry, Template
from outrig.service.engine.model import Delivery, Templates
from outrig.service.exceptions import DeliveryExpiredError, InvalidArgumentError
from outrig.service.protocol import admin, codec
from outrig.v1 import space_pb2 as pb

from ..durability.test_restart import running
from ..field_values import value
from ..polling import wait_until_async
from ..store_formats import as_format_3

SPACE = "jobs"
WAIT = 5.0


def job(n: int, **fields: object) -> NewEntry:
    values = {"n": value(n), **{name: value(x) for name, x in fields.items()}}
    message = pb.Entry(type_name="Job", fields={name: codec.value_message(v) for name, v in values.items()})
    return NewEntry("Job", (), values, codec.payload_of(message), 10)


JOBS = Template("Job", {})


def numbers(entries: list[StoredEntry] | list[Delivery]) -> list[object]:
    return [(e.entry if isinstance(e, Delivery) else e).fields["n"].data for e in entries]


def make_config(data_dir: Path | None, **settings: object) -> ServerConfig:
    return ServerConfig(
        data_dir=data_dir,
        reap_interval=0.01,
        spaces={SPACE: SpaceSettings(**settings)},  # type: ignore[arg-type]
    )


async def deliver(backend: EmbeddedBackend, **options: object) -> list[Delivery]:
    kwargs: dict[str, object] = {"max_entries": 1, "timeout": 0, "ack": 30.0}
    kwargs.update(options)
    return await backend.deliver(SPACE, [JOBS], **kwargs)  # type: ignore[arg-type]


async def visible(backend: EmbeddedBackend) -> list[object]:
    chunks = [chunk async for chunk in backend.contents(SPACE, [JOBS], 0)]
    return numbers([stored for chunk in chunks for stored in chunk])


async def later(backend: EmbeddedBackend, clock: FakeClock, seconds: float) -> list[object]:
    """What is visible once the clock has moved `seconds` and the reaper has caught up."""
    clock.advance(seconds)
    await reaped(backend)
    return await visible(backend)


async def reaped(backend: EmbeddedBackend) -> None:
    """Let the reaper (every 0.01 s of real time) handle what the fake clock made due."""
    engine = backend.engine(SPACE)
    for _ in range(500):
        if engine.next_expiry() is None or engine.next_expiry() > backend.clock.time():  # type: ignore[operator]
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the reaper did not run")


# ---------------------------------------------------------------- one server


async def test_deliver_ack_nack_extend(data_dir: Path | None, clock: FakeClock) -> None:
    async with running(make_config(data_dir), clock) as backend:
        await backend.write(SPACE, [job(n) for n in range(3)], None)
        (first,) = await deliver(backend)
        assert numbers([first]) == [0] and first.deliveries == 1 and first.deadline == clock.time() + 30.0
        assert await visible(backend) == [1, 2] and await backend.count(SPACE, [JOBS]) == 2
        await backend.ack(SPACE, first.receipt)
        with pytest.raises(DeliveryExpiredError):
            await backend.ack(SPACE, first.receipt)
        (second,) = await deliver(backend)
        returned = await backend.nack(SPACE, second.receipt, 0.0)
        assert returned.visible_at is None and await visible(backend) == [1, 2]
        (third,) = await deliver(backend, ack=5.0)
        assert third.deliveries == 2 and third.receipt != second.receipt
        clock.advance(4.0)
        assert await backend.extend(SPACE, third.receipt, 10.0) == clock.time() + 10.0
        assert await later(backend, clock, 9.0) == [2]
        assert await later(backend, clock, 1.0) == [1, 2]
        with pytest.raises(DeliveryExpiredError):
            await backend.ack(SPACE, third.receipt)  # fenced: its deadline passed
        figures = (await backend.space_figures())[SPACE]
        assert (figures.in_flight, figures.delayed, figures.redelivered) == (0, 0, 2)


async def test_many_in_order_and_bad_input(data_dir: Path | None, clock: FakeClock) -> None:
    async with running(make_config(data_dir), clock) as backend:
        await backend.write(SPACE, [job(n, rank=10 - n) for n in range(4)], None)
        ordered = Templates([JOBS], [("rank", False)])
        many = await backend.deliver(SPACE, ordered, max_entries=3, timeout=0, ack=30.0)
        assert numbers(many) == [3, 2, 1]
        assert [d.receipt - many[0].receipt for d in many] == [0, 1, 2]
        with pytest.raises(InvalidArgumentError, match="ack"):
            await deliver(backend, ack=-1.0)
        with pytest.raises(InvalidArgumentError, match="delay"):
            await backend.nack(SPACE, many[0].receipt, -2.0)
        with pytest.raises(InvalidArgumentError, match="seconds"):
            await backend.extend(SPACE, many[0].receipt, 0.0)
        with pytest.raises(DeliveryExpiredError):
            await backend.nack(SPACE, 999_999, 0.0)  # never given


async def test_a_blocked_take_with_ack_is_woken_by_a_delayed_write(
    data_dir: Path | None, clock: FakeClock
) -> None:
    async with running(make_config(data_dir), clock) as backend:
        waiting = asyncio.ensure_future(deliver(backend, timeout=WAIT))
        await backend.write(SPACE, [job(7)], None, visible_at=clock.time() + 60.0)
        await asyncio.sleep(0.05)
        assert not waiting.done() and await visible(backend) == []
        assert (await backend.space_figures())[SPACE].delayed == 1
        clock.advance(60.0)
        (delivery,) = await asyncio.wait_for(waiting, WAIT)
        assert numbers([delivery]) == [7] and delivery.deliveries == 1
        await backend.ack(SPACE, delivery.receipt)
        assert (await backend.space_figures())[SPACE].entries == 0


async def test_a_cancelled_take_with_ack_puts_the_entry_back_uncounted(
    data_dir: Path | None, clock: FakeClock
) -> None:
    async with running(make_config(data_dir), clock) as backend:
        await backend.write(SPACE, [job(0)], None)
        (held,) = await deliver(backend)
        waiting = asyncio.ensure_future(deliver(backend, timeout=WAIT))
        await asyncio.sleep(0.05)
        await backend.nack(SPACE, held.receipt, 0.0)  # hands it to the waiter ...
        waiting.cancel()  # ... whose caller is gone before it could answer
        with pytest.raises(asyncio.CancelledError):
            await waiting
        (again,) = await deliver(backend)
        assert again.deliveries == 2  # the first delivery, and this one: not the cancelled one


async def test_request_ids_answer_retries(data_dir: Path | None, clock: FakeClock) -> None:
    async with running(make_config(data_dir), clock) as backend:
        await backend.write(SPACE, [job(n) for n in range(3)], None)
        first = await deliver(backend, max_entries=2, request_id="d-1")
        assert await deliver(backend, max_entries=2, request_id="d-1") == first  # nothing taken
        assert await visible(backend) == [2]
        await backend.ack(SPACE, first[0].receipt, request_id="a-1")
        await backend.ack(SPACE, first[0].receipt, request_id="a-1")  # a retry: no DeliveryExpiredError
        assert await deliver(backend, max_entries=2, request_id="d-1") == first[1:]  # still pending
        returned = await backend.nack(SPACE, first[1].receipt, 5.0, request_id="n-1")
        assert await backend.nack(SPACE, first[1].receipt, 5.0, request_id="n-1") == returned
        (other,) = await deliver(backend)
        deadline = await backend.extend(SPACE, other.receipt, 100.0, request_id="e-1")
        clock.advance(1.0)
        assert await backend.extend(SPACE, other.receipt, 100.0, request_id="e-1") == deadline


async def test_an_entry_past_max_deliveries_goes_to_the_dead_letter_space(
    data_dir: Path | None, clock: FakeClock
) -> None:
    async with running(make_config(data_dir, max_deliveries=2), clock) as backend:
        await backend.write(SPACE, [job(0)], 600.0)
        await backend.nack(SPACE, (await deliver(backend))[0].receipt, 0.0)
        (last,) = await deliver(backend, ack=1.0)
        clock.advance(1.0)
        await reaped(backend)  # the deadline ends the second delivery: dead-lettered
        assert await visible(backend) == []
        dead = await backend.deliver("jobs.dead", [JOBS], max_entries=1, timeout=0, ack=30.0)
        assert numbers(dead) == [0] and dead[0].deliveries == 3
        assert dead[0].dead_letter_reason == "max_deliveries=2 reached in space 'jobs'"
        assert dead[0].entry.expires_at == pytest.approx(clock.time() + 599.0)  # its lease goes on
        await backend.nack("jobs.dead", dead[0].receipt, 0.0)
        del last
        await backend.write(SPACE, [job(1)], None)
        (one,) = await deliver(backend, max_deliveries=1)
        returned = await backend.nack(SPACE, one.receipt, None)
        assert returned.dead_letter == "jobs.dead" and returned.visible_at is None
        figures = (await backend.space_figures())[SPACE]
        assert figures.dead_lettered == 2 and figures.entries == 0
        assert (await backend.space_figures())["jobs.dead"].entries == 2


async def test_describe_and_browse_show_deliveries(data_dir: Path | None, clock: FakeClock) -> None:
    async with running(make_config(data_dir, max_deliveries=4), clock) as backend:
        await backend.write(SPACE, [job(n) for n in range(3)], None)
        (delivery,) = await deliver(backend)
        await backend.write(SPACE, [job(3)], None, visible_at=clock.time() + 60.0)
        reply = admin.describe_reply(await backend.describe(SPACE))
        assert (reply.entries, reply.in_flight, reply.delayed) == (4, 1, 1)
        assert reply.configuration.max_deliveries == 4 and reply.configuration.dead_letter == "jobs.dead"
        found, _ = await backend.browse(SPACE, (), 0, 10)
        page = admin.browse_reply(found, 0)
        assert [e.delivery.receipt for e in page.entries] == [delivery.receipt, 0, 0, 0]
        assert page.entries[0].deliveries == 1 and page.entries[0].delivery.deadline == delivery.deadline
        assert [e.visible_at for e in page.entries] == [0.0, 0.0, 0.0, clock.time() + 60.0]


# ---------------------------------------------------------------- across restarts


@pytest.fixture
def durable(tmp_path: Path) -> ServerConfig:
    return make_config(tmp_path / "data", max_deliveries=2)


async def test_a_pending_delivery_survives_a_restart(durable: ServerConfig, clock: FakeClock) -> None:
    async with running(durable, clock) as backend:
        await backend.write(SPACE, [job(n) for n in range(3)], None)
        (pending,) = await deliver(backend, ack=60.0)
        (lapsing,) = await deliver(backend, ack=5.0)
        await backend.ack(SPACE, pending.receipt, request_id="ack-1")
        (kept,) = await deliver(backend, ack=60.0)
    clock.advance(10.0)
    async with running(durable, clock) as backend:
        # Its deadline passed while down: the first pass of the reaper ends it (counted, and
        # dead-lettered had it reached max_deliveries), and it is visible, first.
        async def shown() -> bool:
            return await visible(backend) == [1]

        await wait_until_async(shown, what="the lapsed delivery to be shown again")
        await backend.ack(SPACE, pending.receipt, request_id="ack-1")  # the retry is answered
        await backend.ack(SPACE, kept.receipt)  # still pending: the ack after a restart works
        (again,) = await deliver(backend)
        assert again.entry.id == lapsing.entry.id and again.deliveries == 2  # its count survived
        assert again.receipt > kept.receipt  # receipts are never handed out twice
    assert check_store(durable.data_dir).ok  # type: ignore[arg-type]


async def test_delayed_and_dead_entries_survive_a_restart(durable: ServerConfig, clock: FakeClock) -> None:
    async with running(durable, clock) as backend:
        await backend.write(SPACE, [job(0)], None, visible_at=clock.time() + 30.0)
        await backend.write(SPACE, [job(1)], None)
        (one,) = await deliver(backend, max_deliveries=1)
        assert (await backend.nack(SPACE, one.receipt, 0.0)).dead_letter == "jobs.dead"
        await backend.write(SPACE, [job(2)], None)
        (two,) = await deliver(backend)
        await backend.nack(SPACE, two.receipt, 20.0)
    async with running(durable, clock) as backend:
        assert await visible(backend) == []
        figures = (await backend.space_figures())[SPACE]
        assert (figures.entries, figures.delayed) == (2, 2)
        (dead,) = await backend.deliver("jobs.dead", [JOBS], max_entries=1, timeout=0, ack=30.0)
        assert numbers([dead]) == [1] and dead.deliveries == 2
        assert dead.dead_letter_reason == "max_deliveries=1 reached in space 'jobs'"
        assert await later(backend, clock, 20.0) == [2]
        assert await later(backend, clock, 10.0) == [0, 2]


async def test_a_format_1_data_dir_is_migrated(tmp_path: Path, clock: FakeClock) -> None:
    config = make_config(tmp_path / "data")
    async with running(config, clock) as backend:
        await backend.write(SPACE, [job(0)], None)
    path = database_path(tmp_path / "data")
    with sqlite3.connect(path) as db:  # what a format-1 server left: no delivery columns
        as_format_3(db)
        for column in ("hidden_until", "receipt", "deliveries", "dead_letter_reason", "max_deliveries"):
            db.execute(f"ALTER TABLE entries DROP COLUMN {column}")
        db.execute("PRAGMA user_version = 1")
    assert check_store(tmp_path / "data").format_version == 1  # outrig check reads it as it is
    async with running(config, clock) as backend:
        assert await visible(backend) == [0]
        (delivery,) = await deliver(backend)
    async with running(config, clock) as backend:
        await backend.ack(SPACE, delivery.receipt)
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == FORMAT_VERSION


async def test_check_counts_a_receipt_as_an_id_of_its_space(tmp_path: Path, clock: FakeClock) -> None:
    config = make_config(tmp_path / "data")
    async with running(config, clock) as backend:
        await backend.write(SPACE, [job(0)], None)
        (delivery,) = await deliver(backend)
    assert check_store(tmp_path / "data").ok
    with sqlite3.connect(database_path(tmp_path / "data")) as db:
        db.execute("UPDATE spaces SET next_id = ?", (delivery.receipt,))  # as if it were never handed out
    report = check_store(tmp_path / "data")
    assert any(f"next_id is {delivery.receipt} but entry {delivery.receipt}" in p for p in report.problems)


async def test_a_deadline_or_a_delay_ends_on_time_not_at_the_reapers_next_pass() -> None:
    """The reaper's passes are 60 s apart here: a deadline of 0.2 s and a delay of 0.3 s end
    when they are due, because filing a timer sooner than the next pass wakes the reaper."""
    backend = EmbeddedBackend(ServerConfig(reap_interval=60.0))
    await backend.start()
    try:
        await backend.write(SPACE, [job(1)], None)
        (delivery,) = await backend.deliver(
            SPACE, [JOBS], max_entries=1, timeout=0, ack=0.2, max_deliveries=0
        )
        async with asyncio.timeout(WAIT):  # parked: woken when the deadline shows the entry again
            (again,) = await backend.deliver(
                SPACE, [JOBS], max_entries=1, timeout=None, ack=30.0, max_deliveries=0
            )
        assert again.entry.id == delivery.entry.id and again.deliveries == 2
        await backend.ack(SPACE, again.receipt)
        (grant,) = await backend.write(SPACE, [job(2)], None, visible_at=backend.clock.time() + 0.3)
        async with asyncio.timeout(WAIT):
            found = await backend.match(
                SPACE, [JOBS], take=True, max_entries=1, timeout=None, if_exists=False
            )
        assert [e.id for e in found] == [grant.id]
    finally:
        await backend.close()
        await backend.shutdown()
