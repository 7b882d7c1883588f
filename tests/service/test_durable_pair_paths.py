"""The durable pair's paths through the memory backend and a real SQLite store, where the fifth
pass (docs/performance.md, "The durable pair, fifth pass") took checks and calls out: a take
that waited for a write whose batch the store refuses fails and takes nothing (its store check is
the journal's `submit`'s now), and a request id is finished once, by its batch, yet a retry still
gets the first call's answer, across a restart too."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from outrig.service.backends.embedded.backend import EmbeddedBackend
from outrig.service.backends.embedded.store.schema import database_path
from outrig.service.engine import FakeClock, Template
from outrig.service.exceptions import StoreUnavailableError

from ..durability.test_restart import running
from ..polling import wait_until_async
from .test_embedded_changes import _accept_writes, _refuse_writes
from .test_embedded_deliveries import JOBS, SPACE, WAIT, job, make_config


def _one(n: int) -> Template:
    return Template("Job", {"n": job(n).fields["n"]})


async def test_a_take_that_waited_for_a_refused_write_fails_and_takes_nothing(
    tmp_path: Path, clock: FakeClock
) -> None:
    config = make_config(tmp_path / "data")
    path = database_path(tmp_path / "data")
    backend = EmbeddedBackend(config, clock)
    await backend.start()
    assert backend.journal is not None
    backend.journal._probe_interval = 0.01  # type: ignore[attr-defined]
    try:
        taker = asyncio.create_task(
            backend.match(
                SPACE, [_one(1)], take=True, max_entries=1, timeout=WAIT, if_exists=False, request_id="t1"
            )
        )
        await wait_until_async(lambda: backend.engine(SPACE).waiting == 1, WAIT, what="the take to wait")
        _refuse_writes(path)
        with pytest.raises(StoreUnavailableError):
            await backend.write(SPACE, [job(1)], None, request_id="w1")
        with pytest.raises(StoreUnavailableError):
            await taker
        _accept_writes(path)

        async def accepted() -> bool:
            try:
                await backend.write(SPACE, [job(2)], None)
            except StoreUnavailableError:
                return False
            return True

        await wait_until_async(accepted, WAIT, what="the store to accept changes again")
        assert await backend.count(SPACE, [JOBS]) == 1  # job 2 only: the refused write is gone
        # Neither id acted: the take's retry takes nothing, the write's retry writes afresh.
        again = await backend.match(
            SPACE, [_one(1)], take=True, max_entries=1, timeout=0, if_exists=False, request_id="t1"
        )
        assert again == []
        await backend.write(SPACE, [job(1)], None, request_id="w1")
        assert await backend.count(SPACE, [_one(1)]) == 1
    finally:
        await backend.close()
        await backend.shutdown()
    async with running(config, clock) as backend:
        assert await backend.count(SPACE, [JOBS]) == 2


async def test_a_durable_call_s_request_id_answers_its_retry_once_finished_by_its_batch(
    tmp_path: Path, clock: FakeClock
) -> None:
    config = make_config(tmp_path / "data")
    async with running(config, clock) as backend:
        grants = await backend.write(SPACE, [job(1)], 60.0, request_id="w")
        taken = await backend.match(
            SPACE, [_one(1)], take=True, max_entries=1, timeout=0, if_exists=False, request_id="t"
        )
        assert [s.id for s in taken] == [grants[0].id]
        # Finished by the batch, once: the log holds each id's record, not the call in flight.
        for request_id in ("w", "t"):
            record = backend._requests._outcomes[request_id]
            assert record.__class__ is tuple
        assert await backend.write(SPACE, [job(1)], 60.0, request_id="w") == grants
        again = await backend.match(
            SPACE, [_one(1)], take=True, max_entries=1, timeout=0, if_exists=False, request_id="t"
        )
        assert [s.id for s in again] == [grants[0].id]
        assert await backend.count(SPACE, [JOBS]) == 0
    async with running(config, clock) as backend:
        assert await backend.write(SPACE, [job(1)], 60.0, request_id="w") == grants
        again = await backend.match(
            SPACE, [_one(1)], take=True, max_entries=1, timeout=0, if_exists=False, request_id="t"
        )
        assert [s.id for s in again] == [grants[0].id]
        assert await backend.count(SPACE, [JOBS]) == 0


async def test_a_take_without_an_id_cancelled_while_its_batch_commits_puts_the_entry_back(
    tmp_path: Path, clock: FakeClock
) -> None:
    """Its caller is gone and no retry can claim the entry (the take awaits its batch itself now,
    not through a coroutine of its own): the entry is back, in memory and in the store."""
    config = make_config(tmp_path / "data")
    async with running(config, clock) as backend:
        (grant,) = await backend.write(SPACE, [job(1)], None)
        taking = asyncio.create_task(
            backend.match(SPACE, [_one(1)], take=True, max_entries=1, timeout=0, if_exists=False)
        )
        await asyncio.sleep(0)  # the take is now waiting for its batch
        assert not taking.done()
        taking.cancel()
        with pytest.raises(asyncio.CancelledError):
            await taking
        (back,) = await backend.match(SPACE, [_one(1)], take=False, max_entries=1, timeout=0, if_exists=False)
        assert back.id == grant.id
    async with running(config, clock) as backend:
        assert await backend.count(SPACE, [_one(1)]) == 1
