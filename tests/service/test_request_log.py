"""The request log (backends/memory/idempotency.py): a retry that arrives while the first call is
in flight waits for it, and learns whether it acted; a call nobody waits for makes no future."""

from __future__ import annotations

import asyncio

from outrig.service.backends.memory.idempotency import Outcome, RequestLog
from outrig.service.engine.clock import FakeClock


async def _retry_waits(settle: str) -> tuple[bool, bool]:
    """(whether the waiting retry was still waiting before the first call ended, what it learnt)."""
    log = RequestLog(60.0, FakeClock())
    first = log.begin("id-1", "default", "write")
    found = log.find("id-1", "default", "write")
    assert found is first
    done = found.done
    assert done is not None  # made now, by the retry that asks while the call is in flight
    waiting = asyncio.ensure_future(asyncio.shield(done))
    await asyncio.sleep(0)
    still_waiting = not waiting.done()
    if settle == "finish":
        log.finish(first, "leases")
    else:
        log.abandon(first)
    return still_waiting, await waiting


async def test_a_retry_waits_for_the_first_call_and_learns_it_acted() -> None:
    assert await _retry_waits("finish") == (True, True)


async def test_a_retry_learns_that_the_first_call_failed_without_acting() -> None:
    assert await _retry_waits("abandon") == (True, False)


async def test_a_call_nobody_waits_for_makes_no_future() -> None:
    log = RequestLog(60.0, FakeClock())
    outcome = log.begin("id-2", "default", "take")
    log.finish(outcome, ["entry"])
    # Asked once the call is over, it says so: nothing to wait for, the result is there.
    assert outcome.done is None
    assert log.find("id-2", "default", "take") is outcome and outcome.result == ["entry"]


async def test_forgetting_a_space_ends_its_waits() -> None:
    log = RequestLog(60.0, FakeClock())
    outcome = log.begin("id-3", "jobs", "write")
    done = outcome.done
    assert done is not None
    log.forget_space("jobs")
    assert done.done() and done.result() is False
    assert log.find("id-3", "jobs", "write") is None


def test_an_id_recovered_from_the_store_has_nothing_to_wait_for() -> None:
    log = RequestLog(60.0, FakeClock())
    log.restore("id-4", "default", "write", expires_at=2_000_000.0)
    found = log.find("id-4", "default", "write")
    assert isinstance(found, Outcome) and found.done is None
