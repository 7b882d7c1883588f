"""Settling in the next take and batch acks through the blocking SDK, against a real in-process
server with a fake clock, in one space and in a space of 3 partitions (where a take's settle of
other partitions' receipts, and a batch ack over partitions, go through the fan-out): take,
take_nowait and take_many with ``settle=``, `Space.ack_many`, the worker loop
`Space.deliveries`, and bad input. tests/integration/test_settling_async.py runs the twin."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import grpc
import pytest

import outrig
from outrig._codec import encode_value
from outrig.service.config import Limits, ServerConfig
from outrig.testing import LocalServer
from outrig.v1 import space_pb2 as pb
from outrig.v1.space_pb2_grpc import SpaceStub

from .test_deliveries import Job, Served, numbers, serve, settings


@pytest.fixture(params=["plain", "partitioned"])
def served(request: pytest.FixtureRequest) -> Iterator[Served]:
    yield from serve(str(request.param))


def test_a_take_settles_the_deliveries_given(served: Served) -> None:
    space = served.space
    space.write_many([Job(region=region, n=n) for n, region in enumerate(["eu", "us", "eu", "ap"])])
    first = space.take(Job(region="eu"), timeout=1.0, ack=30.0)
    assert first is not None
    second = space.take(Job(region="eu"), timeout=1.0, ack=30.0, settle=first)
    assert first.settled and second is not None and not second.settled
    with pytest.raises(outrig.DeliveryExpiredError):
        first.ack()  # the take acknowledged it
    # A settle across partitions (eu's receipt, a take of us's jobs) and take_many.
    third = space.take_nowait(Job(region="us"), ack=30.0, settle=[second])
    assert third is not None and second.settled
    many = space.take_many(Job(), max_entries=5, timeout=1.0, ack=30.0, settle=[third])
    assert third.settled and numbers(d.entry for d in many) == [3]
    assert space.take_nowait(Job(), ack=30.0, settle=many) is None  # settles, takes nothing
    assert many[0].settled
    assert space.browse().entries == []  # every entry acknowledged for good


def test_a_settle_of_a_delivery_past_its_deadline_takes_nothing(served: Served) -> None:
    space = served.space
    space.write_many([Job(region="eu", n=1), Job(region="eu", n=2)])
    late = space.take(Job(region="eu"), timeout=1.0, ack=10.0)
    fresh = space.take(Job(region="eu"), timeout=1.0, ack=60.0)
    assert late is not None and fresh is not None
    served.advance(20.0)
    with pytest.raises(outrig.DeliveryExpiredError, match=str(late.receipt)) as raised:
        space.take(Job(region="eu"), timeout=1.0, ack=30.0, settle=[fresh, late])
    assert raised.value.reason == "DELIVERY_EXPIRED"
    assert not fresh.settled and not late.settled
    if served.shape == "plain":  # one partition: all or nothing (the fan-out acks per partition)
        fresh.ack()
    again = space.take(Job(region="eu"), timeout=1.0, ack=30.0)
    assert again is not None and again.entry == Job(region="eu", n=1) and again.deliveries == 2


def test_ack_many_acknowledges_a_take_manys_list(served: Served) -> None:
    space = served.space
    space.write_many([Job(region=region, n=n) for n, region in enumerate(["eu", "us", "ap", "eu"])])
    many = space.take_many(Job(), max_entries=4, timeout=1.0, ack=30.0)
    assert len(many) == 4
    many[2].ack()
    outcomes = space.ack_many(many)
    assert [outcome is None for outcome in outcomes] == [True, True, False, True]
    assert isinstance(outcomes[2], outrig.DeliveryExpiredError)
    assert all(delivery.settled for delivery in many)
    assert space.browse().entries == [] and space.ack_many([]) == []


def test_the_worker_loop_settles_each_delivery_with_the_next_take(served: Served) -> None:
    space = served.space
    space.write_many([Job(region="eu", n=n) for n in range(5)])
    done: list[int | None] = []
    with space.deliveries(Job(region="eu"), ack=30.0, timeout=0.5) as jobs:
        for delivery in jobs:
            assert jobs.current is delivery
            done.append(numbers([delivery.entry])[0])
            if done[-1] == 1 and delivery.deliveries == 1:
                delivery.nack(delay=0)  # the body settles it itself: visible again at once
    assert done == [0, 1, 1, 2, 3, 4]  # the nacked job came back
    assert jobs.current is None and jobs.late == 0
    assert space.browse().entries == []  # all acknowledged, the last by the take that timed out


def _fail_at(space: outrig.Space, n: int) -> None:
    with space.deliveries(Job(region="eu"), ack=30.0) as jobs:
        for delivery in jobs:
            if numbers([delivery.entry]) == [n]:
                raise KeyError("n")


def test_the_worker_loop_nacks_on_an_exception_and_acks_the_last_on_exit(served: Served) -> None:
    space = served.space
    space.write_many([Job(region="eu", n=n) for n in range(3)])
    with pytest.raises(KeyError):
        _fail_at(space, 1)
    # 0 was settled by the take of 1; 1 was returned (with the space's backoff), 2 untouched.
    (browsed_1,) = [b for b in space.browse().entries if b.entry == Job(region="eu", n=1)]
    assert browsed_1.deliveries == 1 and browsed_1.receipt is None
    assert browsed_1.visible_at == pytest.approx(served.now() + 5.0)  # BACKOFF
    with space.deliveries(Job(region="eu"), ack=30.0, timeout=0.5) as jobs:
        for delivery in jobs:
            assert delivery.entry == Job(region="eu", n=2)
            break
    assert [b.entry for b in space.browse().entries] == [Job(region="eu", n=1)]  # 2 acked on exit


def test_the_worker_loop_goes_on_after_a_job_outran_its_deadline(served: Served) -> None:
    space = served.space
    space.write_many([Job(region="eu", n=1)])
    seen: list[int] = []
    with space.deliveries(Job(region="eu"), ack=10.0, timeout=0.5) as jobs:
        for delivery in jobs:
            seen.append(delivery.deliveries)
            if len(seen) == 1:
                served.advance(20.0)  # the job outran its ack: delivered again
    assert seen == [1, 2] and jobs.late == 1
    assert space.browse().entries == []


def test_bad_settles_and_batches_are_refused(served: Served) -> None:
    space = served.space
    space.write_many([Job(region="eu", n=1), Job(region="eu", n=2)])
    delivery = space.take(Job(region="eu"), timeout=1.0, ack=30.0)
    assert delivery is not None
    other = space.with_space("elsewhere")
    other.write(Job(region="eu"))
    foreign = other.take(Job(region="eu"), timeout=1.0, ack=30.0)
    assert foreign is not None
    with pytest.raises(ValueError, match="belongs to space 'elsewhere'"):
        space.take(Job(region="eu"), timeout=1.0, ack=30.0, settle=foreign)
    with pytest.raises(ValueError, match="belongs to space 'elsewhere'"):
        space.ack_many([delivery, foreign])
    with pytest.raises(TypeError, match="settle needs ack"):
        space.take(Job(region="eu"), timeout=1.0, settle=delivery)  # type: ignore[call-overload]
    with pytest.raises(TypeError, match="settle must"):
        space.take(Job(region="eu"), timeout=1.0, ack=30.0, settle=[1])  # type: ignore[list-item]
    stub = SpaceStub(grpc.insecure_channel(served.server.address))
    request = pb.MatchRequest(space="jobs", timeout=0.0, ack=30.0, request_id=uuid.uuid4().hex)
    request.templates.add().CopyFrom(pb.Template(type_name="deliveries.Job"))
    request.templates[0].fields["region"].CopyFrom(encode_value("eu", "region"))
    for receipts, code, text in (
        ([foreign.receipt], grpc.StatusCode.FAILED_PRECONDITION, str(foreign.receipt)),  # not this space's
        ([2**62], grpc.StatusCode.FAILED_PRECONDITION, str(2**62)),  # never given
        ([delivery.receipt, delivery.receipt], grpc.StatusCode.INVALID_ARGUMENT, "twice"),
        ([0], grpc.StatusCode.INVALID_ARGUMENT, "settle: 0 is no receipt"),
    ):
        del request.settle[:]
        request.settle.extend(receipts)
        with pytest.raises(grpc.RpcError) as raised:
            stub.Take(request)
        assert raised.value.code() == code and text in str(raised.value.details()), receipts
    plain = pb.MatchRequest(space="jobs", timeout=0.0, settle=[delivery.receipt])
    with pytest.raises(grpc.RpcError) as raised:
        stub.Take(plain)
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "settle: only a take with an acknowledgement deadline" in str(raised.value.details())
    with pytest.raises(grpc.RpcError) as raised:
        stub.Ack(pb.AckRequest(space="jobs", receipt=delivery.receipt, receipts=[delivery.receipt]))
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "not both" in str(raised.value.details())
    delivery.ack()  # still pending: every refusal above changed nothing
    assert space.count(Job()) == 1


def test_too_many_receipts_are_refused_naming_the_limit() -> None:
    config = ServerConfig(spaces={"jobs": settings("plain")}, limits=Limits(max_receipts=2))
    with (
        LocalServer(config, fake_clock=True) as server,
        outrig.connect(server.address, space="jobs") as space,
    ):
        space.write_many([Job(region="eu", n=n) for n in range(3)])
        many = space.take_many(Job(), max_entries=3, timeout=1.0, ack=30.0)
        with pytest.raises(
            outrig.InvalidArgumentError, match="receipts: 3 receipts exceed the limit max_receipts=2"
        ):
            space.ack_many(many)
        with pytest.raises(
            outrig.InvalidArgumentError, match="settle: 3 receipts exceed the limit max_receipts=2"
        ):
            space.take_nowait(Job(), ack=30.0, settle=many)
        assert [outcome is None for outcome in space.ack_many(many[:2])] == [True, True]
