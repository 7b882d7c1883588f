"""A delivery's ack, nack and extend retried by the SDK through a durable server that goes away
and comes back on the same port (tests/integration/test_sdk_retry.py's `Outage`): each waits for
the comeback and settles the delivery the restarted server recovered, under its receipt."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import outrig
from outrig.service.config import ServerConfig

from .entries import Task
from .test_sdk_retry import Outage


@pytest.fixture
def durable_outage(tmp_path: Path) -> Iterator[Outage]:
    running = Outage(ServerConfig(data_dir=tmp_path / "data"))
    yield running
    running.close()


@pytest.mark.parametrize("mux", [True, False], ids=["mux", "unary"])
def test_settlements_wait_for_the_server_and_apply_once(durable_outage: Outage, mux: bool) -> None:
    with outrig.connect(durable_outage.address, space="jobs", mux=mux) as space:
        space.write_many([Task(n=1), Task(n=2), Task(n=3)])
        first, second, third = space.take_many(Task(), max_entries=3, timeout=1.0, ack=120.0)
        for settle in (first.ack, lambda: second.extend(300.0), lambda: third.nack(delay=0)):
            durable_outage.back_after(0.5)
            started = time.monotonic()
            settle()
            assert time.monotonic() - started > 0.3  # it did wait for the comeback
        assert space.retries >= 3
        assert second.deadline > first.deadline
        # n=1 acked for good, n=2 still pending, n=3 back: exactly what the three calls did.
        assert space.take_nowait(Task()) == Task(n=3)
        assert space.take_nowait(Task()) is None
        second.ack()
        assert space.browse().entries == []
