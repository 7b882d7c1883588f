"""Idempotency keys: a write or take retried with the same request id acts once.

A client may attach a request id to write, write_many, take and take_many. The first call with an
id is recorded with its result; a retry within the window gets that result instead of acting
again, and one that arrives while the first is still in flight waits for it. On a durable server
the id and its result are committed in the same transaction as the change itself, so the answer
survives a crash, and a restart reloads the ids still inside their window.

Memory: an id costs a small record for its window. Results are kept in memory only on an
in-memory server (there is nowhere else to keep them); a durable server reads a result back from
the store in the rare case of a retry.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any

from outrig.service.engine.clock import Clock
from outrig.service.exceptions import RequestConflictError


class Outcome:
    """What is known of one request id: which call made it, and its result once done."""

    __slots__ = ("_done", "_in_flight", "committing", "expires_at", "kind", "request_id", "result", "space")

    def __init__(
        self, request_id: str, space: str, kind: str, expires_at: float, *, in_flight: bool = False
    ) -> None:
        self.request_id = request_id
        self.space = space
        self.kind = kind
        self.expires_at = expires_at
        self.result: Any = None  # kept only by an in-memory server
        # Set once the call's change is queued for the store: from then on the batch's outcome,
        # not the call's (which may be cancelled while it waits), decides the id's fate.
        self.committing = False
        self._in_flight = in_flight  # a first call still acting (not an id recovered from the store)
        self._done: asyncio.Future[bool] | None = None

    @property
    def done(self) -> asyncio.Future[bool] | None:
        """Resolves once the first call has acted (True) or failed without acting (False); None
        for an id recovered from the store, or once the call ended before anyone waited for it.
        Made when first asked for, by a retry that arrives while the first call is in flight, in
        the running loop: nearly every call with an id is never retried, and a future made for
        each cost a running-loop check (a getpid(2) in Python 3.11) per write or take."""
        if self._done is None and self._in_flight:
            self._done = asyncio.get_running_loop().create_future()
        return self._done

    def settle(self, acted: bool) -> None:
        """The first call is over: it acted, or it failed without acting."""
        self._in_flight = False
        if self._done is not None and not self._done.done():
            self._done.set_result(acted)


class RequestLog:
    """Request ids seen within the window, oldest first."""

    def __init__(self, window: float, clock: Clock) -> None:
        self.window = window
        self._clock = clock
        self._outcomes: dict[str, Outcome] = {}
        self._order: deque[Outcome] = deque()

    def __len__(self) -> int:
        return len(self._outcomes)

    def find(self, request_id: str, space: str, kind: str) -> Outcome | None:
        """The earlier call with this id, if it is still remembered; a conflict if it was another call."""
        outcome = self._outcomes.get(request_id)
        if outcome is None or outcome.expires_at <= self._clock.time():
            return None
        if outcome.space != space or outcome.kind != kind:
            raise RequestConflictError(
                f"request_id: {request_id!r} was used for a {outcome.kind} in space {outcome.space!r}; "
                f"a retry must repeat the same call (this is a {kind} in space {space!r})"
            )
        return outcome

    def begin(self, request_id: str, space: str, kind: str) -> Outcome:
        """Record a first call now in flight."""
        outcome = Outcome(request_id, space, kind, self._clock.time() + self.window, in_flight=True)
        self._add(outcome)
        return outcome

    def restore(self, request_id: str, space: str, kind: str, expires_at: float) -> None:
        """Remember an id recovered from the store (its result stays there)."""
        self._add(Outcome(request_id, space, kind, expires_at))

    def _add(self, outcome: Outcome) -> None:
        self._outcomes[outcome.request_id] = outcome
        self._order.append(outcome)

    def finish(self, outcome: Outcome, result: Any) -> None:
        """The first call acted; `result` is kept for retries when there is no store."""
        outcome.result = result
        outcome.settle(True)

    def abandon(self, outcome: Outcome, *, store_failed: bool = False) -> None:
        """The first call failed without acting: forget the id, so a retry acts afresh. Once its
        change is queued for the store, only the store's failure counts as not acting."""
        if outcome.committing and not store_failed:
            return
        if self._outcomes.get(outcome.request_id) is outcome:
            del self._outcomes[outcome.request_id]
        outcome.settle(False)

    def forget_space(self, space: str) -> None:
        """Forget every id of `space` (no longer served here); calls in flight see theirs fail."""
        for request_id, outcome in list(self._outcomes.items()):
            if outcome.space == space:
                del self._outcomes[request_id]
                outcome.settle(False)

    def prune(self, limit: int = 10_000) -> int:
        """Forget up to `limit` ids whose window has passed; returns how many."""
        now = self._clock.time()
        order, pruned = self._order, 0
        while order and pruned < limit and order[0].expires_at <= now:
            outcome = order.popleft()
            if self._outcomes.get(outcome.request_id) is outcome:
                del self._outcomes[outcome.request_id]
            pruned += 1
        return pruned
