"""`dead_letters.Arrivals`: a dead letter is taken in once by its dead-letter space's owner, even
when a look at the waiting letters that started before its take-in committed still sees its row."""

from __future__ import annotations

import asyncio
import time

from outrig.service.backends.postgres.dead_letters import Arrivals
from outrig.service.exceptions import NotOwnerError

KEY = ("jobs", 7)


async def test_a_letter_being_taken_in_is_not_taken_in_again() -> None:
    arrivals = Arrivals()
    committed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    assert arrivals.fresh(KEY)
    arrivals.watch(KEY, committed)
    assert not arrivals.fresh(KEY)
    arrivals.forget_before(time.monotonic())  # still under way: remembered
    assert not arrivals.fresh(KEY)
    look_before = time.monotonic()
    committed.set_result(None)
    await asyncio.sleep(0)  # its callback
    arrivals.forget_before(look_before)  # a look sent before the commit may still see the row
    assert not arrivals.fresh(KEY)
    arrivals.forget_before(time.monotonic())  # one sent after it does not
    assert arrivals.fresh(KEY)


async def test_a_refused_take_in_is_forgotten_and_a_late_word_on_an_earlier_one_changes_nothing() -> None:
    arrivals = Arrivals()
    loop = asyncio.get_running_loop()
    first: asyncio.Future[None] = loop.create_future()
    arrivals.watch(KEY, first)
    first.set_exception(NotOwnerError("lost"))
    await asyncio.sleep(0)
    assert arrivals.fresh(KEY)  # refused: whoever loads the space next finds the row
    second: asyncio.Future[None] = loop.create_future()
    third: asyncio.Future[None] = loop.create_future()
    arrivals.watch(KEY, second)
    arrivals.watch(KEY, third)  # taken in again (a load knows better)
    second.set_exception(NotOwnerError("an earlier epoch's"))
    await asyncio.sleep(0)
    assert not arrivals.fresh(KEY)  # the later taking still stands
    third.set_result(None)
    await asyncio.sleep(0)
    arrivals.forget_before(time.monotonic())
    assert arrivals.fresh(KEY)
