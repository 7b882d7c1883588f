"""Matchers and order_by on every backend (conftest.BACKENDS: embedded, embedded-durable,
postgres-owner): templates decoded by the codec from their protobuf form, as the servicer decodes
them, then matched, ordered, parked, listed, counted, heard of, replayed by request id, and used
under a transaction."""

from __future__ import annotations

import asyncio
from typing import Any

from outrig.service.backends.base import SpaceBackend
from outrig.service.config import Limits
from outrig.service.engine import Template
from outrig.service.protocol import codec
from outrig.v1 import space_pb2 as pb

from .test_backend_conformance import WAIT, collect, entry, ids, settle, write

LIMITS = Limits()


def templates(*messages: pb.Template, order_by: tuple[tuple[str, bool], ...] = ()) -> tuple[Template, ...]:
    keys = [pb.OrderKey(field=field, descending=descending) for field, descending in order_by]
    return codec.templates(list(messages), LIMITS, keys)


def job(**matchers: pb.Matcher) -> pb.Template:
    return pb.Template(type_name="Job", matchers=matchers)


def at_least(n: int) -> pb.Matcher:
    return pb.Matcher(range=pb.Range(low=pb.Value(int_value=n), low_inclusive=True))


def prefix(text: str) -> pb.Matcher:
    return pb.Matcher(prefix=pb.Value(string_value=text))


async def match(backend: SpaceBackend, space: str, found: tuple[Template, ...], **options: Any) -> list[int]:
    options = {"take": False, "max_entries": 1, "timeout": 0, "if_exists": False} | options
    async with asyncio.timeout(WAIT):
        return ids(await backend.match(space, found, **options))


async def test_ranges_prefixes_and_a_priority_queue(backend: SpaceBackend, space: str) -> None:
    written = await write(
        backend,
        space,
        *(
            entry("Job", priority=p, region=r)
            for p, r in [(3, "eu-w"), (9, "us"), (7, "eu-n"), (7, "eu-s"), (1, "eu-w")]
        ),
    )
    urgent = templates(job(priority=at_least(5), region=prefix("eu-")), order_by=(("priority", True),))
    assert await match(backend, space, urgent, max_entries=10) == [written[2], written[3]]
    assert await match(backend, space, urgent, take=True) == [written[2]]
    assert await match(backend, space, urgent, take=True) == [written[3]]
    assert await match(backend, space, urgent, take=True) == []
    assert await backend.count(space, templates(job(region=prefix("eu-")))) == 2
    listed = [
        ids(chunk)
        async for chunk in backend.contents(space, templates(job(), order_by=(("priority", False),)), 0)
    ]
    assert [i for chunk in listed for i in chunk] == [written[4], written[0], written[1]]


async def test_a_parked_range_take_wakes_only_for_a_match(backend: SpaceBackend, space: str) -> None:
    taker = asyncio.ensure_future(
        match(backend, space, templates(job(priority=at_least(5))), take=True, timeout=WAIT)
    )
    await settle()
    assert not taker.done()
    await write(backend, space, entry("Job", priority=4), entry("Job", priority=5.5))
    await settle()
    assert not taker.done()
    (wanted,) = await write(backend, space, entry("Job", priority=5))
    assert await taker == [wanted]


async def test_a_take_with_matchers_replays_by_request_id(backend: SpaceBackend, space: str) -> None:
    written = await write(backend, space, *(entry("Job", priority=p) for p in (2, 8, 5)))
    found = templates(job(priority=at_least(3)), order_by=(("priority", True),))
    first = await match(backend, space, found, take=True, request_id="rid-matchers")
    again = await match(backend, space, found, take=True, request_id="rid-matchers")
    assert first == again == [written[1]]
    assert await backend.count(space, templates(job())) == 2


async def test_notify_with_matchers(backend: SpaceBackend, space: str) -> None:
    subscription = await backend.subscribe(space, templates(job(region=prefix("eu"))), 60.0)
    written = await write(backend, space, entry("Job", region="us"), entry("Job", region="eu-x"))
    subscription.close()
    events = await collect(subscription)
    assert [event.entry.id for event in events] == [written[1]]


async def test_matchers_and_order_under_a_transaction(backend: SpaceBackend, space: str) -> None:
    written = await write(backend, space, *(entry("Job", priority=p) for p in (6, 9)))
    txn = (await backend.begin(space, 30.0)).id
    found = templates(job(priority=at_least(5)), order_by=(("priority", True),))
    assert await match(backend, space, found, take=True, transaction=txn) == [written[1]]
    # The transaction's take hides the entry from others until it ends; its abort puts it back.
    assert await match(backend, space, found) == [written[0]]
    await backend.abort(space, txn)
    assert await backend.count(space, found) == 2
    assert await match(backend, space, found, max_entries=2) == [written[1], written[0]]


async def listed(backend: SpaceBackend, space: str, found: tuple[Template, ...], most: int) -> list[int]:
    async with asyncio.timeout(WAIT):
        return [i async for chunk in backend.contents(space, found, most) for i in ids(chunk)]


async def test_a_bounded_ordered_contents_lists_the_first_entries_even_past_locked_ones(
    backend: SpaceBackend, space: str
) -> None:
    """contents with an order and max_entries reads only the first matches of the ordered index,
    and goes on past them when some are locked by a transaction or gone: always the first
    max_entries visible ones, in order, as the unbounded listing has them."""
    written = await write(backend, space, *(entry("Job", priority=p) for p in (5, 1, 8, 3, 9, 7, 2)))
    by_priority = templates(job(priority=at_least(2)), order_by=(("priority", True),))
    everything = await listed(backend, space, by_priority, 0)
    assert everything == [written[i] for i in (4, 2, 5, 0, 3, 6)]
    for most in (1, 2, 3, 6, 10):
        assert await listed(backend, space, by_priority, most) == everything[:most]
    txn = (await backend.begin(space, 30.0)).id
    taken = await match(backend, space, by_priority, take=True, max_entries=2, transaction=txn)
    assert taken == everything[:2]  # the two highest, locked by the transaction
    assert await listed(backend, space, by_priority, 2) == everything[2:4]
    await backend.commit(space, txn)
    assert await listed(backend, space, by_priority, 3) == everything[2:5]
