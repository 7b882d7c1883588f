"""Deliveries against a naive reference model: random writes (some delayed), deliveries, acks,
nacks, extensions, settles (a take's: all or none), batch acks (each on its own) and clock
moves, with receipts drawn from every one ever given (and some never given). After each step the
space's visible entries (their order too), its counts, each entry's delivery count, the dead
letters and which receipts are still valid must equal the model's.

The model is a plain list in arrival order of records (value, state, until, receipt, count),
where a due deadline or delay simply turns an entry visible; no index, no timers."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from outrig.service.engine import FakeClock, SpaceEngine, SpaceSettings, StoredEntry
from outrig.service.engine.space import FOREVER
from outrig.service.exceptions import DeliveryExpiredError

from .test_space import contents, new, tpl

LIMIT = 3  # the space's max_deliveries


@dataclass
class Modelled:
    value: int
    until: float | None = None  # hidden until (None: visible)
    receipt: int | None = None  # its pending delivery
    deliveries: int = 0


class DeliveriesMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.clock = FakeClock()
        self.space = SpaceEngine(
            "jobs",
            SpaceSettings(max_deliveries=LIMIT, nack_backoff=1.0, nack_backoff_max=4.0),
            self.clock,
        )
        self.dead: list[tuple[int, int, str]] = []
        self.space.on_dead_letter = lambda stored, reason: self.dead.append(
            (stored.fields["v"].data, stored.deliveries, reason)  # type: ignore[arg-type]
        )
        self.model: list[Modelled] = []  # in arrival order
        self.model_dead: list[tuple[int, int, str]] = []
        self.receipts: list[int] = [10**9]  # every receipt given, and one never given
        self.counter = 0

    # ------------------------------------------------------------ the model's rules

    def _settle_model(self) -> None:
        now = self.clock.time()
        for item in self.model:
            if item.until is not None and item.until <= now:
                if item.receipt is not None and item.deliveries >= LIMIT:
                    self.model.remove(item)
                    self.model_dead.append((item.value, item.deliveries, self._reason()))
                    return self._settle_model()
                item.until = item.receipt = None
        return None

    @staticmethod
    def _reason() -> str:
        return f"max_deliveries={LIMIT} reached in space 'jobs'"

    def _pending(self, receipt: int) -> Modelled | None:
        now = self.clock.time()
        for item in self.model:
            if item.receipt == receipt and item.until is not None and item.until > now:
                return item
        return None

    # ------------------------------------------------------------ rules

    @rule(delay=st.sampled_from([None, None, 0, 2, 5]))
    def write(self, delay: int | None) -> None:
        self.counter += 1
        visible_at = None if delay is None else self.clock.time() + delay
        self.space.write([new("Job", v=self.counter)], FOREVER, visible_at=visible_at)
        until = visible_at if visible_at is not None and visible_at > self.clock.time() else None
        self.model.append(Modelled(self.counter, until))

    @rule(count=st.integers(1, 3), ack=st.sampled_from([1, 3, 10]))
    def deliver(self, count: int, ack: int) -> None:
        deliveries = self.space.deliver([tpl("Job")], count, float(ack))
        expected = [item for item in self.model if item.until is None][:count]
        assert [d.entry.fields["v"].data for d in deliveries] == [item.value for item in expected]
        for delivery, item in zip(deliveries, expected, strict=True):
            item.deliveries += 1
            item.until, item.receipt = self.clock.time() + ack, delivery.receipt
            assert delivery.deliveries == item.deliveries
            self.receipts.append(delivery.receipt)

    @rule(pick=st.integers(0, 1 << 16))
    def ack(self, pick: int) -> None:
        receipt = self.receipts[pick % len(self.receipts)]
        item = self._pending(receipt)
        self._settle_model()  # the engine handles a due deadline first
        if item is None:
            try:
                self.space.ack(receipt)
            except DeliveryExpiredError:
                return
            raise AssertionError(f"receipt {receipt} settled a delivery that is not pending")
        self.space.ack(receipt)
        self.model.remove(item)

    @rule(pick=st.integers(0, 1 << 16), delay=st.sampled_from([None, 0, 2]))
    def nack(self, pick: int, delay: int | None) -> None:
        receipt = self.receipts[pick % len(self.receipts)]
        item = self._pending(receipt)
        self._settle_model()
        if item is None:
            try:
                self.space.nack(receipt, delay)
            except DeliveryExpiredError:
                return
            raise AssertionError(f"receipt {receipt} returned a delivery that is not pending")
        returned = self.space.nack(receipt, None if delay is None else float(delay))
        if item.deliveries >= LIMIT:
            self.model.remove(item)
            self.model_dead.append((item.value, item.deliveries, self._reason()))
            assert returned.dead_letter == "jobs.dead"
            return
        wait = min(2.0 ** (item.deliveries - 1), 4.0) if delay is None else delay
        item.receipt = None
        item.until = self.clock.time() + wait if wait > 0 else None
        assert returned.visible_at == item.until

    @rule(pick=st.integers(0, 1 << 16), seconds=st.sampled_from([1, 4]))
    def extend(self, pick: int, seconds: int) -> None:
        receipt = self.receipts[pick % len(self.receipts)]
        item = self._pending(receipt)
        self._settle_model()
        if item is None:
            try:
                self.space.extend(receipt, float(seconds))
            except DeliveryExpiredError:
                return
            raise AssertionError(f"receipt {receipt} extended a delivery that is not pending")
        assert self.space.extend(receipt, float(seconds)) == self.clock.time() + seconds
        item.until = self.clock.time() + seconds

    @rule(picks=st.lists(st.integers(0, 1 << 16), min_size=1, max_size=3, unique=True))
    def settle(self, picks: list[int]) -> None:
        """A take's settle: all the receipts acknowledged, or (one not pending) none."""
        receipts = list(dict.fromkeys(self.receipts[pick % len(self.receipts)] for pick in picks))
        items = [self._pending(receipt) for receipt in receipts]
        self._settle_model()
        if any(item is None for item in items):
            try:
                self.space.settle(receipts)
            except DeliveryExpiredError:
                return  # and nothing changed: the invariant checks
            raise AssertionError(f"receipts {receipts} settled though one is not pending")
        self.space.settle(receipts)
        for item in items:
            assert item is not None
            self.model.remove(item)

    @rule(picks=st.lists(st.integers(0, 1 << 16), min_size=1, max_size=3))
    def ack_each(self, picks: list[int]) -> None:
        """A batch ack: each pending receipt acknowledged, each other one refused on its own."""
        receipts = [self.receipts[pick % len(self.receipts)] for pick in picks]
        pending = {receipt: self._pending(receipt) for receipt in receipts}
        self._settle_model()
        outcomes = self.space.ack_each(receipts)
        seen: set[int] = set()
        for receipt, outcome in zip(receipts, outcomes, strict=True):
            item = pending[receipt]
            if item is None or receipt in seen:
                assert isinstance(outcome, DeliveryExpiredError)
            else:
                assert isinstance(outcome, StoredEntry)
                self.model.remove(item)
            seen.add(receipt)

    @rule(seconds=st.sampled_from([0.5, 1, 2, 3]))
    def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)
        self.space.reap()
        self._settle_model()

    # ------------------------------------------------------------ what must agree

    @invariant()
    def agrees(self) -> None:
        self.space.reap()
        self._settle_model()
        listed: list[StoredEntry] = contents(self.space, [tpl("Job")])
        shown = [item for item in self.model if item.until is None]
        assert [s.fields["v"].data for s in listed] == [item.value for item in shown]
        assert [s.deliveries for s in listed] == [item.deliveries for item in shown]
        assert self.space.count([tpl("Job")]) == len(shown)
        stats = self.space.statistics()
        assert stats.entries == len(self.model)
        assert stats.in_flight == sum(item.receipt is not None for item in self.model)
        assert stats.delayed == sum(item.until is not None and item.receipt is None for item in self.model)
        assert sorted(self.dead) == sorted(self.model_dead)  # several due at once: any order
        for receipt in self.receipts:
            assert (self.space.pending(receipt) is not None) == (self._pending(receipt) is not None)


DeliveriesMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
test_deliveries_against_a_model = DeliveriesMachine.TestCase
