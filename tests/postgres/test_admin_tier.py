"""The admin API in a tier of two postgres servers: calls sent to the server that owns none of
the spaces (it is draining) reach the owner, forwarded over the peer stream, and ListSpaces counts
the owner's spaces by asking it."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest

import outrig

from ..conftest import ServerProcess
from ..postgres_server import PostgresServer
from .tier.conftest import drained_pair


@dataclass
class Part(outrig.Entry, type_name="tier.Part"):
    n: int | None = None


@pytest.fixture(scope="module")
def tier(postgres: PostgresServer) -> Iterator[tuple[ServerProcess, ServerProcess]]:
    owner, receiver = drained_pair(postgres, "admin")
    try:
        yield owner, receiver
    finally:
        receiver.stop()
        owner.stop()


@pytest.mark.parametrize("mux", [True, False], ids=["mux", "unary"])
def test_admin_calls_through_a_server_that_does_not_own_the_space(
    tier: tuple[ServerProcess, ServerProcess], mux: bool
) -> None:
    owner, receiver = tier
    name = f"parts-{mux}"
    with outrig.connect(receiver.address, space=name, direct=False, mux=mux, retry_deadline=10) as space:
        space.write_many([Part(n=i) for i in range(12)])
        assert space.locate().address == owner.address  # the other server owns it
        described = space.describe()
        assert (described.space, described.entries) == (name, 12)
        page = space.browse(Part(), max_entries=5)
        assert [e.entry.n for e in page.entries] == [0, 1, 2, 3, 4]  # type: ignore[union-attr]
        assert space.purge(Part(), dry_run=True) == 12
        assert space.purge(Part(), max_entries=7) == 7
        with space.notify(Part(), lease=60.0) as events:
            space.cancel_registration(events.lease.id)
            assert list(events) == []
        placement = next(p for p in space.list_spaces() if p.space == name)
        assert not placement.here and placement.address == owner.address
        assert placement.entries == 5  # counted by the owner, asked by the receiver
        assert placement.bytes == space.describe().bytes > 0
