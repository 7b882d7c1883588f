"""The Mux stream against a real server: its protocol spoken directly, and the SDK over it.

The SDK's own tests (test_sdk_sync, test_sdk_async, the retry and security tests) run over the
stream too, since it is the SDK's default; these are what only a stream has: results out of order,
flow control, cancelling one operation, malformed messages, and a server without Mux.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

import outrig
import outrig.aio
from outrig._codec import encode_entry_into, encode_template_into
from outrig._mux_wire import OP_FIELDS
from outrig._protocol import encode_op, request_message
from outrig.v1 import space_pb2 as pb
from outrig.v1 import space_pb2_grpc

from ..conftest import ServerProcess, start_server
from ..polling import scrape, wait_for_waiters, wait_for_waiters_async
from .entries import Task


def _take(space: str, timeout: float | None = None, n: int | None = None) -> pb.MatchRequest:
    request = pb.MatchRequest(space=space, timeout=timeout)
    encode_template_into(request.templates.add(), Task(n=n))
    return request


def _write(space: str, n: int) -> pb.WriteRequest:
    request = pb.WriteRequest(space=space)
    encode_entry_into(request.entry, Task(n=n))
    return request


def _count(space: str) -> pb.CountRequest:
    request = pb.CountRequest(space=space)
    encode_template_into(request.templates.add(), Task())
    return request


class Stream:
    """A raw Mux call: send MuxOps, read results one by one (whatever messages carry them)."""

    def __init__(self, address: str) -> None:
        self.channel = grpc.insecure_channel(address)
        self._outbox: list[pb.MuxRequest | bytes | None] = []
        self._cond = threading.Condition()
        method: grpc.StreamStreamMultiCallable[pb.MuxRequest | bytes, pb.MuxReply] = (
            self.channel.stream_stream(
                "/outrig.v1.Space/Mux",
                request_serializer=lambda m: m if isinstance(m, bytes) else m.SerializeToString(),
                response_deserializer=pb.MuxReply.FromString,
            )
        )
        self.call = method(self._requests())
        self._results: list[pb.MuxResult] = []

    def _requests(self) -> Iterator[pb.MuxRequest | bytes]:
        while True:
            with self._cond:
                while not self._outbox:
                    self._cond.wait()
                message = self._outbox.pop(0)
            if message is None:
                return
            yield message

    def send(self, *ops: pb.MuxOp | bytes) -> None:
        with self._cond:
            # MuxOps, or one frame of bytes (which the check on ops[0] does not narrow ops to)
            self._outbox.append(ops[0] if isinstance(ops[0], bytes) else pb.MuxRequest(ops=ops))  # type: ignore[arg-type]
            self._cond.notify()

    def result(self) -> pb.MuxResult:
        while not self._results:
            self._results.extend(next(self.call).results)
        return self._results.pop(0)

    def close(self) -> None:
        with self._cond:
            self._outbox.append(None)
            self._cond.notify()
        self.channel.close()


@pytest.fixture
def stream(server: ServerProcess) -> Iterator[Stream]:
    opened = Stream(server.address)
    yield opened
    opened.close()


def test_the_server_says_its_limit_in_the_initial_metadata(stream: Stream) -> None:
    assert ("outrig-max-stream-ops", "1024") in stream.call.initial_metadata()


def test_a_blocked_take_does_not_hold_up_the_operations_behind_it(stream: Stream, space_name: str) -> None:
    stream.send(pb.MuxOp(id=1, take=_take(space_name, timeout=30.0, n=5)))
    stream.send(pb.MuxOp(id=2, write=_write(space_name, 1)), pb.MuxOp(id=3, count=_count(space_name)))
    first, second = stream.result(), stream.result()
    assert {first.id, second.id} == {2, 3}
    assert next(r for r in (first, second) if r.id == 3).count.count == 1
    stream.send(pb.MuxOp(id=4, write=_write(space_name, 5)))
    results = {stream.result().id: None, stream.result().id: None}
    assert set(results) == {1, 4}


def test_results_carry_the_replies_and_errors_of_the_unary_methods(stream: Stream, space_name: str) -> None:
    stream.send(
        pb.MuxOp(id=10, write=_write(space_name, 1)),
        pb.MuxOp(id=11, take=_take(space_name, timeout=0.0)),
        pb.MuxOp(id=12, count=pb.CountRequest(space=space_name)),  # no template
        pb.MuxOp(id=13),  # no operation
    )
    results = {}
    for _ in range(4):
        result = stream.result()
        results[result.id] = result
    assert results[10].write.lease.id > 0
    assert len(results[11].match.entries) in (0, 1)  # the write may or may not have run first
    assert results[12].error.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert "templates" in results[12].error.message
    assert results[13].error.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert results[13].error.message == "op: is required"


def test_an_unknown_operation_and_a_repeated_id_are_refused(stream: Stream, space_name: str) -> None:
    unknown = b"\x0a\x05\x08\x07\x98\x06\x01"  # MuxRequest{ops: MuxOp{id: 7, field 99: 1}}
    stream.send(unknown)
    result = stream.result()
    assert (result.id, result.error.code) == (7, grpc.StatusCode.UNIMPLEMENTED.value[0])
    blocked, again = (
        pb.MuxOp(id=8, take=_take(space_name, timeout=30.0)),
        pb.MuxOp(id=8, count=_count(space_name)),
    )
    stream.send(blocked, again)
    result = stream.result()
    assert (result.id, result.error.code) == (8, grpc.StatusCode.INVALID_ARGUMENT.value[0])
    assert "already in flight" in result.error.message


def test_a_cancelled_take_ends_cancelled_and_takes_nothing(
    stream: Stream, server: ServerProcess, space_name: str
) -> None:
    stream.send(pb.MuxOp(id=1, take=_take(space_name)))
    wait_for_waiters(server, space_name, 1)
    stream.send(pb.MuxOp(id=1, cancel=True))
    result = stream.result()
    assert (result.id, result.error.code) == (1, grpc.StatusCode.CANCELLED.value[0])
    wait_for_waiters(server, space_name, 0)  # and it left no waiter behind
    stream.send(pb.MuxOp(id=2, write=_write(space_name, 1)))
    assert stream.result().id == 2
    stream.send(pb.MuxOp(id=3, count=_count(space_name)))
    assert stream.result().count.count == 1


def test_a_malformed_message_ends_the_stream_with_invalid_argument(stream: Stream) -> None:
    stream.send(b"\x0a\x05\x08")  # ops: a length running past the end
    with pytest.raises(grpc.RpcError) as raised:
        stream.result()
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "MuxRequest: malformed" in (raised.value.details() or "")


@pytest.fixture
def small_limit(tmp_path: Path) -> Iterator[ServerProcess]:
    config = tmp_path / "outrig.toml"
    config.write_text("[limits]\nmax_stream_ops = 2\n")
    running = start_server("--in-memory", "--config", str(config), metrics=True)
    yield running
    running.stop()


def test_beyond_the_limit_an_op_is_refused_and_the_stream_stops_reading(small_limit: ServerProcess) -> None:
    stream = Stream(small_limit.address)
    try:
        assert ("outrig-max-stream-ops", "2") in stream.call.initial_metadata()
        stream.send(*(pb.MuxOp(id=i, take=_take("s", timeout=30.0, n=i)) for i in (1, 2, 3)))
        result = stream.result()
        assert (result.id, result.error.code) == (3, grpc.StatusCode.RESOURCE_EXHAUSTED.value[0])
        assert "max_stream_ops=2" in result.error.message
        # Two takes are in flight: the next message is not read until one of them ends.
        wait_for_waiters(small_limit, "s", 2)
        stream.send(pb.MuxOp(id=4, count=_count("s")))
        with outrig.connect(small_limit.address, space="s", mux=False) as writer:
            # A deliberate pause, in which the server would read and answer op 4 if it read on:
            # nothing of the server's state shows a message it has not read.
            time.sleep(0.3)
            assert small_limit.metrics is not None
            assert 'outrig_requests_total{code="OK",method="Count"}' not in scrape(small_limit.metrics)
            assert writer.count(Task()) == 0
            writer.write(Task(n=1))
        answered = {stream.result().id, stream.result().id}
        assert answered == {1, 4}
    finally:
        stream.close()


def test_the_sdk_keeps_to_the_servers_limit(small_limit: ServerProcess) -> None:
    with outrig.connect(small_limit.address, space="s") as space, futures.ThreadPoolExecutor(6) as pool:
        takes: list[futures.Future[Any]] = [pool.submit(space.take, Task(n=i), 30.0) for i in range(6)]
        wait_for_waiters(small_limit, "s", 6)  # two on the stream, four unary
        for i in range(6):
            space.write(Task(n=i))  # over the unary path if the stream is full: never refused
        assert sorted(t.result(timeout=30).n for t in takes) == list(range(6))


def test_sync_callers_on_one_connection_are_not_held_up_by_a_blocked_take(server, space_name) -> None:
    with outrig.connect(server.address, space=space_name) as space, futures.ThreadPoolExecutor(1) as pool:
        taken = pool.submit(space.take, Task(n=99), 30.0)
        wait_for_waiters(server, space_name, 1)
        for n in range(20):
            space.write(Task(n=n))
        assert space.count(Task()) == 20
        assert not taken.done()
        space.write(Task(n=99))
        assert taken.result(timeout=10) == Task(n=99)


async def test_an_abandoned_async_take_takes_nothing(server, space_name) -> None:
    async with outrig.aio.connect(server.address, space=space_name) as space:
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(space.take(Task()), 0.3)
        # The cancel op reaches the server (ops of one stream are read in order: a take it had not
        # read yet is cancelled before it runs), and the waiter is gone: nothing left to take.
        await wait_for_waiters_async(server, space_name, 0)
        await space.write(Task(n=1))
        assert await space.count(Task()) == 1


async def test_async_operations_complete_out_of_order(server, space_name) -> None:
    async with outrig.aio.connect(server.address, space=space_name) as space:
        take = asyncio.ensure_future(space.take(Task(n=1), timeout=30.0))
        await wait_for_waiters_async(server, space_name, 1)
        await asyncio.gather(*(space.write(Task(n=n), lease=60.0) for n in range(2, 50)))
        assert not take.done()
        await space.write(Task(n=1))
        assert await take == Task(n=1)
        assert await space.count(Task()) == 48


class _CountOnly(space_pb2_grpc.SpaceServicer):
    def Count(self, request: pb.CountRequest, context: grpc.ServicerContext) -> pb.CountReply:  # noqa: N802
        return pb.CountReply(count=42)


def test_a_server_without_mux_gets_unary_calls() -> None:
    server = grpc.server(futures.ThreadPoolExecutor(2))
    space_pb2_grpc.add_SpaceServicer_to_server(_CountOnly(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with outrig.connect(f"127.0.0.1:{port}", retry_deadline=0) as space:
            assert space.count(Task()) == 42
            assert space.count(Task()) == 42
    finally:
        server.stop(None)


def test_a_stopping_server_ends_its_streams_instead_of_waiting_out_its_grace() -> None:
    running = start_server("--in-memory", "--grace-seconds", "60", metrics=True)
    with outrig.connect(running.address, retry_deadline=0) as space:
        space.write(Task(n=1))
        with futures.ThreadPoolExecutor(1) as pool:
            taken = pool.submit(space.take, Task(n=2), None)
            wait_for_waiters(running, "default", 1)
            started = time.monotonic()
            assert running.stop() == 0
            assert time.monotonic() - started < 30.0  # an open stream would hold it for 60 s
            with pytest.raises(outrig.UnavailableError):
                taken.result(timeout=10)


def test_an_op_cancelled_in_its_own_message_is_answered_cancelled(stream: Stream, space_name: str) -> None:
    stream.send(pb.MuxOp(id=1, take=_take(space_name)), pb.MuxOp(id=1, cancel=True))
    result = stream.result()
    assert (result.id, result.error.code) == (1, grpc.StatusCode.CANCELLED.value[0])


def test_a_repeated_request_id_gets_the_first_reply_on_the_stream(stream: Stream, space_name: str) -> None:
    write = _write(space_name, 1)
    write.request_id = "w-1"
    stream.send(pb.MuxOp(id=1, write=write))
    first = stream.result().write.lease.id
    stream.send(pb.MuxOp(id=2, write=write))
    assert stream.result().write.lease.id == first
    stream.send(pb.MuxOp(id=3, write=_write(space_name, 2)))
    stream.result()
    take = _take(space_name, timeout=0.0)
    take.request_id = "t-1"
    stream.send(pb.MuxOp(id=4, take=take))
    taken = stream.result().match.entries
    stream.send(pb.MuxOp(id=5, take=take))
    assert stream.result().match.entries == taken
    stream.send(pb.MuxOp(id=6, count=_count(space_name)))
    assert stream.result().count.count == 1  # the repeated take took nothing more


@dataclass
class Blob(outrig.Entry, type_name="it.MuxBlob"):
    n: int | None = None
    data: bytes | None = None


_BLOB = b"x" * 700_000  # under the 1 MiB above which a request goes unary; 12 of them are 8 MB


async def test_many_large_ops_go_in_messages_any_server_accepts(tmp_path: Path) -> None:
    running = start_server("--in-memory", "--max-message-bytes", str(4 * 1024 * 1024))
    try:
        async with outrig.aio.connect(running.address, retry_deadline=0) as space:
            await asyncio.gather(*(space.write(Blob(n=n, data=_BLOB)) for n in range(12)))
            assert await space.count(Blob()) == 12
    finally:
        running.stop()


async def test_many_large_results_go_in_messages_any_client_accepts(server, space_name) -> None:
    async with outrig.aio.connect(
        server.address, space=space_name, max_message_bytes=4 * 1024 * 1024
    ) as space:
        for n in range(12):
            await space.write(Blob(n=n, data=_BLOB))
        found = await asyncio.gather(*(space.read(Blob(n=n), timeout=10.0) for n in range(12)))
        assert [blob.n for blob in found] == list(range(12))  # type: ignore[union-attr]


def test_a_large_write_that_is_not_protobuf_is_refused_alone(stream: Stream, space_name: str) -> None:
    inner = b"\x12\xa0\x8d\x06" + b"x" * 70_000  # entry: 100,000 bytes long, past the end
    stream.send(request_message([encode_op(9, OP_FIELDS["Write"], inner)]))
    result = stream.result()
    assert (result.id, result.error.code) == (9, grpc.StatusCode.INVALID_ARGUMENT.value[0])
    assert "cannot decode Write's request" in result.error.message
    stream.send(pb.MuxOp(id=10, count=_count(space_name)))
    assert stream.result().count.count == 0  # the stream goes on
