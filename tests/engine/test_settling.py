"""A take's `settle` and a batch ack in the engine (engine/deliveries.py `settle`, `ack_each`):
all or none for a settle, per receipt for a batch, on the fake clock."""

from __future__ import annotations

import pytest

from outrig.service.engine import FakeClock
from outrig.service.exceptions import DeliveryExpiredError, InvalidArgumentError

from .test_deliveries import fill, one, visible
from .test_space import make


def test_settle_acknowledges_every_receipt() -> None:
    space = make(FakeClock())
    fill(space, 3)
    first, second = one(space), one(space)
    settled = space.settle([second.receipt, first.receipt])
    assert [stored.id for stored in settled] == [second.entry.id, first.entry.id]
    assert space.in_flight == 0 and visible(space) == [2]
    with pytest.raises(DeliveryExpiredError):
        space.ack(first.receipt)


def test_settle_with_one_receipt_not_pending_changes_nothing() -> None:
    clock = FakeClock()
    space = make(clock)
    fill(space, 3)
    first, second = one(space, ack=10.0), one(space, ack=60.0)
    clock.advance(20.0)  # the first's deadline passes
    with pytest.raises(DeliveryExpiredError, match=f"receipt: {first.receipt} "):
        space.settle([second.receipt, first.receipt])
    assert space.in_flight == 1  # the second is still pending: the settle did not ack it
    assert visible(space) == [0, 2]  # the first is visible again, as the reaper would have made it
    space.ack(second.receipt)


def test_settle_refuses_a_receipt_given_twice() -> None:
    space = make(FakeClock())
    fill(space, 1)
    delivery = one(space)
    with pytest.raises(InvalidArgumentError, match=r"settle: receipt \d+ is given twice"):
        space.settle([delivery.receipt, delivery.receipt])
    assert space.in_flight == 1


def test_ack_each_answers_per_receipt() -> None:
    space = make(FakeClock())
    written = fill(space, 3)
    deliveries = [one(space) for _ in written]
    space.ack(deliveries[1].receipt)
    outcomes = space.ack_each([d.receipt for d in deliveries] + [deliveries[0].receipt])
    assert [getattr(o, "id", None) for o in outcomes[:3:2]] == [written[0], written[2]]
    assert isinstance(outcomes[1], DeliveryExpiredError)
    assert isinstance(outcomes[3], DeliveryExpiredError)  # given twice: acknowledged once
    assert space.in_flight == 0 and visible(space) == []


def test_settled_and_batch_acked_deliveries_are_take_changes() -> None:
    space = make(FakeClock())
    written = fill(space, 4)
    deliveries = [one(space) for _ in written]
    assert space.changes is not None
    head = space.changes.head
    space.settle([deliveries[1].receipt, deliveries[0].receipt])
    space.ack_each([deliveries[2].receipt, deliveries[3].receipt])
    logged = [(change.kind, change.entry.id) for change in space.changes.after(head, 100)]
    assert logged == [("take", written[1]), ("take", written[0]), ("take", written[2]), ("take", written[3])]
    refused = space.changes.head
    with pytest.raises(DeliveryExpiredError):
        space.settle([deliveries[0].receipt])
    assert space.changes.head == refused  # a refused settle logs nothing
