"""Request ids on the PostgreSQL backend: a write or take retried with the same id acts once,
through whichever server the retry reaches.

An id is a row of `outrig_requests`, shared by all servers. A call with an id first looks for an
earlier reply (`PgRequestLog.replay`); if there is none, it claims the id in the database
transaction of its change (`claim`), so that the change and its record commit together, and the
operation writes its reply into the row (a write's ids and lease, a take's entries). A call that
loses the claim to another (waiting for that one's transaction if it is still open) gets `_Replay`:
it rolls back and answers with the first call's reply. An id reused for another kind of call or
another space is a RequestConflictError. The reaper deletes the rows past the window.
"""

from __future__ import annotations

from typing import Any

from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool

from outrig.service.backends.postgres.queries import _stored
from outrig.service.engine.clock import Clock
from outrig.service.engine.model import LeaseGrant
from outrig.service.exceptions import RequestConflictError

__all__ = ["PgRequestLog"]


class _Replay(Exception):  # noqa: N818 - a signal within this backend, not an error
    """Another call with the same request id acted first: roll back and answer with its reply."""


class PgRequestLog:
    """The request ids of every server on the database, remembered for `window` seconds."""

    def __init__(self, window: float, clock: Clock, pool: AsyncConnectionPool[AsyncConnection[Any]]) -> None:
        self.window = window
        self.clock = clock
        self._pool = pool

    async def claim(self, connection: AsyncConnection[Any], request_id: str, space: str, kind: str) -> None:
        """Record a request id in the caller's database transaction; `_Replay` if a call with it got
        there first (waiting for that call's transaction, if it is still open)."""
        cursor = await connection.execute(
            "INSERT INTO outrig_requests (id, space, kind, expires_at, result) "
            "VALUES (%s, %s, %s, %s, 'null') ON CONFLICT DO NOTHING RETURNING id",
            (request_id, space, kind, self.clock.time() + self.window),
        )
        if await cursor.fetchone() is None:
            raise _Replay

    async def replay(self, request_id: str, space: str, kind: str) -> list[Any] | None:
        """The first reply to a request id, or None if there was no first call (in the window)."""
        async with self._pool.connection() as connection:
            cursor = await connection.execute(
                "SELECT space, kind, result, payloads FROM outrig_requests WHERE id = %s AND expires_at > %s",
                (request_id, self.clock.time()),
            )
            row = await cursor.fetchone()
        if row is None:
            return None
        first_space, first_kind, result, payloads = row
        if (first_space, first_kind) != (space, kind):
            raise RequestConflictError(
                f"request_id: {request_id!r} was used for a {first_kind} in space {first_space!r}; "
                f"a retry must repeat the same call (this is a {kind} in space {space!r})"
            )
        if kind == "write":
            return [LeaseGrant(i, result["expires_at"], result["granted"]) for i in result["ids"]]
        return [
            _stored((entry_id, arrival, payload, expires_at))
            for (entry_id, arrival, expires_at), payload in zip(result, payloads or [], strict=True)
        ]
