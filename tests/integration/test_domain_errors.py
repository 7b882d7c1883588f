"""Domain errors on the wire: the server sends each failure's reason, and the SDK raises its own
class, which still subclasses the status class it always was.

Against a real server: over the Mux stream and as unary calls, from the blocking and the asyncio
SDK, and as raw gRPC (what a program in another language sees: a google.rpc.ErrorInfo in the
`grpc-status-details-bin` trailer, and `reason` in a Mux error and in a batch lease result).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import cast

import grpc
import pytest
from google.rpc import error_details_pb2, status_pb2

import outrig
import outrig.aio
from outrig.v1 import space_pb2 as pb
from outrig.v1.space_pb2_grpc import SpaceStub

from ..conftest import ServerProcess
from .entries import Task

_CONFLICTING = [outrig.GenericEntry("de.Mixed", ("de.Base",), {}), outrig.GenericEntry("de.Mixed", (), {})]


@pytest.fixture(params=[True, False], ids=["mux", "unary"])
def space(request: pytest.FixtureRequest, server: ServerProcess, space_name: str) -> Iterator[outrig.Space]:
    with outrig.connect(server.address, space=space_name, mux=request.param) as connected:
        yield connected


def test_a_type_conflict_is_a_type_conflict_error(space: outrig.Space) -> None:
    with pytest.raises(outrig.TypeConflictError, match="supertypes") as raised:
        space.write_many(_CONFLICTING)
    assert isinstance(raised.value, outrig.FailedPreconditionError)  # old `except` clauses still work
    assert raised.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert raised.value.reason == "TYPE_CONFLICT"


def test_a_commit_after_an_abort_is_a_transaction_aborted_error(space: outrig.Space) -> None:
    txn = space.transaction()
    txn.abort()
    with pytest.raises(outrig.TransactionAbortedError, match="aborted") as raised:
        txn.commit()
    assert isinstance(raised.value, outrig.FailedPreconditionError)
    assert raised.value.reason == "TRANSACTION_ABORTED"


def test_a_cancelled_lease_is_a_lease_not_found_error(space: outrig.Space) -> None:
    lease = space.write(Task(job="gone"), lease=60.0)
    lease.cancel()
    with pytest.raises(outrig.LeaseNotFoundError) as raised:
        lease.renew(30.0)
    assert isinstance(raised.value, outrig.NotFoundError)
    assert raised.value.reason == "LEASE_NOT_FOUND"
    (result,) = space.renew_many([lease], 30.0)  # a batch result carries the reason too
    assert isinstance(result.error, outrig.LeaseNotFoundError)


def test_a_bad_argument_carries_its_reason(space: outrig.Space) -> None:
    with pytest.raises(outrig.InvalidArgumentError) as raised:
        space.write(Task(job="x"), lease=-1.0)
    assert type(raised.value) is outrig.InvalidArgumentError
    assert raised.value.reason == "INVALID_REQUEST"


async def test_the_asyncio_sdk_raises_the_same_classes(server: ServerProcess, space_name: str) -> None:
    for mux in (True, False):
        async with outrig.aio.connect(server.address, space=space_name, mux=mux) as space:
            with pytest.raises(outrig.TypeConflictError):
                await space.write_many(_CONFLICTING)
            txn = await space.transaction()
            await txn.abort()
            with pytest.raises(outrig.TransactionAbortedError):
                await txn.commit()


def _error_info(err: grpc.RpcError) -> error_details_pb2.ErrorInfo:
    # types-grpcio types each item as a class with .key and .value: it is a (key, value) tuple.
    metadata = cast("Sequence[tuple[str, bytes]]", err.trailing_metadata())
    (details,) = [value for key, value in metadata if key == "grpc-status-details-bin"]
    status = status_pb2.Status.FromString(details)
    assert status.code == err.code().value[0]
    (packed,) = status.details
    info = error_details_pb2.ErrorInfo()
    assert packed.Unpack(info)
    return info


def test_another_language_reads_the_reason_from_the_status_details(
    server: ServerProcess, space_name: str
) -> None:
    with grpc.insecure_channel(server.address) as channel:
        with pytest.raises(grpc.RpcError) as raised:
            SpaceStub(channel).Commit(pb.EndRequest(space=space_name, transaction=123456789))
        assert raised.value.code() == grpc.StatusCode.NOT_FOUND
        info = _error_info(raised.value)
        assert (info.domain, info.reason) == ("outrig.v1", "TRANSACTION_NOT_FOUND")


def test_a_request_id_used_again_for_another_call_is_a_request_conflict(
    server: ServerProcess, space_name: str
) -> None:
    with grpc.insecure_channel(server.address) as channel:
        stub = SpaceStub(channel)
        first = pb.WriteRequest(space=space_name, request_id="de-1")
        first.entry.type_name = "de.A"
        stub.Write(first)
        with pytest.raises(grpc.RpcError) as raised:
            stub.Take(
                pb.MatchRequest(
                    space=space_name,
                    request_id="de-1",
                    if_exists=True,
                    templates=[pb.Template(type_name="de.A")],
                )
            )
        assert raised.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert _error_info(raised.value).reason == "REQUEST_CONFLICT"


def test_a_mux_error_carries_its_reason(server: ServerProcess, space_name: str) -> None:
    with grpc.insecure_channel(server.address) as channel:
        mux = SpaceStub(channel).Mux
        request = pb.MuxRequest(
            ops=[pb.MuxOp(id=1, commit=pb.EndRequest(space=space_name, transaction=987654321))]
        )
        replies = mux(iter([request]))
        reply = next(replies)
        (result,) = reply.results
        assert result.error.code == grpc.StatusCode.NOT_FOUND.value[0]
        assert result.error.reason == pb.TRANSACTION_NOT_FOUND
        replies.cancel()
