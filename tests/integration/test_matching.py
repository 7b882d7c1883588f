"""Matchers and order_by through the SDK, sync and async, against a real server process: every
matcher, the priority queue, contents and count, notify, blocked takes woken only by writes that
can match them, transactions, and bad input for every matcher."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass
from typing import Any, cast

import pytest

import outrig
import outrig.aio

from ..polling import wait_for_waiters, wait_for_waiters_async


@dataclass
class Job(outrig.Entry, type_name="it.Job"):
    region: str | None = None
    priority: int | None = None
    name: str | None = None
    weight: float | None = None
    tags: dict[str, Any] | None = None


@pytest.fixture(params=[True, False], ids=["mux", "unary"])
def space(request, server, space_name):
    with outrig.connect(server.address, space=space_name, mux=request.param) as space:
        yield space


def _jobs(space: outrig.Space) -> None:
    space.write_many(
        [
            Job(region="eu", priority=3, name="eu-a", weight=0.5),
            Job(region="us", priority=9, name="us-a", weight=2.0),
            Job(region="eu", priority=7, name="eu-b", weight=-1.0),
            Job(region="uk", priority=5, name="uk-a"),
            Job(region="eu", priority=7, name="eu-c", weight=float("inf")),
            Job(region="eu", name="eu-none"),
        ],
        lease=60.0,
    )


def _names(entries: Any) -> list[str | None]:
    return [entry.name for entry in entries]


def test_every_matcher_selects_what_it_says(space):
    _jobs(space)
    everything = 100

    def names(template: Job, **kw: Any) -> list[str | None]:
        return _names(space.read_many(template, max_entries=everything, timeout=0, **kw))

    assert names(Job(region="eu", priority=outrig.GE(5))) == ["eu-b", "eu-c"]
    assert names(Job(priority=outrig.GT(7))) == ["us-a"]
    assert names(Job(priority=outrig.LT(5))) == ["eu-a"]
    assert names(Job(priority=outrig.LE(5))) == ["eu-a", "uk-a"]
    assert names(Job(priority=outrig.Range(5, 7))) == ["eu-b", "uk-a", "eu-c"]
    assert names(Job(priority=outrig.Range(5, 7, low_inclusive=False))) == ["eu-b", "eu-c"]
    assert names(Job(priority=outrig.Range(5, 7, high_inclusive=False))) == ["uk-a"]
    assert names(Job(priority=outrig.Range(7, 5))) == []  # an empty range matches nothing
    assert names(Job(name=outrig.Prefix("eu-"))) == ["eu-a", "eu-b", "eu-c", "eu-none"]
    assert names(Job(region=outrig.OneOf("uk", "us"))) == ["us-a", "uk-a"]
    assert names(Job(region=outrig.Not("eu"))) == ["us-a", "uk-a"]
    assert names(Job(priority=outrig.Missing)) == ["eu-none"]
    assert names(Job(weight=outrig.Present, region="eu")) == ["eu-a", "eu-b", "eu-c"]
    assert names(Job(priority=outrig.All(outrig.GE(3), outrig.Not(7)))) == ["eu-a", "us-a", "uk-a"]
    assert names(Job(weight=outrig.GE(1.0))) == ["us-a", "eu-c"]  # infinity is in an unbounded range
    # Kinds: an int range never matches a float, nor a float range an int.
    assert names(Job(priority=outrig.GE(5.0))) == []  # type: ignore[arg-type]  # mypy says so too
    assert names(Job(weight=outrig.GE(0))) == []
    assert space.count(Job(region="eu", priority=outrig.Range(1, 10))) == 3


def test_order_by_sorts_with_fifo_among_equals_and_missing_values_last(space):
    _jobs(space)
    assert _names(space.contents(Job(), order_by=outrig.desc("priority"))) == [
        "us-a", "eu-b", "eu-c", "uk-a", "eu-a", "eu-none",
    ]  # fmt: skip
    assert _names(space.contents(Job(), order_by=[outrig.desc("priority"), outrig.desc("weight")])) == [
        "us-a", "eu-c", "eu-b", "uk-a", "eu-a", "eu-none",
    ]  # fmt: skip
    assert _names(space.contents(Job(region="eu"), order_by="priority", max_entries=2)) == ["eu-a", "eu-b"]
    assert _names(space.read_many(Job(), max_entries=2, order_by=outrig.asc("name"))) == ["eu-a", "eu-b"]
    # A priority queue: take the most urgent job for region eu with priority at least 5.
    urgent = space.take(Job(region="eu", priority=outrig.GE(5)), timeout=0, order_by=outrig.desc("priority"))
    assert urgent is not None and urgent.name == "eu-b"
    assert _names(space.take_many(Job(), max_entries=2, order_by=outrig.desc("priority"))) == ["us-a", "eu-c"]
    assert space.take_nowait(Job(), order_by=outrig.desc("priority")).name == "uk-a"
    assert space.read_nowait(Job(), order_by="weight").name == "eu-a"


def test_a_blocked_range_take_is_woken_only_by_a_write_that_matches(space, server):
    results: list[Any] = []

    def take() -> None:
        results.append(space.take(Job(priority=outrig.GE(5), name=outrig.Prefix("eu-")), timeout=10.0))

    taker = threading.Thread(target=take)
    taker.start()
    wait_for_waiters(server, space.name, 1)
    space.write(Job(priority=4, name="eu-low"))  # below the range
    space.write(Job(priority=6, name="us-high"))  # the wrong prefix
    space.write(Job(priority=6.0, name="eu-float"))  # type: ignore[arg-type]  # a float: another kind
    wait_for_waiters(server, space.name, 1)  # a write offers itself before it replies: still parked
    space.write(Job(priority=5, name="eu-yes"))
    taker.join(10.0)
    assert _names(results) == ["eu-yes"]
    assert space.count(Job()) == 3


def test_notify_hears_only_matching_writes(space):
    with space.notify(Job(name=outrig.Prefix("eu-"), priority=outrig.OneOf(1, 2)), lease=30.0) as events:
        space.write(Job(name="eu-x", priority=3))
        space.write(Job(name="us-x", priority=1))
        space.write(Job(name="eu-y", priority=2))
        event = next(iter(events))
        assert event.entry.name == "eu-y"


def test_matchers_and_order_under_a_transaction(space):
    _jobs(space)
    with space.transaction(lease=30.0) as txn:
        txn.write(Job(region="eu", priority=8, name="eu-txn"))
        got = txn.take(Job(region="eu", priority=outrig.GE(5)), timeout=0, order_by=outrig.desc("priority"))
        assert got is not None and got.name == "eu-txn"
        second = txn.take(
            Job(region="eu", priority=outrig.GE(5)), timeout=0, order_by=[outrig.desc("priority")]
        )
        assert second is not None and second.name == "eu-b"
        # Outside the transaction its take is invisible: eu-b is locked, eu-c is free.
        assert _names(space.read_many(Job(region="eu", priority=outrig.GE(5)), max_entries=5, timeout=0)) == [
            "eu-c"
        ]
        assert _names(txn.contents(Job(priority=outrig.Present), order_by="priority")) == [
            "eu-a", "uk-a", "eu-c", "us-a",
        ]  # fmt: skip
    assert space.count(Job(priority=outrig.GE(5))) == 3


def test_generic_entries_carry_matchers_too(space):
    _jobs(space)
    template = outrig.GenericEntry("it.Job", fields={"priority": outrig.GE(9)})
    got = space.read_nowait(template)
    assert got is not None and got.name == "us-a"


@pytest.mark.parametrize(
    ("template", "field", "says"),
    [
        (Job(tags=outrig.GE({"a": 1})), "range.low", "got map"),
        (Job(priority=outrig.Range(1, 2.5)), "range", "two kinds"),  # type: ignore[arg-type]
        (Job(weight=outrig.GE(float("nan"))), "range.low", "NaN"),
        (Job(priority=outrig.Prefix("1")), None, None),  # type: ignore[arg-type]  # matches no int
        (Job(tags=outrig.Prefix(5)), "prefix", "got int"),  # type: ignore[call-overload]
        (Job(region=outrig.OneOf("eu", None)), "one_of.values[1]", "null"),
        (Job(region=outrig.Not(None)), "not_equal", "null"),
        (Job(region=outrig.All(outrig.Prefix("e"), outrig.GE([1]))), "all.matchers[1].range.low", "got list"),  # type: ignore[arg-type]
    ],
)
def test_bad_matchers_are_refused_naming_the_field(space, template, field, says):
    if field is None:
        space.write(Job(priority=1))
        assert space.read_nowait(template) is None
        return
    with pytest.raises(outrig.InvalidArgumentError) as caught:
        space.read_nowait(template)
    message = str(caught.value)
    assert "templates[0].matchers[" in message and field in message and says in message, message
    assert caught.value.reason == "INVALID_REQUEST"


def test_bad_order_keys_are_refused(space):
    with pytest.raises(outrig.InvalidArgumentError, match=r"order_by\[1\].field: 'n' is an earlier key"):
        space.read_nowait(Job(), order_by=["n", outrig.desc("n")])
    with pytest.raises(outrig.InvalidArgumentError, match=r"order_by\[0\].field: must not be empty"):
        space.take_nowait(Job(), order_by="")
    with pytest.raises(TypeError, match="order_by"):
        space.read_nowait(Job(), order_by=cast(Any, [1]))
    with pytest.raises(ValueError, match="needs a low or a high bound"):
        outrig.Range()


# ---------------------------------------------------------------- asyncio


@pytest.fixture(params=[True, False], ids=["mux", "unary"])
async def aspace(request, server, space_name):
    async with outrig.aio.connect(server.address, space=space_name, mux=request.param) as space:
        yield space


async def test_async_priority_queue_and_blocked_range_take(aspace, server):
    await aspace.write_many([Job(priority=p, name=f"p{p}") for p in (3, 9, 1, 9, 5)], lease=60.0)
    taken = [await aspace.take(Job(), timeout=0, order_by=outrig.desc("priority")) for _ in range(5)]
    assert _names(taken) == ["p9", "p9", "p5", "p3", "p1"]
    taker = asyncio.ensure_future(aspace.take(Job(priority=outrig.Range(10, 20)), timeout=10.0))
    await wait_for_waiters_async(server, aspace.name, 1)
    await aspace.write(Job(priority=21, name="too-high"))
    await aspace.write(Job(priority=9, name="too-low"))
    assert not taker.done()
    await aspace.write(Job(priority=20, name="just-in"))
    got = await taker
    assert got is not None and got.name == "just-in"
    names = [entry.name async for entry in aspace.contents(Job(), order_by=outrig.asc("priority"))]
    assert names == ["too-low", "too-high"]
    assert await aspace.count(Job(name=outrig.Prefix("too-"))) == 2
    with pytest.raises(outrig.InvalidArgumentError, match="NaN"):
        await aspace.read_nowait(Job(weight=outrig.LT(float("nan"))))
