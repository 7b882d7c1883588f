"""The at-least-once half of `SpaceEngine`: takes with an acknowledgement deadline (deliveries),
their acks, nacks and extensions, delayed entries, and dead letters (docs/work-queues.md).

A mixin, as transacting.py is: `SpaceEngine` inherits it, and these methods use the engine's
index and lease queue through the names declared for the type checker below.

A *hidden* entry is in the space (`_entries`: its lease runs, it counts against the quotas, renew
and cancel reach it) but not in the index, so no read, take, count, contents or notify meets it,
and no take scans past it. It is hidden either by a pending delivery (`receipt` set,
`hidden_until` its deadline) or until a time (a delayed write, or a delivery returned with a
delay: `receipt` None). Either way one timer in the engine's `LeaseQueue` ends it: filed under the
receipt (a fresh id of the space, never reused), or under the entry's id negated (ids are
positive, so no timer id is ever a lease's). The reaper's `_lapse` handles a due timer as it
handles a due lease: nothing polls.

When a hidden entry becomes visible it is filed again in its place in arrival order (its arrival
is unchanged: `EntryIndex.reorder`), offered to parked takes, and, if it was never delivered (a
delayed write), only then published to notify registrations.

Fencing: only the current pending delivery's receipt settles it; any other receipt (settled
already, past its deadline, its entry cancelled or expired, never given) is a
DeliveryExpiredError and changes nothing (a deadline found past is first handled as the reaper
would have handled it).

A delivery that ends unacknowledged (nack or deadline) when the entry's count has reached
max_deliveries (the take's, else the space's; 0: no limit) moves the entry to the dead-letter
space: the engine removes it and calls `on_dead_letter(entry, reason)`, which the backend sets to
write it there (`SpaceEngine.write_entries(..., carried=)`) and record both in one batch.
"""

from __future__ import annotations

import itertools
import logging
import math
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

from outrig.service.engine.clock import Clock
from outrig.service.engine.index import EntryIndex
from outrig.service.engine.leases import LeaseQueue
from outrig.service.engine.model import Delivery, Returned, StoredEntry, Template, Transaction, Waiter
from outrig.service.engine.partitions import dead_letter_name, split_name
from outrig.service.exceptions import DeliveryExpiredError, InvalidArgumentError

if TYPE_CHECKING:
    from outrig.service.engine.space import SpaceSettings

__all__ = ["DeliveriesMixin", "check_ack_seconds", "check_delay"]

log = logging.getLogger("outrig.service.engine")

# A nack's backoff doubles at most this many times (2**64 seconds is far beyond any lease).
_MAX_DOUBLINGS = 64


def check_ack_seconds(seconds: float, field: str = "ack") -> None:
    """Refuse an acknowledgement deadline that is not a finite number of seconds above 0: the
    one rule the engine, the backends and the codec apply (the codec also holds it to max_ack)."""
    if not (math.isfinite(seconds) and seconds > 0):
        raise InvalidArgumentError(f"{field}: must be finite and > 0 seconds, got {seconds}")


def check_delay(seconds: float, field: str = "delay") -> None:
    """Refuse a delay that is not a finite number of seconds, 0 or more (the one rule, as
    `check_ack_seconds`)."""
    if not (math.isfinite(seconds) and seconds >= 0):
        raise InvalidArgumentError(f"{field}: must be finite and >= 0 seconds, got {seconds}")


class DeliveriesMixin:
    """Deliveries, delayed entries and dead letters of one space: see the module docstring."""

    name: str
    settings: SpaceSettings
    _clock: Clock
    _entries: dict[int, StoredEntry]
    _index: EntryIndex
    _leases: LeaseQueue
    _next_id: int

    if TYPE_CHECKING:  # SpaceEngine's, used here

        def _new_id(self) -> int: ...
        def _remove(self, stored: StoredEntry) -> None: ...
        def _put_back(self, stored: StoredEntry) -> None: ...
        def _offer(self, stored: StoredEntry) -> bool: ...
        def _publish(self, stored: StoredEntry, writer: Transaction | None = None) -> None: ...
        def _expire(self, stored: StoredEntry) -> None: ...
        def _log(
            self, kind: str, stored: StoredEntry, transaction: int = 0, visible_at: float | None = None
        ) -> None: ...

        _select: Callable[..., tuple[list[StoredEntry], bool]]  # (templates, limit, txn, take)

        @staticmethod
        def _expired(stored: StoredEntry, now: float) -> bool: ...

    def _init_deliveries(self) -> None:
        self._pending: dict[int, StoredEntry] = {}  # pending deliveries, by receipt
        self._delayed: dict[int, StoredEntry] = {}  # hidden until a time, by entry id
        self._take_limits: dict[int, int] = {}  # a take's own max_deliveries, by receipt
        self.redelivered = 0  # deliveries that ended unacknowledged (nack, deadline), since made
        self.dead_lettered = 0  # entries moved to the dead-letter space, since made
        # Set by the backend: writes an entry that reached max_deliveries (already removed from
        # this space) into the dead-letter space, with the reason. If it raises, the entry stays.
        self.on_dead_letter: Callable[[StoredEntry, str], None] | None = None
        # Set by the backend: told the time of every timer filed (a deadline, a delay), so that its
        # reaper wakes then rather than at its next pass. Must not raise.
        self.on_timer: Callable[[float], None] | None = None

    # ------------------------------------------------------------------ figures

    @property
    def in_flight(self) -> int:
        """Entries delivered and not yet acknowledged, returned or past their deadline."""
        return len(self._pending)

    @property
    def delayed(self) -> int:
        """Entries hidden until a time (delayed writes, deliveries returned with a delay)."""
        return len(self._delayed)

    def next_timer(self) -> float | None:
        """A time at or before the soonest hidden entry's timer (a deadline, a delay's end), or
        None while nothing is hidden."""
        if not (self._pending or self._delayed):
            return None
        return self._leases.next_expiry()

    def take_limit(self, receipt: int | None) -> int:
        """The max_deliveries of the take that made the pending delivery `receipt` (0: none of
        its own, the space's applies), which the store keeps with the entry's delivery state."""
        return 0 if receipt is None else self._take_limits.get(receipt, 0)

    def hidden_entries(self) -> list[StoredEntry]:
        """Every hidden entry (pending deliveries, then delayed ones), a copy."""
        return [*self._pending.values(), *self._delayed.values()]

    @property
    def dead_letter_space(self) -> str:
        """Where entries go that reach max_deliveries: the configured space or "<space>.dead",
        and for a partition "jobs~3", the same partition of it ("jobs.dead~3")."""
        return dead_letter_name(self.name, self.settings.dead_letter)

    # ------------------------------------------------------------------ hiding and revealing

    @staticmethod
    def _timer_of(stored: StoredEntry) -> int:
        """The id a hidden entry's timer is filed under: its receipt, or its id negated."""
        receipt = stored.receipt
        return -stored.id if receipt is None else receipt

    def _file_hidden(self, stored: StoredEntry) -> None:
        """File the timer of an entry whose `hidden_until` (and `receipt`, if delivered) is set,
        all or nothing; it is not in the index."""
        until = stored.hidden_until
        assert until is not None
        self._leases.add(self._timer_of(stored), until)  # first: the step that can fail
        if stored.receipt is None:
            self._delayed[stored.id] = stored
        else:
            self._pending[stored.receipt] = stored
        if self.on_timer is not None:
            self.on_timer(until)

    def _forget_hidden(self, stored: StoredEntry) -> None:
        """Undo `_file_hidden` (the entry's fields are left as they are). Never raises."""
        until = stored.hidden_until
        assert until is not None
        self._leases.discard(self._timer_of(stored), until)
        receipt = stored.receipt
        if receipt is None:
            self._delayed.pop(stored.id, None)
        else:
            self._pending.pop(receipt, None)

    def _end_hidden(self, stored: StoredEntry) -> None:
        """`_forget_hidden` of an entry whose delivery (if any) ends: its take's limit goes too."""
        self._forget_hidden(stored)
        if stored.receipt is not None:
            self._take_limits.pop(stored.receipt, None)

    def _hide(self, stored: StoredEntry, until: float, receipt: int | None) -> None:
        """Hide an entry of the space: out of the index, or from one timer to another; all or
        nothing."""
        was = stored.hidden_until, stored.receipt
        if was[0] is None:
            self._index.remove(stored)
        else:
            self._forget_hidden(stored)
        stored.hidden_until, stored.receipt = until, receipt
        try:
            self._file_hidden(stored)
        except BaseException:
            stored.hidden_until, stored.receipt = was
            if was[0] is None:
                self._file_visible(stored)
            else:
                self._file_hidden(stored)
            raise

    def _file_visible(self, stored: StoredEntry) -> None:
        """File an entry in the index at its place in arrival order."""
        self._index.insert(stored)
        try:
            self._index.reorder(stored)
        except BaseException:
            self._index.remove(stored)
            raise

    def _reveal(self, stored: StoredEntry) -> None:
        """A hidden entry becomes visible now: filed in its place, offered to waiters, and, a
        delayed write (never delivered), published. Its lease found run out, it expires instead.
        If filing fails, it raises with nothing changed."""
        if self._expired(stored, self._clock.time()):
            self._expire(stored)
            return
        self._file_visible(stored)  # first: the step that can fail
        self._end_hidden(stored)
        stored.hidden_until = stored.receipt = None
        if not stored.deliveries:
            self._publish(stored)
        self._offer(stored)

    def _lapse_timer(self, timer_id: int) -> None:
        """A hidden entry's timer is due (the reaper): a delay ends, or a deadline passes."""
        if timer_id < 0:
            stored = self._delayed.get(-timer_id)
            if stored is not None:
                self._reveal(stored)
            return
        stored = self._pending.get(timer_id)
        if stored is not None:
            self._deadline_passed(stored)

    def _hidden_by_timer(self, timer_id: int) -> StoredEntry | None:
        """The hidden entry whose timer is filed under this id, if any (to refile it)."""
        return self._delayed.get(-timer_id) if timer_id < 0 else self._pending.get(timer_id)

    # ------------------------------------------------------------------ delivering

    def deliver(
        self, templates: Sequence[Template], max_entries: int, ack_seconds: float, max_deliveries: int = 0
    ) -> list[Delivery]:
        """Deliver up to `max_entries` matches, now: each hidden until `ack_seconds` from now under
        a fresh receipt (consecutive ids of the space, in order), its count incremented. A take's
        `max_deliveries` (0: the space's) applies when a delivery of it ends unacknowledged."""
        check_ack_seconds(ack_seconds)
        deadline = self._clock.time() + ack_seconds
        found, _ = self._select(templates, max_entries, None, True)
        first_id = self._next_id
        done = 0
        try:
            for stored in found:
                self._deliver_one(stored, deadline, max_deliveries)
                done += 1
        except BaseException:
            for stored in reversed(found[:done]):
                self._undeliver_one(stored)
            self._next_id = first_id
            raise
        return [self.delivery_of(stored) for stored in found]

    def _deliver_one(self, stored: StoredEntry, deadline: float, max_deliveries: int) -> None:
        receipt = self._new_id()
        self._hide(stored, deadline, receipt)
        stored.deliveries += 1
        if max_deliveries:
            self._take_limits[receipt] = max_deliveries

    def _undeliver_one(self, stored: StoredEntry) -> None:
        """Undo `_deliver_one`: visible again in its place, the delivery not counted."""
        self._file_visible(stored)
        self._end_hidden(stored)
        stored.hidden_until = stored.receipt = None
        stored.deliveries -= 1

    def _claim_delivery(self, stored: StoredEntry, waiter: Waiter) -> Callable[[], None]:
        """Claim an entry for a parked take with an acknowledgement deadline (see `_hand`)."""
        assert waiter.ack is not None
        self._deliver_one(stored, self._clock.time() + waiter.ack, waiter.max_deliveries)
        return lambda: self._undeliver_one(stored)

    @staticmethod
    def delivery_of(stored: StoredEntry) -> Delivery:
        """The pending delivery of an entry just delivered (by `deliver` or to a waiter)."""
        assert stored.receipt is not None
        assert stored.hidden_until is not None
        return Delivery(
            stored, stored.receipt, stored.deliveries, stored.hidden_until, stored.dead_letter_reason
        )

    def pending(self, receipt: int) -> Delivery | None:
        """The delivery `receipt` names if it is still pending (to answer a retried take)."""
        stored = self._pending.get(receipt)
        now = self._clock.time()
        if stored is None or self._expired(stored, now) or (stored.hidden_until or 0.0) <= now:
            return None
        return self.delivery_of(stored)

    def undeliver(self, deliveries: Iterable[Delivery]) -> list[StoredEntry]:
        """Put back deliveries handed to a call that could not answer (its caller went away):
        visible again in their place, not counted, offered to waiters. Returns those put back
        (a delivery settled or ended meanwhile is left alone)."""
        back = [d.entry for d in deliveries if self._pending.get(d.receipt) is d.entry]
        for stored in back:
            self._undeliver_one(stored)
        for stored in back:
            self._offer(stored)
        return back

    # ------------------------------------------------------------------ settling

    def _pending_delivery(self, receipt: int) -> StoredEntry:
        """The entry of the pending delivery `receipt`; DeliveryExpiredError if there is none.
        A delivery found past its deadline, or an entry past its lease, is handled first as the
        reaper would have."""
        stored = self._pending.get(receipt)
        if stored is not None:
            now = self._clock.time()
            if self._expired(stored, now):
                self._expire(stored)
            elif stored.hidden_until is not None and stored.hidden_until <= now:
                self._deadline_passed(stored)
            else:
                return stored
        raise DeliveryExpiredError(
            f"receipt: {receipt} names no pending delivery in space {self.name!r} (acknowledged or "
            "returned already, past its deadline, its entry cancelled or expired, or never given)"
        )

    def ack(self, receipt: int) -> StoredEntry:
        """Acknowledge a pending delivery: its entry leaves the space for good (and is returned)."""
        stored = self._pending_delivery(receipt)
        self._remove(stored)
        self._log("take", stored)
        return stored

    def settle(self, receipts: Sequence[int]) -> list[StoredEntry]:
        """Acknowledge several pending deliveries at once (a take's `settle`): all of them, or,
        one not pending (DeliveryExpiredError naming it) or named twice (InvalidArgumentError),
        none. Returns their entries, removed for good, in the order given."""
        seen: set[int] = set()
        for receipt in receipts:
            if receipt in seen:
                raise InvalidArgumentError(f"settle: receipt {receipt} is given twice")
            seen.add(receipt)
        found = [self._pending_delivery(receipt) for receipt in receipts]  # first: what can fail
        for stored in found:
            self._remove(stored)
            self._log("take", stored)
        return found

    def ack_each(self, receipts: Sequence[int]) -> list[StoredEntry | DeliveryExpiredError]:
        """Acknowledge each pending delivery of a batch on its own: per receipt, its entry
        (removed for good) or the DeliveryExpiredError that left it alone (a receipt given twice
        is acknowledged once: the second finds it settled)."""
        outcomes: list[StoredEntry | DeliveryExpiredError] = []
        for receipt in receipts:
            try:
                outcomes.append(self.ack(receipt))
            except DeliveryExpiredError as err:
                outcomes.append(err)
        return outcomes

    def unack(self, stored: StoredEntry) -> None:
        """Undo `ack` (the store could not record it): the delivery is pending again."""
        if stored.id not in self._entries and stored.receipt is not None:
            self._put_back(stored)

    def restore_delivery(self, delivery: Delivery) -> None:
        """Undo a nack or an extension (the store could not record it): the delivery is pending
        again as `delivery` says, unless its entry has been delivered anew or left the space."""
        stored = delivery.entry
        if stored.receipt not in (None, delivery.receipt):
            return  # delivered again since: that delivery stands
        if stored.id in self._entries:
            self._hide(stored, delivery.deadline, delivery.receipt)
        else:  # it went to the dead-letter space: back (the backend revokes the copy there)
            stored.hidden_until, stored.receipt = delivery.deadline, delivery.receipt
            self._put_back(stored)
        stored.deliveries = delivery.deliveries

    def nack(self, receipt: int, delay: float | None) -> Returned:
        """End a pending delivery unacknowledged: the entry is visible again after `delay` seconds
        (0: now; None: the space's backoff for its count), or, its count at max_deliveries, goes
        to the dead-letter space."""
        if delay is not None:
            check_delay(delay)
        stored = self._pending_delivery(receipt)
        limit = self._take_limits.get(receipt) or self.settings.max_deliveries
        if limit and stored.deliveries >= limit:
            dead = self._dead_letter(stored, limit)
            self.redelivered += 1
            return Returned(None, dead)
        if delay is None:
            delay = self.backoff(stored.deliveries)
        self.redelivered += 1
        if delay <= 0:
            self._reveal(stored)
            return Returned(None)
        visible_at = self._clock.time() + delay
        self._take_limits.pop(receipt, None)
        self._hide(stored, visible_at, None)
        return Returned(visible_at)

    def backoff(self, deliveries: int) -> float:
        """A nack's delay without one: nack_backoff, doubling with each delivery after the first,
        at most nack_backoff_max."""
        settings = self.settings
        doublings = min(max(deliveries - 1, 0), _MAX_DOUBLINGS)
        return float(min(settings.nack_backoff * 2.0**doublings, settings.nack_backoff_max))

    def extend(self, receipt: int, seconds: float) -> float:
        """Move a pending delivery's deadline to `seconds` from now; returns the new deadline."""
        check_ack_seconds(seconds, "seconds")
        stored = self._pending_delivery(receipt)
        deadline = self._clock.time() + seconds
        self._hide(stored, deadline, receipt)
        return deadline

    def _deadline_passed(self, stored: StoredEntry) -> None:
        """A delivery's deadline passed: as a nack without delay (no backoff), or a dead letter.
        Never drops the entry: if the dead-letter space refuses it, it is visible again here."""
        if self._expired(stored, self._clock.time()):
            self._expire(stored)
            return
        receipt = stored.receipt
        assert receipt is not None
        self.redelivered += 1
        limit = self._take_limits.get(receipt) or self.settings.max_deliveries
        if limit and stored.deliveries >= limit:
            try:
                self._dead_letter(stored, limit)
                return
            except Exception:
                log.exception(
                    "space %r: moving entry %d to %r failed; it is visible again",
                    self.name,
                    stored.id,
                    self.dead_letter_space,
                )
        self._reveal(stored)

    def _dead_letter(self, stored: StoredEntry, limit: int) -> str:
        """Move a delivered entry to the dead-letter space (through `on_dead_letter`), all or
        nothing; returns that space's name."""
        # The space a user knows: a partition's ("jobs~3") is its space's ("jobs").
        reason = f"max_deliveries={limit} reached in space {split_name(self.name)[0]!r}"
        self._remove(stored)
        hook = self.on_dead_letter
        if hook is not None:
            try:
                hook(stored, reason)
            except BaseException:
                self._put_back(stored)
                raise
        self.dead_lettered += 1
        self._log("dead", stored)
        return self.dead_letter_space

    # ------------------------------------------------------------------ inspection

    def browse_hidden(
        self, templates: Sequence[Template], ordered: Iterable[StoredEntry]
    ) -> list[StoredEntry]:
        """The visible candidates `ordered` (in arrival order) with the hidden entries that match
        one of `templates` merged in, by arrival (browse shows hidden entries too)."""
        hidden = [
            stored
            for stored in itertools.chain(self._pending.values(), self._delayed.values())
            if any(template.matches(stored) for template in templates)
        ]
        if not hidden:
            return list(ordered)
        return sorted([*ordered, *hidden], key=lambda stored: stored.arrival)
