"""A take's own max_deliveries on the owner tier (PostgreSQL migration 5): recorded with the
entry's delivery state, so that after a takeover the new owner applies the take's limit, not the
space's, when the delivery ends unacknowledged (its deadline passing there, or a nack)."""

from __future__ import annotations

from outrig.service.backends.postgres.backend import PostgresBackend

from ..conformance.test_backend_conformance import entry, template
from ..polling import wait_until_async
from .test_deliveries_tier import ACK, clock_of, database, deliver, rows
from .test_owners import owner_is, peek, silence, tier

__all__ = ["database"]  # the fixture, shared


async def _dead(backend: PostgresBackend, count: int) -> bool:
    found = await backend.deliver("s.dead", [template()], max_entries=10, timeout=0, ack=ACK)
    for delivery in found:
        await backend.ack("s.dead", delivery.receipt)
    return len(found) == count


async def test_a_takes_max_deliveries_survives_a_takeover(database: str) -> None:
    async with tier(database, 2) as (a, b):
        written = [g.id for g in await a.write("s", [entry(n=i) for i in range(3)], 600.0)]
        (lapsing,) = await deliver(a, "s", max_deliveries=1)
        (nacked,) = await deliver(a, "s", max_deliveries=1)
        (plain,) = await deliver(a, "s")  # no limit of its own: the space's (none)
        found = await rows(database, "SELECT id, max_deliveries FROM outrig_entries WHERE space = 's'")
        assert dict(found) == {lapsing.entry.id: 1, nacked.entry.id: 1, plain.entry.id: 0}
        await b.write("s.dead", [entry(n=-1)], 600.0)  # b owns the dead-letter space
        assert await _dead(b, 1)
        silence(a)
        await wait_until_async(lambda: owner_is(b, "s", "server-1:7480"), what="b's takeover")
        assert (await b.nack("s", nacked.receipt, 0.0)).dead_letter == "s.dead"
        assert await _dead(b, 1)  # the nacked one (taken from s.dead and acked there)
        await b.extend("s", plain.receipt, 10 * ACK)
        clock_of(b).advance(ACK + 1)  # the lapsing delivery's deadline passes at b

        async def moved() -> bool:
            return await _dead(b, 1)

        await wait_until_async(moved, what="the lapsed delivery to be dead-lettered")
        assert await peek(b, "s") == []  # plain is still pending, the others are dead letters
        assert written[2] == plain.entry.id
