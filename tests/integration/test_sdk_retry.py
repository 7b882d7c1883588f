"""The blocking SDK retries through a server that goes away and comes back on the same port.

`Outage` runs a real in-process server on a fixed port; a test stops it and starts a fresh one
after a delay. Timings are asserted with generous bounds: a bound says which behaviour happened
(waited for the server, gave up at the deadline, kept to the timeout), not how fast the machine is.
"""

from __future__ import annotations

import dataclasses
import math
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

import outrig
from outrig._base import channel_options
from outrig._codec import encode_entry_into, encode_template_into
from outrig._retry import Attempts, RetryCounter, RetryPolicy
from outrig.service.config import ServerConfig
from outrig.testing import LocalServer
from outrig.v1 import space_pb2 as pb
from outrig.v1.space_pb2_grpc import SpaceStub

from ..conftest import free_port
from ..polling import once_parked, wait_for_waiters
from .entries import Task


class Outage:
    """A real server on a fixed port, which a test can stop and bring back."""

    def __init__(self, config: ServerConfig | None = None) -> None:
        self.address = f"127.0.0.1:{free_port()}"
        self._config = config or ServerConfig()
        self._server: LocalServer | None = None
        self._comeback: threading.Thread | None = None
        self.back_at = 0.0  # time.monotonic() when the server last started
        self.start()

    def start(self) -> None:
        server = LocalServer(self._config)
        # LocalServer listens on port 0; a comeback must be on the port the clients know.
        server.config = dataclasses.replace(server.config, listen=self.address)
        server.start()
        self._server = server
        self.back_at = time.monotonic()

    @property
    def server(self) -> LocalServer:
        """The server running now (to poll its state: tests/polling.py)."""
        assert self._server is not None, "the server is down"
        return self._server

    def stop(self, grace: float = 0.0) -> None:
        if self._server is not None:
            self._server.stop(grace)
            self._server = None

    def back_after(self, seconds: float) -> None:
        """Stop now, and start again after ``seconds`` (from a thread)."""
        self.stop()

        def comeback() -> None:
            time.sleep(seconds)  # the outage itself: the server is away this long
            self.start()

        self._comeback = threading.Thread(target=comeback, daemon=True)
        self._comeback.start()

    def wait_until_back(self) -> None:
        if self._comeback is not None:
            self._comeback.join(timeout=10)

    def close(self) -> None:
        self.wait_until_back()
        self.stop()


@pytest.fixture
def outage() -> Iterator[Outage]:
    running = Outage()
    yield running
    running.close()


@pytest.mark.parametrize("mux", [True, False], ids=["mux", "unary"])
def test_a_write_while_the_server_is_down_succeeds_once_it_is_back(outage, mux):
    with outrig.connect(outage.address, space="jobs", mux=mux) as space:
        space.write(Task(n=0))  # the channel is connected before the outage
        outage.back_after(0.5)
        started = time.monotonic()
        lease = space.write(Task(n=1), lease=60.0)
        assert time.monotonic() - started > 0.3  # it did wait for the comeback
        assert lease.id > 0
        assert space.read_nowait(Task()) == Task(n=1)  # the new server never saw n=0
        assert space.retries > 0


def test_retries_are_counted_per_connection(outage):
    with outrig.connect(outage.address, space="a") as space:
        other = space.with_space("b")
        other.count(Task())
        outage.back_after(0.3)
        other.write(Task(n=1))
        assert space.retries == other.retries > 0
        # A separate connection has its own count.
        with outrig.connect(outage.address) as fresh:
            assert fresh.retries == 0


def test_retry_deadline_zero_raises_at_once(outage):
    outage.stop()
    with outrig.connect(outage.address, retry_deadline=0) as space:
        started = time.monotonic()
        with pytest.raises(outrig.UnavailableError):
            space.write(Task(n=1))
        assert time.monotonic() - started < 1.0
        assert space.retries == 0


def test_a_deadline_shorter_than_the_outage_raises_after_about_the_deadline(outage):
    outage.stop()
    with outrig.connect(outage.address, retry_deadline=0.5) as space:
        started = time.monotonic()
        with pytest.raises(outrig.UnavailableError):
            space.take(Task(), timeout=10.0)
        elapsed = time.monotonic() - started
        assert 0.4 < elapsed < 3.0
        assert space.retries >= 1


def test_a_take_retried_across_an_outage_keeps_to_its_timeout(outage):
    with outrig.connect(outage.address) as space:
        space.count(Task())
        # Once the take is parked, the outage: the blocked take fails with UNAVAILABLE.
        down = once_parked(outage.server, "default", lambda: outage.back_after(0.5))
        started = time.monotonic()
        assert space.take(Task(), timeout=2.0) is None
        ended = time.monotonic()
        down.result()
        outage.wait_until_back()
        assert ended - started > 1.8  # the retry waited out the rest of the timeout
        # A retry that waited the whole timeout again could not end before back_at + 2 s. (A bound
        # from back_at, not from started, because a loaded machine restarts the server slowly.)
        assert ended < outage.back_at + 2.0
        assert space.retries > 0


@pytest.mark.parametrize("mux", [True, False], ids=["mux", "unary"])
def test_a_blocked_take_survives_a_restart_and_gets_a_later_write(outage, mux):
    with outrig.connect(outage.address, mux=mux) as space:
        space.count(Task())
        result: list[object] = []
        taker = threading.Thread(target=lambda: result.append(space.take(Task(), timeout=None)))
        taker.start()
        wait_for_waiters(outage.server, "default", 1)
        outage.back_after(0.3)
        outage.wait_until_back()
        with outrig.connect(outage.address) as writer:
            writer.write(Task(n=7))
        taker.join(timeout=4)
        assert result == [Task(n=7)]


def test_contents_is_retried_until_its_first_entries(outage):
    with outrig.connect(outage.address) as space:
        outage.back_after(0.3)
        assert list(space.contents(Task())) == []
        assert space.retries > 0


def test_an_in_memory_servers_notify_stream_ends_when_it_stops(outage):
    # An in-memory server ends notify streams with OK: nothing to resume, the iteration ends.
    # (With no grace, the server could cut the stream before that OK reaches the client.)
    with outrig.connect(outage.address, retry_deadline=1.0) as space, space.notify(Task()) as events:
        outage.stop(grace=2.0)
        assert list(events) == []
        assert space.retries == 0


def test_a_notification_resumes_on_a_durable_server_after_a_restart(tmp_path: Path):
    config = ServerConfig(data_dir=tmp_path)
    server = Outage(config)
    try:
        with outrig.connect(server.address) as space, space.notify(Task(), lease=60.0) as events:
            space.write(Task(n=1))
            first = next(events)
            assert first.entry == Task(n=1)
            server.back_after(0.3)
            server.wait_until_back()
            space.write(Task(n=2))
            second = next(events)
            assert second.entry == Task(n=2)
            assert second.sequence >= first.sequence + 2**31  # the jump says events may be lost
            assert space.retries > 0
    finally:
        server.close()


def test_a_resume_of_a_registration_that_ended_raises_not_found(tmp_path: Path):
    server = Outage(ServerConfig(data_dir=tmp_path))
    try:
        with outrig.connect(server.address) as space, space.notify(Task(), lease=60.0) as events:
            server.back_after(0.3)
            server.wait_until_back()
            # The stream is only read, and so only resumed, by the next next(): end the
            # registration before that.
            events.lease.cancel()
            with pytest.raises(outrig.NotFoundError):
                next(events)
    finally:
        server.close()


def test_without_retries_a_broken_notify_stream_raises(tmp_path: Path):
    server = Outage(ServerConfig(data_dir=tmp_path))
    try:
        with outrig.connect(server.address, retry_deadline=0) as space, space.notify(Task()) as events:
            server.stop()
            with pytest.raises(outrig.UnavailableError):
                next(events)
            assert space.retries == 0
    finally:
        server.close()


def test_the_same_request_id_gets_the_first_reply(outage):
    # Talks to the server directly, to send what every retry of one call sends: the same request.
    def write(request_id: str) -> pb.WriteRequest:
        request = pb.WriteRequest(space="ids", request_id=request_id)
        encode_entry_into(request.entry, Task(n=1))
        return request

    tasks = pb.CountRequest(space="ids")
    encode_template_into(tasks.templates.add(), Task())
    take = pb.MatchRequest(space="ids", templates=tasks.templates, timeout=0, request_id="take-1")
    with grpc.insecure_channel(outage.address) as channel:
        stub = SpaceStub(channel)
        first = stub.Write(write("write-1"))
        assert stub.Write(write("write-1")).lease.id == first.lease.id
        assert stub.Count(tasks).count == 1
        stub.Write(write("write-2"))
        assert len(stub.Take(take).entries) == len(stub.Take(take).entries) == 1
        assert stub.Count(tasks).count == 1  # the repeated take did not take the second entry
        with pytest.raises(grpc.RpcError) as refused:
            stub.Write(write("nul\x00id"))
        assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert "request_id: must not contain NUL" in str(refused.value.details())


@pytest.mark.parametrize(
    ("value", "error"),
    [("1", TypeError), (True, TypeError), (None, TypeError), (-1, ValueError), (math.nan, ValueError)],
)
def test_connect_checks_the_retry_deadline(value, error):
    with pytest.raises(error, match="retry_deadline"):
        outrig.connect("127.0.0.1:1", retry_deadline=value)


def test_the_callers_channel_options_win():
    options = dict(channel_options(1024, [("grpc.max_reconnect_backoff_ms", 5000)]))
    assert options["grpc.max_reconnect_backoff_ms"] == 5000
    assert options["grpc.initial_reconnect_backoff_ms"] == 100
    assert options["grpc.max_receive_message_length"] == 1024


def test_a_take_with_a_timeout_pauses_no_longer_than_what_remains_of_it():
    now = [100.0]
    request = pb.MatchRequest(space="s", timeout=2.0)
    attempts = Attempts(request, RetryPolicy(), RetryCounter(), clock=lambda: now[0], jitter=lambda: 1.0)
    assert [attempts.backoff() for _ in range(4)] == [0.05, 0.1, 0.2, 0.4]  # the policy's pauses
    now[0] = 101.9  # the next pause would be 0.8 s, but only 0.1 s of the 2 s timeout is left
    assert attempts.backoff() == pytest.approx(0.1)
    assert attempts.request.timeout == pytest.approx(0.1)
    now[0] = 102.5  # past the timeout: the policy's pause again, and the retry asks for a match now
    assert attempts.backoff() == pytest.approx(1.6)
    assert attempts.request.timeout == 0.0


def test_the_backoff_doubles_with_full_jitter_up_to_its_cap():
    policy = RetryPolicy()
    assert [policy.delay(n, 1.0) for n in range(7)] == [0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 2.0]
    assert policy.delay(10_000, 1.0) == 2.0
    assert policy.delay(3, 0.0) == 0.0
