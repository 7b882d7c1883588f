"""A durable server SIGKILLed between takes with an acknowledgement deadline and their acks loses
nothing that was not acknowledged, undoes no ack, and keeps the delivery counts.

A real `outrig serve --data-dir`, driven through raw outrig.v1 stubs: jobs are written, taken with
ack (some with a deadline long enough to outlive the restart, some short), some acked, and the
server is SIGKILLed. After the restart, on the same data dir: the acked jobs are gone for good;
the pending deliveries are still pending (their receipts ack them, and nobody else is handed
them); the short ones, past their deadline, are visible again with their count; the jobs never
taken are there; and a retried ack (same request id) of an ack made before the kill is answered,
not refused.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest

from outrig.v1 import space_pb2 as pb
from outrig.v1.space_pb2_grpc import SpaceStub

from ..conftest import ServerProcess
from ..polling import wait_until

SPACE = "crash-acks"
JOBS = 12


def _job(n: int) -> pb.Entry:
    entry = pb.Entry(type_name="Job")
    entry.fields["n"].int_value = n
    return entry


def _take(stub: SpaceStub, count: int, ack: float) -> list[tuple[int, pb.Delivery]]:
    reply = stub.TakeMany(
        pb.MatchRequest(
            space=SPACE, templates=[pb.Template(type_name="Job")], max_entries=count, timeout=0, ack=ack
        )
    )
    return [
        (entry.fields["n"].int_value, d) for entry, d in zip(reply.entries, reply.deliveries, strict=True)
    ]


def test_sigkill_between_take_and_ack_loses_and_undoes_nothing(
    server_factory: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    data_dir = tmp_path / "data"
    server = server_factory("--data-dir", str(data_dir))
    with grpc.insecure_channel(server.address) as channel:
        stub = SpaceStub(channel)
        stub.WriteMany(
            pb.WriteManyRequest(
                space=SPACE, entries=[_job(n) for n in range(JOBS)], lease=pb.LeaseDuration(forever=True)
            )
        )
        acked = _take(stub, 3, ack=600.0)
        for n, (_, delivery) in enumerate(acked):
            stub.Ack(pb.AckRequest(space=SPACE, receipt=delivery.receipt, request_id=f"ack-{n}"))
        pending = _take(stub, 3, ack=600.0)
        short = _take(stub, 2, ack=1.0)
        assert [n for n, _ in acked + pending + short] == list(range(8))
    server.stop(signal.SIGKILL)

    server = server_factory("--data-dir", str(data_dir))
    with grpc.insecure_channel(server.address) as channel:
        stub = SpaceStub(channel)
        # The acks made before the kill: answered again on a retry, never refused.
        for n, (_, delivery) in enumerate(acked):
            stub.Ack(pb.AckRequest(space=SPACE, receipt=delivery.receipt, request_id=f"ack-{n}"))
        # The short deliveries' deadline passes (real time: the server's clock): visible again,
        # in their place before the jobs never taken, counted twice on their next delivery.
        count = pb.CountRequest(space=SPACE, templates=[pb.Template(type_name="Job")])
        wait_until(lambda: stub.Count(count).count == 2 + JOBS - 8, what="the expired deliveries to return")
        again = _take(stub, JOBS, ack=600.0)
        assert [n for n, _ in again] == [6, 7, *range(8, JOBS)]
        assert [d.deliveries for _, d in again] == [2, 2] + [1] * (JOBS - 8)
        # The pending deliveries survived: nobody was handed them, their receipts still ack them.
        for _, delivery in pending + again:
            stub.Ack(pb.AckRequest(space=SPACE, receipt=delivery.receipt))
        with pytest.raises(grpc.RpcError) as refused:
            stub.Ack(pb.AckRequest(space=SPACE, receipt=acked[0][1].receipt))  # without its id: fenced
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        described = stub.DescribeSpace(pb.DescribeSpaceRequest(space=SPACE))
        assert (described.entries, described.in_flight) == (0, 0)
    assert server.stop() == 0
