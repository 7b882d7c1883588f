"""The memory backend's takes with an acknowledgement deadline: deliver, ack, nack, extend, the
records they make, their request ids, and dead letters moved into the dead-letter space's engine
(engine/deliveries.py has the semantics; docs/work-queues.md the user's view).

A mixin, so that backend.py stays about reads, takes, writes and transactions: `MemoryBackend`
inherits it, and these methods use its engines, recorder and request log through the names
declared for the type checker below.

Records (memory/journal.py): a delivery is a `visibility` record per entry (hidden until the
deadline, the receipt, the count); an ack a `delete`; a nack or an extension a `visibility`; a
dead letter a `delete` here and `put` + `visibility` in the dead-letter space, noted together by
the engine's `on_dead_letter` hook (so in one batch with the nack that caused it, or alone when a
deadline passed). A retried call's answer is its `request` record's columns.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import math
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

from outrig.service.backends.memory.idempotency import Outcome, RequestLog
from outrig.service.backends.memory.journal import Record, WriteAnswer
from outrig.service.backends.memory.recorder import Recorder
from outrig.service.engine.clock import Clock
from outrig.service.engine.deliveries import check_ack_seconds, check_delay
from outrig.service.engine.model import Delivery, NewEntry, Returned, StoredEntry, Template
from outrig.service.engine.space import SpaceEngine
from outrig.service.exceptions import DeliveryExpiredError, SpaceError

__all__ = ["DeliveringMixin", "visibility_record"]


def visibility_record(space: str, stored: StoredEntry, max_deliveries: int = 0) -> Record:
    """An entry's delivery state as it is now (memory/journal.py), with its pending delivery's
    take's own `max_deliveries` (`SpaceEngine.take_limit`; 0: none)."""
    return (
        "visibility",
        space,
        stored.id,
        stored.hidden_until,
        stored.receipt,
        stored.deliveries,
        stored.dead_letter_reason or None,
        max_deliveries,
    )


class DeliveringMixin:
    """Deliveries of the memory backend's spaces: see the module docstring."""

    clock: Clock
    _recorder: Recorder | None
    _requests: RequestLog

    if TYPE_CHECKING:  # MemoryBackend's, used here

        def engine(self, name: str) -> SpaceEngine: ...
        def note(self, records: Sequence[Record]) -> None: ...
        def _check_store(self) -> None: ...
        async def _replay(self, request_id: str, space: str, kind: str) -> Any: ...
        def _acting_for(self, outcome: Outcome | None) -> contextlib.AbstractContextManager[None]: ...
        def _acted(self, outcome: Outcome | None, result: Any, *, keep: bool = False) -> None: ...

        # Their signatures are backend.py's (`_find` with `ack` and `max_deliveries`).
        _commit: Callable[..., Awaitable[None]]
        _find: Callable[..., Awaitable[list[StoredEntry]]]

    # ------------------------------------------------------------------ dead letters

    def _init_delivering(self) -> None:
        # The entry the last dead-letter move wrote, with its space's engine (a nack's undo
        # revokes it).
        self._moved: tuple[SpaceEngine, StoredEntry] | None = None

    def _watch_dead_letters(self, name: str, engine: SpaceEngine) -> None:
        """Have `engine` move its dead letters into its dead-letter space's engine (made on first
        use), recorded in one change."""
        engine.on_dead_letter = lambda stored, reason: self._move_dead_letter(name, engine, stored, reason)

    def _move_dead_letter(self, space: str, engine: SpaceEngine, stored: StoredEntry, reason: str) -> None:
        """Write an entry `engine` has removed into its dead-letter space: same type, fields,
        payload and remaining lease, a new id, visible, its count and the reason kept."""
        name = engine.dead_letter_space
        dead = self.engine(name)
        remaining = math.inf if stored.expires_at is None else stored.expires_at - self.clock.time()
        new = NewEntry(stored.type_name, stored.lineage[1:], stored.fields, stored.payload, stored.size)
        (moved,), _ = dead.write_entries([new], remaining, carried=(stored.deliveries, reason))
        self._moved = (dead, moved)
        if self._recorder is None:
            return
        records: list[Record] = [
            ("delete", space, stored.id),
            ("put", name, moved.id, moved.arrival, moved.expires_at, moved.payload),
            *(("type", name, t, json.dumps(list(parents))) for t, parents in dead.declared.items()),
            *self._recorder.id_records(name, dead),
            visibility_record(name, moved),
        ]
        self.note(records)

    # ------------------------------------------------------------------ delivering

    async def deliver(
        self,
        space: str,
        templates: Sequence[Template],
        *,
        max_entries: int,
        timeout: float | None,
        ack: float,
        max_deliveries: int = 0,
        request_id: str = "",
        settle: Sequence[int] = (),
    ) -> list[Delivery]:
        check_ack_seconds(ack)
        if request_id:
            earlier = await self._replay(request_id, space, "deliver")
            if earlier is not None:
                return self._still_pending(space, earlier)
        engine = self.engine(space)
        self._check_store()
        outcome = self._requests.begin(request_id, space, "deliver") if request_id else None
        with self._acting_for(outcome):
            settled = engine.settle(settle) if settle else []
            find = functools.partial(
                self._find, engine, templates, True, max_entries, ack=ack, max_deliveries=max_deliveries
            )
            if settled:
                try:
                    found = await find(0, False)  # none waits: the acks are recorded with it
                except BaseException:
                    _unsettle(engine, settled)
                    raise
                if not found and timeout != 0:
                    # An ack that precedes a take that waits is durable before the take waits.
                    await self._commit_settled(space, engine, settled, outcome)
                    settled = []
                    found = await self._wait_settled(find, timeout, outcome)
            else:
                found = await find(timeout, False)
            deliveries = _deliveries_of(engine, found)
            if (deliveries or settled) and self._recorder is not None:
                await self._commit_deliveries(space, engine, deliveries, outcome, settled)
        if not deliveries:
            if outcome is not None and not settle:  # nothing to answer: a retry acts afresh
                self._requests.abandon(outcome)
            elif outcome is not None:  # the acks are its answer: a retry takes nothing
                self._acted(outcome, _SETTLED_ONLY)
            return deliveries
        self._acted(outcome, (deliveries[0].receipt, len(deliveries), None, None))
        return deliveries

    async def _commit_settled(
        self, space: str, engine: SpaceEngine, settled: list[StoredEntry], outcome: Outcome | None
    ) -> None:
        """Make a take's acks durable before it waits, with its request id's answer so far (the
        acks, nothing taken: a retry gets that if the take never answers)."""
        if self._recorder is not None:
            records: list[Record] = [("delete", space, stored.id) for stored in settled]
            if outcome is not None:
                records.append((*Recorder.request_head(outcome), *_SETTLED_ONLY))
            await self._commit(records, lambda: _unsettle(engine, settled))
        if outcome is not None:
            outcome.committing = True  # the acks are made: a failure from here does not undo them

    async def _wait_settled(
        self,
        find: Callable[[float | None, bool], Awaitable[list[StoredEntry]]],
        timeout: float | None,
        outcome: Outcome | None,
    ) -> list[StoredEntry]:
        """The wait of a take whose acks are durable: if it fails or its caller goes away, the
        request id answers with the acks (a retry takes nothing and acks nothing again)."""
        try:
            return await find(timeout, False)
        except BaseException:
            if outcome is not None:
                self._acted(outcome, _SETTLED_ONLY)
            raise

    def _still_pending(self, space: str, answer: WriteAnswer) -> list[Delivery]:
        """A retried deliver's answer: the first call's deliveries that are still pending."""
        first, count, _, _ = answer
        engine = self.engine(space)
        receipts = (first + i * engine.id_stride for i in range(count))
        return [d for d in map(engine.pending, receipts) if d is not None]

    async def _commit_deliveries(
        self,
        space: str,
        engine: SpaceEngine,
        deliveries: list[Delivery],
        outcome: Outcome | None,
        settled: Sequence[StoredEntry] = (),
    ) -> None:
        """Record a take's deliveries, and the acks of its `settle` (`settled`) in the same batch."""
        assert self._recorder is not None
        try:
            self._check_store()  # a deliver that waited may resume after the store failed
        except SpaceError:
            engine.undeliver(deliveries)
            _unsettle(engine, settled)
            raise
        records: list[Record] = [("delete", space, stored.id) for stored in settled]
        records += [visibility_record(space, d.entry, engine.take_limit(d.receipt)) for d in deliveries]
        records += self._recorder.id_records(space, engine)  # receipts are ids of the space
        if outcome is not None and not deliveries:
            records.append((*Recorder.request_head(outcome), *_SETTLED_ONLY))
        elif outcome is not None:
            # Receipts of one call are consecutive ids (see engine.deliver; a parked take is
            # handed one entry): the first and the count say them all.
            first = deliveries[0].receipt
            assert deliveries[-1].receipt == first + (len(deliveries) - 1) * engine.id_stride
            records.append((*Recorder.request_head(outcome), first, len(deliveries), None, None))

        def undo() -> None:
            engine.undeliver(deliveries)
            _unsettle(engine, settled)

        try:
            await self._commit(records, undo, outcome=outcome, hands_out=True)
        except asyncio.CancelledError:
            # The caller is gone. With a request id its retry gets these deliveries; without one,
            # nobody will: put them back, not counted, as a cancelled blocked take does.
            if outcome is None:
                back = engine.undeliver(deliveries)
                self.note([visibility_record(space, stored) for stored in back])
            raise

    # ------------------------------------------------------------------ settling

    async def ack(self, space: str, receipt: int, *, request_id: str = "") -> None:
        if request_id and await self._replay(request_id, space, "ack") is not None:
            return
        engine = self.engine(space)
        self._check_store()
        outcome = self._requests.begin(request_id, space, "ack") if request_id else None
        with self._acting_for(outcome):
            stored = engine.ack(receipt)
            if self._recorder is not None:
                records: list[Record] = [("delete", space, stored.id)]
                if outcome is not None:
                    records.append((*Recorder.request_head(outcome), receipt, 1, None, None))
                await self._commit(records, lambda: engine.unack(stored), outcome=outcome)
        self._acted(outcome, (receipt, 1, None, None))

    async def ack_many(
        self, space: str, receipts: Sequence[int], *, request_id: str = ""
    ) -> list[DeliveryExpiredError | None]:
        """Acknowledge each delivery of a batch, in one change: per receipt, None (acknowledged)
        or the error that left it alone. A retry with the request id acknowledges nothing again
        and answers the first call's outcomes (after a restart, only their count is known)."""
        if request_id:
            earlier = await self._replay(request_id, space, "ack")
            if isinstance(earlier, list):
                return earlier
            if earlier is not None:
                return _acked_before(receipts, earlier[1])
        engine = self.engine(space)
        self._check_store()
        outcome = self._requests.begin(request_id, space, "ack") if request_id else None
        with self._acting_for(outcome):
            outcomes = engine.ack_each(receipts)
            acked = [stored for stored in outcomes if isinstance(stored, StoredEntry)]
            if self._recorder is not None and (acked or outcome is not None):
                records: list[Record] = [("delete", space, stored.id) for stored in acked]
                if outcome is not None:
                    records.append((*Recorder.request_head(outcome), 0, len(acked), None, None))
                await self._commit(records, lambda: _unsettle(engine, acked), outcome=outcome)
        answer = [error if isinstance(error, DeliveryExpiredError) else None for error in outcomes]
        self._acted(outcome, answer, keep=True)
        return answer

    async def nack(self, space: str, receipt: int, delay: float | None, *, request_id: str = "") -> Returned:
        if delay is not None:
            check_delay(delay)
        engine = self.engine(space)
        if request_id:
            earlier = await self._replay(request_id, space, "nack")
            if earlier is not None:
                _, dead, visible_at, _ = earlier
                return Returned(visible_at, engine.dead_letter_space if dead else "")
        self._check_store()
        outcome = self._requests.begin(request_id, space, "nack") if request_id else None
        with self._acting_for(outcome):
            before = engine.pending(receipt)
            self._moved = None
            returned = engine.nack(receipt, delay)
            moved, self._moved = self._moved, None
            assert before is not None  # engine.nack raised otherwise
            stored = before.entry
            if self._recorder is not None:
                records: list[Record] = [] if returned.dead_letter else [visibility_record(space, stored)]
                if outcome is not None:
                    answer = (receipt, int(bool(returned.dead_letter)), returned.visible_at, None)
                    records.append((*Recorder.request_head(outcome), *answer))

                def undo() -> None:
                    if moved is not None:
                        moved[0].revoke([moved[1]])
                    engine.restore_delivery(before)

                await self._commit(records, undo, outcome=outcome)
        self._acted(outcome, (receipt, int(bool(returned.dead_letter)), returned.visible_at, None))
        return returned

    async def extend(self, space: str, receipt: int, seconds: float, *, request_id: str = "") -> float:
        check_ack_seconds(seconds, "seconds")
        if request_id:
            earlier = await self._replay(request_id, space, "extend")
            if earlier is not None:
                deadline: float = earlier[2]
                return deadline
        engine = self.engine(space)
        self._check_store()
        outcome = self._requests.begin(request_id, space, "extend") if request_id else None
        with self._acting_for(outcome):
            before = engine.pending(receipt)
            deadline = engine.extend(receipt, seconds)
            assert before is not None  # engine.extend raised otherwise
            if self._recorder is not None:
                limit = engine.take_limit(receipt)
                records: list[Record] = [visibility_record(space, before.entry, limit)]
                if outcome is not None:
                    records.append((*Recorder.request_head(outcome), receipt, 1, deadline, None))
                await self._commit(records, lambda: engine.restore_delivery(before), outcome=outcome)
        self._acted(outcome, (receipt, 1, deadline, None))
        return deadline


#: The request id answer of a take that settled deliveries and delivered nothing (yet).
_SETTLED_ONLY: WriteAnswer = (0, 0, None, None)


def _unsettle(engine: SpaceEngine, settled: Sequence[StoredEntry]) -> None:
    """Undo acks (`engine.settle`, `engine.ack_each`) the store could not record."""
    for stored in reversed(settled):
        engine.unack(stored)


def _acked_before(receipts: Sequence[int], count: int) -> list[DeliveryExpiredError | None]:
    """A retried batch ack's answer read back from the store, which keeps how many of its
    receipts the first call acknowledged, not which: all, or each one's error saying so."""
    if count == len(receipts):
        return [None] * count
    error = DeliveryExpiredError(
        f"receipts: the first call with this request_id acknowledged {count} of these "
        f"{len(receipts)} receipts (which ones is not known after a restart); none is pending now"
    )
    return [error] * len(receipts)


def _deliveries_of(engine: SpaceEngine, found: list[StoredEntry]) -> list[Delivery]:
    """The pending deliveries of entries just delivered (one whose deadline has passed already,
    as a tiny `ack` may, is not the caller's any more)."""
    return [engine.delivery_of(stored) for stored in found if stored.receipt is not None]
