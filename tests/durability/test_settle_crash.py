"""A take's settle is durable before the take waits: a server stopped (or crashed right after
its last reply) while a settling take waits keeps the acks, and the take's retry with its request
id answers the first call's outcome (nothing taken) instead of DELIVERY_EXPIRED for its own
settle."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from outrig.service.config import ServerConfig
from outrig.service.engine import FakeClock

from ..polling import wait_until_async
from ..service.test_embedded_deliveries import JOBS, SPACE, deliver, job, make_config
from .test_restart import running


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(1_000_000.0)


@pytest.fixture
def durable(tmp_path: Path) -> ServerConfig:
    return make_config(tmp_path / "data")


@pytest.mark.parametrize("crash", [False, True])
async def test_a_waiting_takes_settle_survives_a_restart(
    durable: ServerConfig, clock: FakeClock, crash: bool
) -> None:
    async with running(durable, clock, crash=crash) as backend:
        await backend.write(SPACE, [job(0)], None)
        (delivery,) = await deliver(backend)
        waiting = asyncio.ensure_future(
            backend.deliver(
                SPACE,
                [JOBS],
                max_entries=1,
                timeout=None,
                ack=30.0,
                request_id="w-1",
                settle=[delivery.receipt],
            )
        )

        async def settled() -> bool:
            return (await backend.browse(SPACE, [JOBS], 0, 10))[0] == [] and backend.engine(
                SPACE
            ).waiting == 1

        await wait_until_async(settled, what="the settle, before the take waits")
    with pytest.raises(BaseException):  # noqa: B017, PT011  (cancelled or shut down with the server)
        await waiting
    async with running(durable, clock) as backend:
        assert (await backend.browse(SPACE, [JOBS], 0, 10))[0] == []  # the ack survived
        await backend.write(SPACE, [job(1)], None)
        retried = await backend.deliver(
            SPACE, [JOBS], max_entries=1, timeout=0, ack=30.0, request_id="w-1", settle=[delivery.receipt]
        )
        assert retried == []  # the first call's outcome: its acks, nothing taken
        (fresh,) = await deliver(backend)  # job 1 was left alone by the retry
        assert fresh.entry.fields["n"].data == 1
