"""The blocking SDK against a real server process: every operation, end to end."""

from __future__ import annotations

import array
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any, cast

import numpy as np
import pytest

import outrig
from outrig.testing import LocalServer

from ..polling import once_parked, wait_for_waiters, wait_for_waiters_async
from .entries import Animal, Dog, Everything, Puppy, Task


@pytest.fixture(params=[True, False], ids=["mux", "unary"])
def space(request, server, space_name):
    with outrig.connect(server.address, space=space_name, mux=request.param) as space:
        yield space


def test_write_take_round_trips_every_value_kind(space):
    samples = np.arange(5, dtype=np.float32)
    entry = Everything(
        flag=True,
        count=-(2**63),
        ratio=-0.0,
        text="héllo",
        blob=b"\x00\xff",
        ints=array.array("i", [1, -2, 3]),
        samples=samples,
        items=[1, 1.0, True, None, "s", [b"x"]],
        meta={"b": {"z": 1}, "a": [2.5]},
    )
    space.write(entry, lease=60.0)
    got = space.take(Everything(), timeout=5.0)
    assert isinstance(got, Everything)
    assert got.flag is True and got.count == -(2**63) and str(got.ratio) == "-0.0"
    assert (got.text, got.blob, got.items, got.meta) == (entry.text, entry.blob, entry.items, entry.meta)
    assert isinstance(got.ints, array.array) and got.ints == entry.ints
    assert isinstance(got.samples, np.ndarray) and got.samples.dtype == np.float32
    assert np.array_equal(got.samples, samples)


def test_supertype_template_returns_the_real_type(space):
    space.write(Puppy(name="rex", legs=4, breed="collie", age_weeks=9))
    space.write(Task(job="x"))
    for template in (Animal(), Animal(legs=4), Dog(breed="collie"), Puppy(age_weeks=9)):
        got = space.read_nowait(template)
        assert isinstance(got, Puppy), template
        assert got == Puppy(name="rex", legs=4, breed="collie", age_weeks=9)
    assert space.read_nowait(Puppy(age_weeks=10)) is None
    assert space.count(Animal()) == 1


def test_subtype_only_fields_are_wildcards_for_a_supertype_template(space):
    space.write(Dog(name="a", legs=4, breed="pug"))
    space.write(Animal(name="b", legs=2))
    assert {a.name for a in space.contents(Animal(), max_entries=0)} == {"a", "b"}
    assert [d.name for d in space.contents(Dog())] == ["a"]  # a supertype entry never matches a subtype


def test_equality_is_by_canonical_form(space):
    space.write(Everything(count=1))
    assert space.read_nowait(Everything(ratio=1.0)) is None
    assert space.read_nowait(Everything(flag=True)) is None
    assert space.read_nowait(Everything(count=1)) is not None
    space.write(Everything(meta={"x": 1, "y": 2}))
    assert space.read_nowait(Everything(meta={"y": 2, "x": 1})) is not None
    assert space.read_nowait(Everything(meta={"y": 2, "x": 1.0})) is None


def test_read_leaves_take_removes_and_fifo_order(space):
    space.write_many([Task(job="j", n=i) for i in range(5)], lease=60.0)
    assert space.read(Task(job="j"), timeout=1.0) == Task(job="j", n=0)
    assert [space.take_nowait(Task(job="j")).n for _ in range(5)] == [0, 1, 2, 3, 4]
    assert space.take_nowait(Task(job="j")) is None


def test_take_one_of_many_matching_on_a_field(space):
    space.write_many([Task(job=f"j{i % 3}", n=i) for i in range(30)])
    got = space.take(Task(job="j2"), timeout=1.0)
    assert got == Task(job="j2", n=2)
    assert space.count(Task(job="j2")) == 9
    assert space.count(Task()) == 29


def test_blocking_take_is_woken_by_a_later_write(space, server):
    written = once_parked(server, space.name, lambda: space.write(Task(job="late", n=7)))
    got = space.take(Task(job="late"), timeout=10.0)
    written.result()
    assert got == Task(job="late", n=7)
    assert space.count(Task()) == 0


def test_non_matching_write_does_not_wake_a_blocked_take(space, server):
    written = once_parked(server, space.name, lambda: space.write(Task(job="other")))
    assert space.take(Task(job="wanted"), timeout=0.5) is None
    written.result()
    assert space.count(Task(job="other")) == 1


def test_timeouts_return_none_or_empty(space):
    assert space.read(Task(), timeout=0.05) is None
    assert space.take(Task(), timeout=0.05) is None
    assert space.take_many(Task(), max_entries=10, timeout=0.05) == []
    assert space.read_nowait(Task()) is None


def test_read_many_and_take_many(space):
    space.write_many([Task(n=i) for i in range(7)])
    assert [t.n for t in space.read_many(Task(), max_entries=3)] == [0, 1, 2]
    assert [t.n for t in space.take_many(Task(), max_entries=5, timeout=1.0)] == [0, 1, 2, 3, 4]
    assert [t.n for t in space.take_many([Task(n=6), Task(n=5)], max_entries=10)] == [5, 6]
    assert space.count(Task()) == 0


def test_take_many_blocks_until_one_arrives(space, server):
    written = once_parked(server, space.name, lambda: space.write(Task(n=1)))
    assert space.take_many(Task(), max_entries=10, timeout=10.0) == [Task(n=1)]
    written.result()


def test_contents_streams_every_match_in_order_across_chunks(space):
    space.write_many([Task(job="c", n=i) for i in range(600)])  # more than one 256-entry chunk
    assert [t.n for t in space.contents(Task(job="c"))] == list(range(600))
    assert [t.n for t in space.contents(Task(), max_entries=10)] == list(range(10))
    assert space.count([Task(n=1), Task(n=2), Task(n=1)]) == 2


def test_write_many_is_all_or_nothing(space):
    bad_batch = [outrig.GenericEntry("it.Mixed", ("it.Base",), {}), outrig.GenericEntry("it.Mixed", (), {})]
    with pytest.raises(outrig.FailedPreconditionError, match="supertypes"):
        space.write_many(bad_batch)
    assert space.count(outrig.GenericEntry("it.Mixed")) == 0


def test_many_concurrent_takers_never_get_the_same_entry(space, server):
    total = 200
    space.write_many([Task(job="race", n=i) for i in range(total)])

    def taker(_: int) -> list[int | None]:
        with outrig.connect(server.address, space=space.name) as own:
            taken: list[int | None] = []
            while (entry := own.take_nowait(Task(job="race"))) is not None:
                taken.append(cast(Task, entry).n)
            return taken

    with ThreadPoolExecutor(8) as pool:
        results = [n for batch in pool.map(taker, range(8)) for n in batch]
    assert Counter(results) == Counter(range(total))


def test_blocked_takers_share_writes_one_each(space, server):
    def taker(_: int):
        with outrig.connect(server.address, space=space.name) as own:
            return own.take(Task(job="w"), timeout=10.0)

    with ThreadPoolExecutor(5) as pool:
        futures = [pool.submit(taker, i) for i in range(5)]
        wait_for_waiters(server, space.name, 5)
        for i in range(5):
            space.write(Task(job="w", n=i))
        got = sorted(f.result().n for f in futures)
    assert got == [0, 1, 2, 3, 4]


def test_large_arrays_round_trip(space):
    hd = np.arange(921_600, dtype=np.int32)
    space.write(Everything(text="hd", samples=hd))
    got = space.take(Everything(text="hd"), timeout=5.0)
    assert got.samples.dtype == np.int32 and np.array_equal(got.samples, hd)
    ints = array.array("d", range(100_000))
    space.write(Everything(text="arr", ints=ints))
    assert space.read(Everything(ints=ints), timeout=5.0).ints == ints  # a large value as a template


def test_renew_and_cancel(space):
    lease = space.write(Task(n=1), lease=30.0)
    assert lease.expires_at == pytest.approx(time.time() + 30.0, abs=5)
    lease.renew(outrig.FOREVER)
    assert lease.expires_at is None
    lease.renew(120.0)
    assert lease.duration == pytest.approx(120.0)
    lease.cancel()
    assert space.read_nowait(Task()) is None
    with pytest.raises(outrig.NotFoundError, match=str(lease.id)):
        lease.cancel()
    with pytest.raises(outrig.NotFoundError):
        lease.renew(10.0)


def test_renew_many_and_cancel_many_report_each_lease(space):
    leases = space.write_many([Task(n=i) for i in range(3)], lease=30.0)
    leases[1].cancel()
    renewed = space.renew_many(leases, 90.0)
    assert [r.error is None for r in renewed] == [True, False, True]
    assert isinstance(renewed[1].error, outrig.NotFoundError)
    cancelled = space.cancel_many(leases)
    assert [r.error is None for r in cancelled] == [True, False, True]
    assert space.count(Task()) == 0


def test_taken_entry_lease_is_gone(space):
    lease = space.write(Task(n=1))
    space.take_nowait(Task())
    with pytest.raises(outrig.NotFoundError):
        lease.renew(10.0)


def test_notify_streams_matching_writes_with_increasing_sequence(space):
    with space.notify(Task(job="n"), lease=60.0) as events:
        space.write(Task(job="n", n=1))
        space.write(Task(job="other", n=2))
        space.write_many([Task(job="n", n=3), Task(job="n", n=4)])
        got = [next(events) for _ in range(3)]
        assert [e.sequence for e in got] == [1, 2, 3]
        assert [e.entry.n for e in got] == [1, 3, 4]
        events.lease.cancel()
        assert list(events) == []  # the stream ends with its lease


def test_notify_fires_for_entries_taken_by_a_waiter(space, server):
    with space.notify(Task(), lease=60.0) as events:
        result = []
        waiter = threading.Thread(target=lambda: result.append(space.take(Task(), timeout=10.0)))
        waiter.start()
        wait_for_waiters(server, space.name, 1)
        space.write(Task(n=5))
        waiter.join()
        assert result == [Task(n=5)]
        assert next(events).entry == Task(n=5)


@pytest.mark.parametrize("mux", [True, False], ids=["mux", "unary"])
def test_notify_registration_expires(mux):
    with (
        LocalServer(fake_clock=True) as server,
        outrig.connect(server.address, mux=mux) as space,
        space.notify(Task(), lease=0.3) as events,
    ):
        assert server.clock is not None
        server.clock.advance(0.4)
        assert list(events) == []  # ends when the 0.3 s lease runs out (reaped within 0.05 s)


def test_spaces_are_isolated(space):
    space.write(Task(n=1))
    other = space.with_space(space.name + "-other")
    assert other.read_nowait(Task()) is None
    other.write(Task(n=2))
    assert space.take_nowait(Task()).n == 1


def test_unknown_types_come_back_generic(space):
    space.write(outrig.GenericEntry("elsewhere.Thing", ("elsewhere.Base",), {"x": 1}))
    got = space.take_nowait(outrig.GenericEntry("elsewhere.Base"))
    assert got == outrig.GenericEntry("elsewhere.Thing", ("elsewhere.Base",), {"x": 1})


@pytest.mark.parametrize(
    ("call", "needle"),
    [
        (lambda s: s.take(Task(), timeout=-1.0), "timeout"),
        (lambda s: s.take(Task(), timeout=float("nan")), "timeout"),
        (lambda s: s.write(Task(), lease=-5.0), "lease"),
        (lambda s: s.write(Task(), lease=float("inf")), "lease"),
        (lambda s: s.take_many(Task(), max_entries=0), "max_entries"),
        (lambda s: s.with_space("no spaces allowed").count(Task()), "space"),
        (lambda s: s.write(outrig.GenericEntry("", (), {})), "type_name"),
    ],
)
def test_bad_input_is_invalid_argument_naming_the_field(space, call, needle):
    with pytest.raises(outrig.InvalidArgumentError) as info:
        call(space)
    assert needle in info.value.details
    assert space.count(Task()) == 0  # and the server still serves


def test_client_side_type_errors_name_the_field(space):
    with pytest.raises(TypeError, match="job"):
        space.write(Task(job=object()))  # type: ignore[arg-type]  # the error under test
    with pytest.raises(ValueError, match="n"):
        space.write(Task(n=2**64))


def test_unreachable_server_is_unavailable():
    started = time.monotonic()
    with (
        outrig.connect("127.0.0.1:1", space="x", retry_deadline=1.0) as space,
        pytest.raises(outrig.UnavailableError),
    ):
        space.count(Task())
    assert 1.0 <= time.monotonic() - started < 20.0  # retried up to its deadline, then gave up


def test_lease_expiry_on_a_fake_clock():
    with LocalServer(fake_clock=True) as server, outrig.connect(server.address) as space:
        lease = space.write(Task(n=1), lease=10.0)
        space.write(Task(n=2), lease=outrig.FOREVER)
        assert server.clock is not None
        server.clock.advance(5.0)
        lease.renew(10.0)
        server.clock.advance(9.0)
        assert space.count(Task()) == 2
        server.clock.advance(2.0)
        assert [cast(Task, t).n for t in space.contents(Task())] == [2]
        assert space.take_nowait(Task(n=1)) is None
        with pytest.raises(outrig.NotFoundError):
            lease.renew(10.0)


def test_quotas_and_max_lease_from_configuration():
    from outrig.service.config import ServerConfig
    from outrig.service.engine import SpaceSettings

    config = ServerConfig(space_defaults=SpaceSettings(max_entries=3, max_lease=60.0, default_lease=30.0))
    with LocalServer(config) as server, outrig.connect(server.address) as space:
        assert space.write(Task(), lease=outrig.FOREVER).duration == pytest.approx(60.0)
        assert space.write(Task()).duration == pytest.approx(30.0)  # outrig.ANY
        space.write(Task())
        with pytest.raises(outrig.ResourceExhaustedError, match="max_entries=3"):
            space.write(Task())


def test_parked_waiters_and_registrations_are_bounded():
    import asyncio

    import outrig.aio
    from outrig.service.config import Limits, ServerConfig

    config = ServerConfig(limits=Limits(max_waiters=2, max_registrations=1))

    async def scenario(server: LocalServer) -> None:
        async with outrig.aio.connect(server.address) as space:
            blocked: list[asyncio.Future[Any]] = [
                asyncio.ensure_future(space.take(Task(), timeout=30.0)) for _ in range(2)
            ]
            await wait_for_waiters_async(server, "default", 2)
            with pytest.raises(outrig.ResourceExhaustedError, match="max_waiters=2"):
                await space.read(Task(), timeout=30.0)
            assert await space.read_nowait(Task()) is None  # not blocking: still served
            await space.write_many([Task(n=1), Task(n=2)])
            assert sorted(t.n for t in await asyncio.gather(*blocked)) == [1, 2]
            async with space.notify(Task()):
                with pytest.raises(outrig.ResourceExhaustedError, match="max_registrations=1"):
                    async with space.notify(Task()):
                        pass

    with LocalServer(config) as server:
        asyncio.run(scenario(server))
