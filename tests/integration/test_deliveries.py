"""Takes with an acknowledgement deadline through the blocking SDK, against a real in-process
server with a fake clock (deadlines and delays pass when the test moves it; the test polls for
what the server's timers then do, never sleeps), in one space and in a space of 3 partitions.

tests/integration/test_deliveries_async.py runs the asyncio twin; docs/work-queues.md describes
what is tested here.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, assert_type, cast

import grpc
import pytest

import outrig
from outrig._codec import encode_value
from outrig._routing import ID_STRIDE, request_partition, value_partition
from outrig.service.config import ServerConfig
from outrig.service.engine import SpaceSettings
from outrig.testing import LocalServer
from outrig.v1 import space_pb2 as pb
from outrig.v1.space_pb2_grpc import SpaceStub

from ..polling import wait_for_waiters, wait_until

BACKOFF = 5.0  # the space's nack_backoff (doubling, at most BACKOFF_MAX)
BACKOFF_MAX = 40.0
PARTITIONS = 3


@dataclass
class Job(outrig.Entry, type_name="deliveries.Job"):
    region: str | None = None
    n: int | None = None


def numbers(entries: Iterable[object]) -> list[int | None]:
    return [cast(Job, entry).n for entry in entries]


def settings(shape: str, **overrides: Any) -> SpaceSettings:
    routed: dict[str, Any] = (
        {"partition_by": "region", "partitions": PARTITIONS} if shape == "partitioned" else {}
    )
    return SpaceSettings(nack_backoff=BACKOFF, nack_backoff_max=BACKOFF_MAX, **routed, **overrides)


@dataclass
class Served:
    server: LocalServer
    space: outrig.Space
    shape: str

    def advance(self, seconds: float) -> None:
        assert self.server.clock is not None
        self.server.clock.advance(seconds)

    def now(self) -> float:
        assert self.server.clock is not None
        return self.server.clock.time()

    def dead_letter(self, region: str = "eu") -> str:
        """The space a job of `region` goes to from "jobs", as a Nack names it: "jobs.dead" (a
        partition's dead letters go to the same partition of it)."""
        return "jobs.dead"

    def key(self, region: str = "eu") -> str:
        """Where the server parks a take of `region`'s jobs: the space, or its partition."""
        if self.shape == "plain":
            return self.space.name
        k = value_partition(encode_value(region, "region"), PARTITIONS)
        return f"{self.space.name}~{k}"


def serve(shape: str, **overrides: Any) -> Iterator[Served]:
    config = ServerConfig(spaces={"jobs": settings(shape, **overrides)})
    with (
        LocalServer(config, fake_clock=True) as server,
        outrig.connect(server.address, space="jobs") as space,
    ):
        yield Served(server, space, shape)


@pytest.fixture(params=["plain", "partitioned"])
def shape(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def served(shape: str) -> Iterator[Served]:
    yield from serve(shape)


@pytest.fixture
def limited(shape: str) -> Iterator[Served]:
    """A space whose entries go to the dead-letter space after 3 deliveries."""
    yield from serve(shape, max_deliveries=3)


def visible(space: outrig.Space, template: Job) -> Any:
    """Poll until `template` matches a visible entry (the server's timer made it visible)."""
    return wait_until(lambda: space.read_nowait(template), what=f"{template} visible again")


# ---------------------------------------------------------------- the calls


def test_a_delivery_hides_its_entry_until_it_is_acknowledged(served: Served) -> None:
    space = served.space
    space.write(Job(region="eu", n=1))
    delivery = space.take(Job(region="eu"), timeout=1.0, ack=30.0)
    assert isinstance(delivery, outrig.Delivery)
    assert delivery.entry == Job(region="eu", n=1)
    assert delivery.deliveries == 1
    assert delivery.deadline == pytest.approx(served.now() + 30.0)
    assert delivery.receipt > 0 and delivery.dead_letter_reason == ""
    # Invisible to every other read, take and count while it is pending, but still stored.
    assert space.read_nowait(Job()) is None
    assert space.take_nowait(Job(region="eu")) is None
    assert space.count(Job()) == 0
    (browsed,) = space.browse().entries
    assert (browsed.receipt, browsed.deliveries) == (delivery.receipt, 1)
    assert browsed.deadline == pytest.approx(delivery.deadline)
    delivery.ack()
    assert delivery.settled
    served.advance(60.0)  # the deadline passes: an acknowledged delivery never comes back
    assert space.browse().entries == []
    assert space.take(Job(), timeout=0.05, ack=5.0) is None


def test_nack_returns_the_entry_to_its_place_in_arrival_order(served: Served) -> None:
    space = served.space
    space.write_many([Job(region="eu", n=n) for n in range(3)])
    first = space.take(Job(region="eu"), timeout=1.0, ack=30.0)
    assert first is not None and first.entry == Job(region="eu", n=0)
    returned = first.nack(delay=0)
    assert returned == outrig.Returned(visible_at=None, dead_letter="")
    again = space.take(Job(region="eu"), timeout=1.0, ack=30.0)
    assert again is not None and again.entry == Job(region="eu", n=0)  # before n=1 and n=2
    assert again.deliveries == 2
    assert again.receipt != first.receipt
    again.ack()
    assert numbers(space.take_many(Job(region="eu"), max_entries=5)) == [1, 2]


def test_a_nack_without_delay_backs_off_exponentially(served: Served) -> None:
    space = served.space
    space.write(Job(region="eu", n=7))
    waits = []
    for deliveries in (1, 2, 3, 4, 5):
        delivery = space.take(Job(region="eu"), timeout=1.0, ack=600.0)
        assert delivery is not None and delivery.deliveries == deliveries
        returned = delivery.nack()
        assert returned.visible_at is not None and returned.dead_letter == ""
        waits.append(round(returned.visible_at - served.now(), 6))
        assert space.read_nowait(Job()) is None  # hidden until its time
        served.advance(waits[-1] + 0.01)
        visible(space, Job(region="eu"))
    assert waits == [BACKOFF, 2 * BACKOFF, 4 * BACKOFF, BACKOFF_MAX, BACKOFF_MAX]


def test_extend_pushes_the_deadline(served: Served) -> None:
    space = served.space
    space.write(Job(region="eu", n=1))
    delivery = space.take(Job(region="eu"), timeout=1.0, ack=10.0)
    assert delivery is not None
    served.advance(8.0)
    deadline = delivery.extend(20.0)
    assert deadline == pytest.approx(served.now() + 20.0) == pytest.approx(delivery.deadline)
    served.advance(15.0)  # past the first deadline, before the new one
    space.count(Job())  # a round trip: the reaper has had its turn at the moved clock
    assert space.read_nowait(Job()) is None
    delivery.ack()
    assert space.browse().entries == []


def test_a_passed_deadline_redelivers_whole_and_fences_the_old_receipt(served: Served) -> None:
    space = served.space
    space.write(Job(region="eu", n=3), lease=3600.0)
    lost = space.take(Job(region="eu"), timeout=1.0, ack=5.0)
    assert lost is not None
    served.advance(6.0)  # the worker "died": nobody acks
    assert visible(space, Job(region="eu")) == Job(region="eu", n=3)
    now = space.take(Job(region="eu"), timeout=1.0, ack=5.0)
    assert now is not None and now.deliveries == 2 and now.entry == Job(region="eu", n=3)
    # The late worker comes back: its receipt settles nothing, and the new delivery stands.
    for late in (lost.ack, lambda: lost.nack(delay=0), lambda: lost.extend(60.0)):
        with pytest.raises(outrig.DeliveryExpiredError) as raised:
            late()
        assert raised.value.code == grpc.StatusCode.FAILED_PRECONDITION
        assert raised.value.reason == "DELIVERY_EXPIRED"
        assert isinstance(raised.value, outrig.FailedPreconditionError)
    assert space.read_nowait(Job()) is None
    now.ack()


def test_a_parked_taker_gets_the_redelivered_entry(served: Served) -> None:
    space = served.space
    space.write(Job(region="eu", n=4))
    first = space.take(Job(region="eu"), timeout=1.0, ack=5.0)
    assert first is not None
    got: list[outrig.Delivery | None] = []
    taker = threading.Thread(target=lambda: got.append(space.take(Job(region="eu"), timeout=10.0, ack=30.0)))
    taker.start()
    wait_for_waiters(served.server, served.key(), 1)
    served.advance(5.5)
    taker.join(15.0)
    (second,) = got
    assert second is not None and second.deliveries == 2 and second.entry == Job(region="eu", n=4)
    second.ack()


def test_take_many_and_take_nowait_deliver(served: Served) -> None:
    space = served.space
    space.write_many([Job(region="eu", n=n) for n in range(4)])
    deliveries = space.take_many(Job(region="eu"), max_entries=3, timeout=1.0, ack=30.0)
    assert numbers(d.entry for d in deliveries) == [0, 1, 2]
    assert len({d.receipt for d in deliveries}) == 3
    assert all(isinstance(d, outrig.Delivery) and d.deliveries == 1 for d in deliveries)
    single = space.take_nowait(Job(region="eu"), ack=30.0)
    assert single is not None and single.entry == Job(region="eu", n=3)
    assert space.take_nowait(Job(region="eu"), ack=30.0) is None
    assert space.take_many(Job(region="eu"), max_entries=3, timeout=0.05, ack=30.0) == []
    for delivery in [*deliveries, single]:
        delivery.ack()
    assert space.browse().entries == []


def _fail_while_taking(space: outrig.Space, expected: Job) -> None:
    with space.taking(Job(region="eu"), ack=30.0, timeout=1.0) as failing:
        assert failing is not None and failing.entry == expected
        _ = 1 / 0


def test_taking_acks_on_a_normal_exit_and_nacks_on_an_exception(served: Served) -> None:
    space = served.space
    space.write_many([Job(region="eu", n=1), Job(region="eu", n=2)])
    with space.taking(Job(region="eu"), ack=30.0, timeout=1.0) as delivery:
        assert delivery is not None and delivery.entry == Job(region="eu", n=1)
    assert delivery.settled
    with pytest.raises(ZeroDivisionError):
        _fail_while_taking(space, Job(region="eu", n=2))
    assert space.read_nowait(Job()) is None  # returned with the space's backoff
    served.advance(BACKOFF + 0.01)
    assert visible(space, Job(region="eu")) == Job(region="eu", n=2)
    with space.taking(Job(region="eu"), ack=30.0, timeout=1.0) as settled_inside:
        assert settled_inside is not None and settled_inside.deliveries == 2
        settled_inside.nack(delay=0)  # the block settled it: the exit leaves it alone
    with space.taking(Job(region="eu"), ack=30.0, timeout=1.0) as last:
        assert last is not None and last.deliveries == 3
    with space.taking(Job(region="eu"), ack=30.0, timeout=0.05) as nothing:
        assert nothing is None
    assert space.browse().entries == []


# ---------------------------------------------------------------- dead letters


def test_the_take_s_max_deliveries_moves_an_entry_to_the_dead_letter_space(served: Served) -> None:
    space = served.space
    space.write(Job(region="eu", n=9), lease=3600.0)
    for deliveries in (1, 2):
        delivery = space.take(Job(region="eu"), timeout=1.0, ack=30.0, max_deliveries=2)
        assert delivery is not None and delivery.deliveries == deliveries
        returned = delivery.nack(delay=0)
    # The space it went to: in a partitioned space, the dead-letter space's partition.
    assert returned == outrig.Returned(visible_at=None, dead_letter=served.dead_letter())
    assert space.count(Job()) == 0 and space.browse().entries == []
    dead = space.with_space("jobs.dead")
    found = dead.take(Job(region="eu"), timeout=1.0, ack=30.0)
    assert found is not None and found.entry == Job(region="eu", n=9)
    assert found.deliveries == 3  # the count goes on
    assert "max_deliveries=2" in found.dead_letter_reason and "jobs" in found.dead_letter_reason
    found.ack()


def test_the_space_s_max_deliveries_counts_expired_deliveries_too(limited: Served) -> None:
    space = limited.space
    space.write(Job(region="eu", n=5), lease=3600.0)
    for _ in range(3):
        assert space.take(Job(region="eu"), timeout=1.0, ack=5.0) is not None
        limited.advance(5.5)  # every delivery runs out
        space.count(Job())  # a round trip after the move
    dead = space.with_space("jobs.dead")
    entry = wait_until(lambda: dead.read_nowait(Job(region="eu")), what="the entry in jobs.dead")
    assert entry == Job(region="eu", n=5)
    assert space.read_nowait(Job()) is None
    (browsed,) = dead.browse().entries
    assert browsed.deliveries == 3


def test_describe_counts_deliveries_delays_redeliveries_and_dead_letters(served: Served) -> None:
    space = served.space
    space.write_many([Job(region="eu", n=1), Job(region="eu", n=2)], lease=3600.0)
    space.write(Job(region="eu", n=3), delay=600.0)
    first, second = space.take_many(Job(region="eu"), max_entries=2, timeout=1.0, ack=5.0, max_deliveries=1)
    figures = space.describe()
    assert (figures.in_flight, figures.delayed, figures.redelivered, figures.dead_lettered) == (2, 1, 0, 0)
    assert first.nack(delay=0).dead_letter == served.dead_letter()  # its max_deliveries=1 reached
    served.advance(6.0)  # the second delivery runs out: redelivered (and dead-lettered)
    wait_until(lambda: space.describe().in_flight == 0, what="the second delivery over")
    figures = space.describe()
    assert (figures.in_flight, figures.delayed, figures.redelivered, figures.dead_lettered) == (0, 1, 2, 2)
    assert not second.settled
    assert space.with_space("jobs.dead").count(Job()) == 2


# ---------------------------------------------------------------- delayed writes


def test_a_delayed_write_stays_hidden_until_its_time_and_wakes_a_taker(served: Served) -> None:
    space = served.space
    lease = space.write(Job(region="eu", n=1), lease=3600.0, delay=60.0)
    assert lease.id > 0
    assert space.read_nowait(Job()) is None and space.count(Job()) == 0
    (browsed,) = space.browse().entries
    assert browsed.visible_at == pytest.approx(served.now() + 60.0) and browsed.receipt is None
    got: list[Any] = []
    taker = threading.Thread(target=lambda: got.append(space.take(Job(region="eu"), timeout=10.0)))
    taker.start()
    wait_for_waiters(served.server, served.key(), 1)
    served.advance(61.0)
    taker.join(15.0)
    assert got == [Job(region="eu", n=1)]


def test_visible_at_and_write_many_delays(served: Served) -> None:
    space = served.space
    space.write_many([Job(region="eu", n=1), Job(region="eu", n=2)], visible_at=served.now() + 30.0)
    space.write(Job(region="eu", n=3), visible_at=served.now() - 5.0)  # in the past: visible at once
    assert space.read_nowait(Job()) == Job(region="eu", n=3)
    served.advance(31.0)
    wait_until(lambda: space.count(Job()) == 3, what="the delayed entries visible")
    assert numbers(space.take_many(Job(region="eu"), max_entries=5)) == [1, 2, 3]


def test_notify_hears_of_a_delayed_write_when_it_becomes_visible(served: Served) -> None:
    space = served.space
    with space.notify(Job(region="eu"), lease=600.0) as events:
        space.write(Job(region="eu", n=1), delay=30.0)
        space.write(Job(region="eu", n=2))
        first = next(events)
        assert first.entry == Job(region="eu", n=2)
        served.advance(31.0)
        second = next(events)
        assert second.entry == Job(region="eu", n=1)


# ---------------------------------------------------------------- bad input and retries


def test_bad_deadlines_are_refused_naming_ack(served: Served) -> None:
    space = served.space
    space.write(Job(region="eu", n=1))
    for ack in (0.0, -1.0, 43_200.5, float("inf"), float("nan")):
        with pytest.raises(outrig.InvalidArgumentError, match="ack") as raised:
            space.take(Job(region="eu"), timeout=0, ack=ack)
        assert raised.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert space.take(Job(region="eu"), timeout=0, ack=43_200.0) is not None  # max_ack itself
    with pytest.raises(TypeError, match="ack"):
        space.take(Job(), ack="soon")  # type: ignore[call-overload]
    with pytest.raises(TypeError, match="max_deliveries needs ack"):
        space.take(Job(), max_deliveries=3)  # type: ignore[call-overload]
    with pytest.raises(ValueError, match="not both"):
        space.write(Job(region="eu"), delay=1.0, visible_at=served.now() + 1.0)
    with pytest.raises(outrig.InvalidArgumentError, match="delay"):
        space.write(Job(region="eu"), delay=-1.0)


def test_acking_twice_or_a_foreign_receipt_is_delivery_expired(served: Served) -> None:
    space = served.space
    space.write(Job(region="eu", n=1))
    delivery = space.take(Job(region="eu"), timeout=1.0, ack=30.0)
    assert delivery is not None
    delivery.ack()
    with pytest.raises(outrig.DeliveryExpiredError):
        delivery.ack()
    with pytest.raises(outrig.DeliveryExpiredError):
        delivery.nack()
    # A receipt nobody was given (a lease's id, a made-up number) settles nothing.
    lease = space.write(Job(region="eu", n=2))
    stub = SpaceStub(grpc.insecure_channel(served.server.address))
    for receipt in (lease.id, delivery.receipt + 7 * ID_STRIDE, 2**62):
        with pytest.raises(grpc.RpcError) as raised:
            stub.Ack(pb.AckRequest(space="jobs", receipt=receipt))
        assert raised.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert space.take_nowait(Job(region="eu")) == Job(region="eu", n=2)  # untouched
    # A delivery belongs to its own space.
    other = space.with_space("elsewhere")
    other.write(Job(region="eu"))
    foreign = other.take(Job(region="eu"), timeout=1.0, ack=30.0)
    assert foreign is not None
    with pytest.raises(ValueError, match="belongs to space 'elsewhere'"):
        foreign._ack_request("jobs", "")


def test_a_retried_ack_or_nack_gets_its_first_answer(served: Served) -> None:
    """What the SDK's retry of a call whose reply was lost relies on: the same request id."""
    space = served.space
    space.write_many([Job(region="eu", n=1), Job(region="eu", n=2)])
    stub = SpaceStub(grpc.insecure_channel(served.server.address))
    first, second = space.take_many(Job(region="eu"), max_entries=2, timeout=1.0, ack=30.0)
    ack = pb.AckRequest(space="jobs", receipt=first.receipt, request_id=uuid.uuid4().hex)
    assert stub.Ack(ack) == stub.Ack(ack) == pb.AckReply()
    nack = pb.NackRequest(space="jobs", receipt=second.receipt, delay=0, request_id=uuid.uuid4().hex)
    assert stub.Nack(nack) == stub.Nack(nack)
    again = space.take(Job(region="eu"), timeout=1.0, ack=30.0)
    assert again is not None and again.entry == Job(region="eu", n=2) and again.deliveries == 2
    with pytest.raises(outrig.DeliveryExpiredError):
        first.ack()  # a new request id: the delivery is over


def test_a_retried_take_with_ack_answers_its_first_deliveries(served: Served) -> None:
    space = served.space
    space.write_many([Job(region="eu", n=1), Job(region="eu", n=2)])
    stub = SpaceStub(grpc.insecure_channel(served.server.address))
    request = pb.MatchRequest(space="jobs", timeout=1.0, ack=30.0, request_id=uuid.uuid4().hex)
    request.templates.add().CopyFrom(pb.Template(type_name="deliveries.Job"))
    request.templates[0].fields["region"].CopyFrom(encode_value("eu", "region"))
    once, twice = stub.Take(request), stub.Take(request)
    assert list(once.deliveries) == list(twice.deliveries) and len(once.deliveries) == 1
    assert space.count(Job()) == 1  # the retry took nothing more


def test_a_receipt_names_the_partition_of_its_entry() -> None:
    for routed in serve("partitioned"):
        space = routed.space
        regions = ["eu", "us", "ap", "sa", "af"]
        space.write_many([Job(region=region, n=i) for i, region in enumerate(regions)])
        deliveries = space.take_many(Job(), max_entries=10, timeout=1.0, ack=30.0)  # fanned out
        assert len(deliveries) == len(regions)
        for delivery in deliveries:
            region = cast(Job, delivery.entry).region
            assert delivery.receipt % ID_STRIDE == value_partition(encode_value(region, "region"), PARTITIONS)
            delivery.extend(60.0)  # routed to that partition by the receipt
            delivery.ack()
        assert space.browse().entries == []


def test_the_sdk_routes_a_settlement_by_its_receipt() -> None:
    """Ack, Nack and Extend go to the partition the receipt names (as renewals go by lease id)."""
    for request in (
        pb.AckRequest(receipt=5 * ID_STRIDE + 2),
        pb.NackRequest(receipt=2),
        pb.ExtendRequest(receipt=ID_STRIDE + 2),
    ):
        assert request_partition(request, "region", PARTITIONS) == 2


def test_the_settlements_go_as_unary_calls_too(served: Served) -> None:
    """Without the Mux stream (`connect(..., mux=False)`), every call is its own unary call."""
    with outrig.connect(served.server.address, space="jobs", mux=False) as space:
        space.write_many([Job(region="eu", n=1), Job(region="eu", n=2)])
        first, second = space.take_many(Job(region="eu"), max_entries=2, timeout=1.0, ack=30.0)
        assert first.extend(60.0) == pytest.approx(served.now() + 60.0)
        first.ack()
        assert second.nack(delay=0) == outrig.Returned(None)
        with space.taking(Job(region="eu"), ack=30.0, timeout=1.0) as again:
            assert again is not None and again.deliveries == 2
        assert space.browse().entries == []


def test_the_overloads_tell_mypy_which_a_take_returns(served: Served) -> None:
    """mypy (tests are type-checked) pins what each call returns; the run checks it is so."""
    space = served.space
    space.write_many([Job(region="eu", n=n) for n in range(4)])
    delivered = assert_type(space.take(Job(region="eu"), timeout=1.0, ack=30.0), outrig.Delivery | None)
    many = assert_type(space.take_many(Job(region="eu"), max_entries=2, ack=30.0), list[outrig.Delivery])
    now = assert_type(space.take_nowait(Job(region="eu"), ack=30.0), outrig.Delivery | None)
    assert delivered is not None and now is not None and len(many) == 2
    for delivery in (delivered, *many, now):
        assert_type(delivery.ack(), None)
    assert space.take_nowait(Job(region="eu")) is None
    space.write(Job(region="eu", n=9))
    entry = space.take(Job(region="eu"), timeout=1.0)
    assert not isinstance(entry, outrig.Delivery) and entry == Job(region="eu", n=9)


def test_a_hidden_entry_s_lease_still_rules_it_and_purge_passes_it_by(served: Served) -> None:
    space = served.space
    cancelled = space.write(Job(region="eu", n=1), lease=600.0)
    kept = space.write(Job(region="eu", n=2), lease=600.0)
    first = space.take(Job(region="eu", n=1), timeout=1.0, ack=30.0)
    second = space.take(Job(region="eu", n=2), timeout=1.0, ack=30.0)
    assert first is not None and second is not None
    assert kept.renew(1200.0).duration == pytest.approx(1200.0)  # renew works on a hidden entry
    cancelled.cancel()  # removes it: its delivery is over
    with pytest.raises(outrig.DeliveryExpiredError):
        first.ack()
    space.write(Job(region="eu", n=3))
    assert space.purge(Job(region="eu")) == 1  # the visible one only
    second.ack()
    assert space.browse().entries == []
