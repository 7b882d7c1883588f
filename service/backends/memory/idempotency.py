"""Idempotency keys: a write or take retried with the same request id acts once.

A client may attach a request id to write, write_many, take and take_many. The first call with an
id is recorded with its result; a retry within the window gets that result instead of acting
again, and one that arrives while the first is still in flight waits for it. On a durable server
the id and its result are committed in the same transaction as the change itself, so the answer
survives a crash, and a restart reloads the ids still inside their window.

Memory: an id costs a small record for its window. Results are kept in memory only on an
in-memory server (there is nowhere else to keep them); a durable server reads a result back from
the store in the rare case of a retry.

The cyclic collector: an in-memory server keeps two ids per write+take pair for 120 s (the
default window), so what they are kept as is walked by every full collection. A call in flight is
an `Outcome` (its waiters need its future); once it has acted, its record is replaced by a
`_Finished` tuple of atomic values (space, kind, expiry, and a write's leases as their ids,
expiries and grants, flat, and a take's entries each as a `FrozenEntry`, model.py), which CPython's
collector untracks at its first young collection (a frozen entry's record at the one after); the
queue of expiries holds (expires_at, request id) tuples likewise. A retry is given an `Outcome`
made from the record, its taken entries thawed (docs/performance.md, "What the server keeps per
pair, and the collector", "A taken entry after its take").
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Mapping
from typing import Any

from outrig.service.engine.clock import Clock
from outrig.service.engine.model import LeaseGrant, StoredEntry, frozen_entry, thawed_entry
from outrig.service.exceptions import RequestConflictError


class Outcome:
    """What is known of one request id: which call made it, and its result once done."""

    __slots__ = (
        "_done",
        "_in_flight",
        "committing",
        "expires_at",
        "kind",
        "record",
        "request_id",
        "result",
        "space",
    )

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
        # What the request log holds for it once it acted (RequestLog.finish): its `_Finished`.
        self.record: tuple[Any, ...] | None = None

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


#: A `_Finished` record's forms of a result: as given, a list of leases, another list, a list of
#: taken entries (each a `FrozenEntry`, model.py).
_AS_GIVEN, _LEASES, _LIST, _ENTRIES = 0, 1, 2, 3

#: An id whose first call has acted: (space, kind, expires_at, form, result ...), one plain tuple
#: (CPython untracks only exact tuples, and a tuple in a tuple only one collection after its
#: members, so the result's values are its last members), of atomic values but a take's entries.
_Finished = tuple[Any, ...]


def _finished(head: tuple[str, str, float], result: Any) -> _Finished:
    """The record of a call (its space, kind and expiry: `head`) that acted with `result`: a list
    of leases as their (id, expires_at, granted) values, any other list as its members (a retry
    is given a list again)."""
    if result.__class__ is list:
        # By the first member's class, then (for more than one) all of them: a pair's write and
        # take keep one member each, and skip the generators.
        first = result[0].__class__ if result else None
        if first is LeaseGrant and (len(result) == 1 or all(each.__class__ is LeaseGrant for each in result)):
            if len(result) == 1:
                grant = result[0]
                return (*head, _LEASES, grant.id, grant.expires_at, grant.granted)
            leases = [value for grant in result for value in (grant.id, grant.expires_at, grant.granted)]
            return (*head, _LEASES, *leases)
        if first is StoredEntry and (
            len(result) == 1 or all(each.__class__ is StoredEntry for each in result)
        ):
            # the change log froze each at its take (its `frozen`), unless the space logs none
            if len(result) == 1:
                return (*head, _ENTRIES, result[0].frozen or frozen_entry(result[0]))
            return (*head, _ENTRIES, *[each.frozen or frozen_entry(each) for each in result])
        return (*head, _LIST, *result)
    return (*head, _AS_GIVEN, result)


def _given(request_id: str, record: _Finished) -> Outcome:
    """A finished record as an `Outcome` with the first call's result (nothing to wait for)."""
    space, kind, expires_at, form = record[:4]
    outcome = Outcome(request_id, space, kind, expires_at)
    if form == _LEASES:
        outcome.result = [LeaseGrant(*record[at : at + 3]) for at in range(4, len(record), 3)]
    elif form == _LIST:
        outcome.result = list(record[4:])
    elif form == _ENTRIES:
        outcome.result = [thawed_entry(each) for each in record[4:]]
    else:
        outcome.result = record[4]
    return outcome


class RequestLog:
    """Request ids seen within the window, oldest first."""

    def __init__(self, window: float, clock: Clock) -> None:
        self.window = window
        self._clock = clock
        # An id's call in flight, or its `_Finished` record once it acted.
        self._outcomes: dict[str, Outcome | _Finished] = {}
        # The same dict, for a membership test without a call (`request_id in log.ids`: a write's
        # and a take's first look, before `find`); not to be changed through.
        self.ids: Mapping[str, object] = self._outcomes
        self._order: deque[tuple[float, str]] = deque()  # (expires_at, request id), oldest first

    def __len__(self) -> int:
        return len(self._outcomes)

    def find(self, request_id: str, space: str, kind: str) -> Outcome | None:
        """The earlier call with this id, if it is still remembered; a conflict if it was another
        call. One that has acted is given as a new `Outcome` with its result."""
        record = self._outcomes.get(request_id)
        if record is None:
            return None
        outcome = _given(request_id, record) if record.__class__ is tuple else record
        assert isinstance(outcome, Outcome)
        if outcome.expires_at <= self._clock.time():
            return None
        if outcome.space != space or outcome.kind != kind:
            raise RequestConflictError(
                f"request_id: {request_id!r} was used for a {outcome.kind} in space {outcome.space!r}; "
                f"a retry must repeat the same call (this is a {kind} in space {space!r})"
            )
        return outcome

    def begin(self, request_id: str, space: str, kind: str) -> Outcome:
        """Record a first call now in flight."""
        expires_at = self._clock.time() + self.window
        outcome = Outcome(request_id, space, kind, expires_at, in_flight=True)
        self._outcomes[request_id] = outcome
        self._order.append((expires_at, request_id))
        return outcome

    def restore(self, request_id: str, space: str, kind: str, expires_at: float) -> None:
        """Remember an id recovered from the store (its result stays there)."""
        self._outcomes[request_id] = (space, kind, expires_at, _AS_GIVEN, None)
        self._order.append((expires_at, request_id))

    def finish(self, outcome: Outcome, result: Any) -> None:
        """The first call acted; `result` is kept for retries when there is no store (as a
        `_Finished` record, in the place of `outcome`)."""
        outcome.result = result
        outcome.settle(True)
        if self._holds(outcome):
            outcome.record = _finished((outcome.space, outcome.kind, outcome.expires_at), result)
            self._outcomes[outcome.request_id] = outcome.record

    def acted(self, request_id: str, space: str, kind: str, result: Any) -> None:
        """`begin` and `finish` at once, for a first call that acted without waiting (an
        in-memory server's write, and its take that found at once): no other call ran meanwhile,
        so none could have retried it, and its record needs no `Outcome`."""
        expires_at = self._clock.time() + self.window
        self._outcomes[request_id] = _finished((space, kind, expires_at), result)
        self._order.append((expires_at, request_id))

    def _holds(self, outcome: Outcome) -> bool:
        """Whether the log's record of `outcome`'s id is still `outcome`'s (or its `_Finished`)."""
        record = self._outcomes.get(outcome.request_id)
        return record is not None and (record is outcome or record is outcome.record)

    def abandon(self, outcome: Outcome, *, store_failed: bool = False) -> None:
        """The first call failed without acting: forget the id, so a retry acts afresh. Once its
        change is queued for the store, only the store's failure counts as not acting."""
        if outcome.committing and not store_failed:
            return
        if self._holds(outcome):
            del self._outcomes[outcome.request_id]
        outcome.settle(False)

    def forget_space(self, space: str) -> None:
        """Forget every id of `space` (no longer served here); calls in flight see theirs fail."""
        for request_id, record in list(self._outcomes.items()):
            if isinstance(record, Outcome):
                if record.space == space:
                    del self._outcomes[request_id]
                    record.settle(False)
            elif record[0] == space:
                del self._outcomes[request_id]

    def prune(self, limit: int = 10_000) -> int:
        """Forget up to `limit` ids whose window has passed; returns how many."""
        now = self._clock.time()
        order, outcomes, pruned = self._order, self._outcomes, 0
        while order and pruned < limit and order[0][0] <= now:
            _, request_id = order.popleft()
            # The id's record now may be a later call's (the first abandoned): only if it is over.
            record = outcomes.get(request_id)
            if record is not None and _expiry(record) <= now:
                del outcomes[request_id]
            pruned += 1
        return pruned


def _expiry(record: Outcome | _Finished) -> float:
    return record.expires_at if isinstance(record, Outcome) else record[2]
