"""Ownership of spaces, kept in PostgreSQL: who owns each space, under which epoch, until when.

A space's row in `outrig_spaces` names its owner (a server id), an epoch bumped by every claim,
and when the ownership ends unless renewed, on the database's clock. A claim succeeds only when
the space has no owner, or its ownership has run out, or it is this server's own (after it
dropped the space, it claims it again under a new epoch). The owner renews every space it
serves in one statement every third of the lease, with the heartbeat of its `outrig_servers` row.

This server's own view is deliberately shorter than the database's: it counts the lease from the
moment it *sent* the claim or renewal, and trusts it for only `TRUSTED` of its length, so it stops
serving a space (reads included) before any other server may claim it. The database's fence
(journal.py) guards every change however late this server is.

Leased rows rather than session advisory locks: a lock dies with its session only when PostgreSQL
notices the session is gone, which for a server cut off by the network takes as long as TCP
keepalives (minutes by default), and a lock has no epoch to fence a late commit with. A leased
row ends on time whatever happened to its owner, and its epoch makes every late write fail.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from psycopg_pool import AsyncConnectionPool

from outrig.service.backends.base import Placement
from outrig.service.backends.postgres.schema import FENCE_CLASS

# The share of the lease this server trusts its own ownership for, counted from the send.
TRUSTED = 0.8


@dataclass(frozen=True, slots=True)
class Owner:
    """A space's owner as the database has it now."""

    server: str
    address: str
    epoch: int
    expires_in: float  # seconds; <= 0: run out


@dataclass(frozen=True, slots=True)
class LiveServer:
    server: str
    address: str
    spaces: int


class Ownership:
    """This server's claims and renewals, and what it knows of the tier."""

    def __init__(self, pool: AsyncConnectionPool[Any], server_id: str, lease: float) -> None:
        self._pool = pool
        self.server_id = server_id
        self.lease = lease
        self.address = ""
        # The spaces this server owns and the epoch of each (the journal fences with it).
        self.epochs: dict[str, int] = {}
        # Until when (time.monotonic) this server may act for each of them.
        self._trusted_until: dict[str, float] = {}

    def trusted(self, space: str) -> bool:
        """Whether this server can still prove it owns `space`."""
        return time.monotonic() < self._trusted_until.get(space, 0.0)

    def forget(self, space: str) -> None:
        self.epochs.pop(space, None)
        self._trusted_until.pop(space, None)

    def _trust(self, spaces: Sequence[str], sent: float) -> None:
        until = sent + TRUSTED * self.lease
        for space in spaces:
            self._trusted_until[space] = until

    async def _fetch(
        self, sql: str, parameters: Sequence[Any] | dict[str, Any], *, fencing: str | None = None
    ) -> list[tuple[Any, ...]]:
        """Run one statement. `fencing`: a space whose owner or epoch it changes; it first takes
        the space's fence lock exclusively, in the same transaction, so that it waits for every
        batch that passed the fence (schema.py, migration 3) and every later batch sees it."""
        async with self._pool.connection() as connection:
            scope = contextlib.nullcontext() if fencing is None else connection.transaction()
            async with scope:
                if fencing is not None:
                    await connection.execute(
                        "SELECT pg_advisory_xact_lock(%s, hashtext(%s))", (FENCE_CLASS, fencing)
                    )
                cursor = await connection.execute(sql, parameters)
                return list(await cursor.fetchall()) if cursor.description else []

    async def heartbeat(self, spaces: int) -> None:
        """Say this server is live, where it is reached and how many spaces it serves."""
        await self._fetch(
            "INSERT INTO outrig_servers (id, address, spaces) VALUES (%s, %s, %s) "
            "ON CONFLICT (id) DO UPDATE SET heartbeat_at = now(), address = EXCLUDED.address, "
            "spaces = EXCLUDED.spaces",
            (self.server_id, self.address, spaces),
        )

    async def claim(self, space: str) -> int | None:
        """Claim `space`: its new epoch, or None if another server owns it."""
        sent = time.monotonic()
        # The server's count goes up with the claim, so that the next placement decision of any
        # server sees it at once, not a heartbeat later.
        rows = await self._fetch(
            "WITH claimed AS ("
            "INSERT INTO outrig_spaces AS s (space, owner, epoch, owner_expires_at) "
            "VALUES (%(space)s, %(me)s, 1, now() + make_interval(secs => %(lease)s)) "
            "ON CONFLICT (space) DO UPDATE SET owner = EXCLUDED.owner, epoch = s.epoch + 1, "
            "owner_expires_at = EXCLUDED.owner_expires_at "
            "WHERE s.owner IS NULL OR s.owner_expires_at < now() OR s.owner = EXCLUDED.owner "
            "RETURNING s.epoch), "
            "counted AS (UPDATE outrig_servers SET spaces = spaces + 1 "
            "WHERE id = %(me)s AND EXISTS (SELECT 1 FROM claimed)) "
            "SELECT epoch FROM claimed",
            {"space": space, "me": self.server_id, "lease": self.lease},
            fencing=space,
        )
        if not rows:
            return None
        epoch = int(rows[0][0])
        self.epochs[space] = epoch
        self._trust([space], sent)
        return epoch

    async def renew(self, spaces: Sequence[str]) -> set[str]:
        """Renew the ownership of `spaces` (and the heartbeat): the ones lost to another server.
        A space claimed (again) while the renewal was on its way is not judged by it."""
        sent = time.monotonic()
        asked = {space: self.epochs.get(space) for space in spaces}
        rows = await self._fetch(
            "UPDATE outrig_spaces SET owner_expires_at = now() + make_interval(secs => %s) "
            "WHERE owner = %s AND space = ANY(%s) RETURNING space, epoch",
            (self.lease, self.server_id, list(spaces)),
        )
        await self.heartbeat(len(spaces))
        held = {space for space, epoch in rows if asked.get(space) == epoch}
        self._trust(sorted(space for space in held if self.epochs.get(space) == asked[space]), sent)
        return {space for space in asked if space not in held and self.epochs.get(space) == asked[space]}

    async def hand_over(self, space: str, server: str, epoch: int) -> bool:
        """Give `space` to `server` under a new epoch (so that nothing this server still sends for
        it can commit); it claims it at its next look, or at the first call. False if this server
        did not own it (under `epoch`) any more."""
        rows = await self._fetch(
            "UPDATE outrig_spaces SET owner = %s, epoch = epoch + 1, "
            "owner_expires_at = now() + make_interval(secs => %s) "
            "WHERE space = %s AND owner = %s AND epoch = %s RETURNING space",
            (server, self.lease, space, self.server_id, epoch),
            fencing=space,
        )
        self.forget(space)
        return bool(rows)

    async def set_draining(self, draining: bool) -> None:
        await self._fetch("UPDATE outrig_servers SET draining = %s WHERE id = %s", (draining, self.server_id))

    async def server_named(self, name: str) -> LiveServer | None:
        """A live server by its id or its address."""
        rows = await self._fetch(
            "SELECT id, address, spaces FROM outrig_servers WHERE (id = %s OR address = %s) "
            "AND heartbeat_at > now() - make_interval(secs => %s)",
            (name, name, self.lease),
        )
        return LiveServer(rows[0][0], rows[0][1], int(rows[0][2])) if rows else None

    async def release(self, spaces: Sequence[str]) -> None:
        """Give `spaces` up at once (a clean stop), so that others claim them without waiting
        for the lease to run out; and leave the tier."""
        if spaces:
            await self._fetch(
                "UPDATE outrig_spaces SET owner = NULL, owner_expires_at = now() "
                "WHERE owner = %s AND space = ANY(%s)",
                (self.server_id, list(spaces)),
            )
        await self._fetch("DELETE FROM outrig_servers WHERE id = %s", (self.server_id,))
        for space in spaces:
            self.forget(space)

    async def owner_of(self, space: str) -> Owner | None:
        rows = await self._fetch(
            "SELECT o.owner, coalesce(s.address, ''), o.epoch, "
            "extract(epoch FROM o.owner_expires_at - now())::float8 "
            "FROM outrig_spaces o LEFT JOIN outrig_servers s ON s.id = o.owner "
            "WHERE o.space = %s AND o.owner IS NOT NULL",
            (space,),
        )
        if not rows:
            return None
        server, address, epoch, expires_in = rows[0]
        return Owner(server, address, int(epoch), float(expires_in or 0.0))

    async def live_servers(self) -> list[LiveServer]:
        """The servers whose heartbeat is within a lease, least loaded first."""
        rows = await self._fetch(
            "SELECT id, address, spaces FROM outrig_servers "
            "WHERE heartbeat_at > now() - make_interval(secs => %s) AND NOT draining "
            "ORDER BY spaces, id",
            (self.lease,),
        )
        return [LiveServer(server, address, int(spaces)) for server, address, spaces in rows]

    async def orphans(self) -> list[tuple[str, float, bool]]:
        """Spaces nobody serves: no owner, or an ownership run out, or this server's own (handed
        to it, or dropped by it) that it does not serve; with the seconds since they were last
        owned, and whether they are this server's. A dead-letter space never used yet that dead
        letters wait for counts too, as this server's when it owns a space they come from (so
        that, as a rule, a space and its dead-letter space are served together: dead_letters.py)."""
        rows = await self._fetch(
            "SELECT space, extract(epoch FROM now() - coalesce(owner_expires_at, created_at))::float8, "
            "owner IS NOT DISTINCT FROM %(me)s FROM outrig_spaces "
            "WHERE owner IS NULL OR owner_expires_at < now() OR owner = %(me)s "
            "UNION ALL SELECT d.dead_space, 0.0, bool_or(s.owner IS NOT DISTINCT FROM %(me)s) "
            "FROM outrig_dead_letters d LEFT JOIN outrig_spaces s ON s.space = d.source "
            "WHERE NOT EXISTS (SELECT 1 FROM outrig_spaces n WHERE n.space = d.dead_space) "
            "GROUP BY d.dead_space",
            {"me": self.server_id},
        )
        return [
            (space, float(since or 0.0), bool(given))
            for space, since, given in rows
            if space not in self.epochs
        ]

    async def placements(self) -> list[Placement]:
        rows = await self._fetch(
            "SELECT o.space, coalesce(o.owner, ''), coalesce(s.address, ''), o.epoch, "
            "extract(epoch FROM o.owner_expires_at - now())::float8 "
            "FROM outrig_spaces o LEFT JOIN outrig_servers s ON s.id = o.owner ORDER BY o.space",
            (),
        )
        return [
            Placement(
                space,
                owner,
                address,
                int(epoch),
                None if not owner or expires_in is None or expires_in <= 0 else float(expires_in),
                owner == self.server_id and space in self.epochs,
            )
            for space, owner, address, epoch, expires_in in rows
        ]
