"""Issue 17, section 2: a huge but finite lease is refused, and never corrupts a space.

A write with `lease=1e308` used to answer INTERNAL yet store the entry, and every later take then
returned that same entry. Through the real server and the SDK, in memory and durable: the write,
`Begin` and `RenewLeases` with a duration beyond the documented maximum (100 years) are refused
with INVALID_ARGUMENT and change nothing; the maximum itself is granted.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import outrig
from outrig.service.engine import MAX_LEASE_SECONDS

from ..conftest import ServerProcess
from .entries import Task

HUGE = 1e308


@pytest.fixture(params=["memory", "durable"])
def space(
    request: pytest.FixtureRequest,
    server: ServerProcess,
    server_factory: Callable[..., ServerProcess],
    tmp_path: Path,
    space_name: str,
) -> Iterator[outrig.Space]:
    running = server if request.param == "memory" else server_factory("--data-dir", str(tmp_path / "data"))
    with outrig.connect(running.address, space=space_name) as connected:
        yield connected


def test_a_huge_write_is_refused_and_stores_nothing(space: outrig.Space) -> None:
    with pytest.raises(outrig.InvalidArgumentError) as refused:
        space.write(Task(job="huge"), lease=HUGE)
    assert "lease.seconds" in refused.value.details
    assert "3155760000" in refused.value.details
    assert space.take_nowait(Task(job="huge")) is None
    assert space.take_nowait(Task(job="huge")) is None
    assert space.count(Task()) == 0


def test_a_huge_transaction_or_renewal_is_refused(space: outrig.Space) -> None:
    with pytest.raises(outrig.InvalidArgumentError, match="exceeds the maximum"):
        space.transaction(lease=HUGE)
    lease = space.write(Task(job="kept"), lease=60.0)
    with pytest.raises(outrig.InvalidArgumentError, match="exceeds the maximum"):
        lease.renew(HUGE)
    assert lease.duration == 60.0
    assert space.take_nowait(Task(job="kept")) == Task(job="kept")
    assert space.take_nowait(Task(job="kept")) is None


def test_the_maximum_lease_is_granted(space: outrig.Space) -> None:
    lease = space.write(Task(job="long"), lease=float(MAX_LEASE_SECONDS))
    assert lease.duration == MAX_LEASE_SECONDS
    assert lease.renew(float(MAX_LEASE_SECONDS)).duration == MAX_LEASE_SECONDS
    with space.transaction(lease=float(MAX_LEASE_SECONDS)) as txn:
        assert txn.take_nowait(Task(job="long")) == Task(job="long")
    assert space.take_nowait(Task(job="long")) is None
