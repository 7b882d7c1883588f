"""Placement and forwarding against real servers: Locate and ListSpaces, the `outrig-peer` header,
`outrig spaces`, NOT_OWNER in the SDK, and calls forwarded from one server to another.

Until the PostgreSQL owner backend serves a tier, the forwarding tests run two real embedded
servers in one event loop (a thread of this process), the first of which locates every space
named `remote.*` on the second: its backend is an `EmbeddedBackend` whose `locate` says so, and
both share a peer secret. Everything else (the gRPC calls, the forwarding, the owner's serving) is
the real code. Clients of the first server say `direct=False`, so that their calls are forwarded
rather than sent to the owner by the SDK (tests/postgres/test_sdk_routing.py covers that).
"""

from __future__ import annotations

import asyncio
import dataclasses
import subprocess
import sys
import threading
import time
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar, cast

import grpc
import pytest

import outrig
import outrig.aio
from outrig._exceptions import error_from_code, error_from_rpc, error_from_status
from outrig._protocol import status_details
from outrig.service.backends.embedded.backend import EmbeddedBackend
from outrig.service.config import Limits, ServerConfig
from outrig.service.exceptions import NotOwnerError
from outrig.service.transport.server import OutrigServer
from outrig.testing import LocalServer
from outrig.v1 import space_pb2 as pb
from outrig.v1 import space_pb2_grpc
from tests.polling import wait_until_async
from tests.tcp_proxy import TcpProxy

SECRET = "tier-secret-for-tests"
MOVED = "remote.moved"  # a space the second server says it does not own
ELSEWHERE = "10.0.0.9:7480"

T = TypeVar("T")


@dataclasses.dataclass
class Job(outrig.Entry, type_name="routing.Job"):
    n: int | None = None


@dataclasses.dataclass
class Urgent(Job, type_name="routing.Urgent"):
    pass


class Owner(EmbeddedBackend):
    """The second server's backend: serves what it is forwarded, except MOVED, which it says
    another server owns (as the owner backend does for a space it lost)."""

    @property
    def peer_secret(self) -> str:
        return SECRET

    def accepts_peer(self, secret: str) -> bool:
        return secret == SECRET

    async def count(self, space: str, templates: Any, transaction: int = 0) -> int:
        if space == MOVED:
            raise NotOwnerError(f"space {space!r}: owned by another server", owner=ELSEWHERE)
        return await super().count(space, templates, transaction)


class Router(Owner):
    """The first server's backend: `remote.*` spaces are served at `owner`."""

    owner = ""

    async def locate(self, space: str) -> str | None:
        return self.owner if space.startswith("remote.") else None


async def _started(config: ServerConfig, backend: Owner) -> OutrigServer:
    server = OutrigServer(config, backend=backend)  # grpc.aio: made on the loop that serves it
    await server.start()
    return server


class Tier:
    """Two real servers in one event loop on a thread: `first` forwards `remote.*` to `second`."""

    def __init__(self, second_config: ServerConfig | None = None) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        config = ServerConfig(listen="127.0.0.1:0", reap_interval=0.05)
        self.second_backend = Owner(second_config or config)
        self.second = self.run(_started(second_config or config, self.second_backend))
        self.first_backend = Router(config)
        self.first_backend.owner = self.second.address
        self.first = self.run(_started(config, self.first_backend))

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(30)

    def waiters(self, server: OutrigServer, space: str) -> int:
        figures = self.run(server.backend.space_figures())
        return figures[space].waiters if space in figures else 0

    def wait_for_waiters(self, server: OutrigServer, space: str, count: int) -> None:
        deadline = time.monotonic() + 10
        while self.waiters(server, space) != count:
            assert time.monotonic() < deadline, f"{space}: {self.waiters(server, space)} waiters, not {count}"
            time.sleep(0.01)

    def owner_streams(self) -> tuple[int, int]:
        """The second server's Mux streams open and their operations in flight (what its metrics
        report as outrig_mux_streams, outrig_mux_in_flight)."""
        return self.second._mux.figures()

    def close(self) -> None:
        for server in (self.first, self.second):
            self.run(server.stop(0))
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@pytest.fixture(scope="module")
def tier() -> Iterator[Tier]:
    tier = Tier()
    try:
        yield tier
    finally:
        tier.close()


def _spaces_of(tier: Tier, server: OutrigServer) -> set[str]:
    return {placement.space for placement in tier.run(server.backend.placements())}


# ---------------------------------------------------------------- one server


def test_locate_and_list_spaces_on_an_embedded_server() -> None:
    with LocalServer() as server:
        for mux in (True, False):
            with outrig.connect(server.address, space="placed", mux=mux, retry_deadline=0) as space:
                space.write(Job(n=1))
                assert space.locate() == outrig.Location(server.address, True)
                assert space.with_space("other").locate() == outrig.Location(server.address, True)
                placements = space.list_spaces()
            written = 1 if mux else 2  # an entry per round, as the server counts them
            assert placements == [
                outrig.Placement("placed", "", server.address, 0, None, True, written, 22 * written)
            ]


async def test_locate_and_list_spaces_async() -> None:
    with LocalServer() as server:
        async with outrig.aio.connect(server.address, space="a", retry_deadline=0) as space:
            await space.write(Job(n=1))
            await space.with_space("b").write(Job(n=2))
            assert await space.locate() == outrig.Location(server.address, True)
            assert [p.space for p in await space.list_spaces()] == ["a", "b"]


def test_a_forged_peer_header_is_refused_unauthenticated() -> None:
    with LocalServer() as server, grpc.insecure_channel(server.address) as channel:
        stub = space_pb2_grpc.SpaceStub(channel)
        forged = (("outrig-peer", "guessed"),)
        with pytest.raises(grpc.RpcError) as raised:
            stub.Count(pb.CountRequest(space="s"), metadata=forged)
        assert raised.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert "outrig-peer" in (raised.value.details() or "")
        assert isinstance(error_from_rpc(raised.value), outrig.UnauthenticatedError)
        with pytest.raises(grpc.RpcError) as streamed:
            list(stub.Contents(pb.ContentsRequest(space="s"), metadata=forged))
        assert streamed.value.code() == grpc.StatusCode.UNAUTHENTICATED
        # Without the header the same call is served.
        job = pb.Template(type_name="routing.Job")
        assert stub.Count(pb.CountRequest(space="s", templates=[job])).count == 0


def test_list_spaces_needs_admin_on_every_space(tmp_path: Path) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text(
        '[[grant]]\nprincipals = ["*"]\nresources = ["outrig://jobs/*"]\n'
        'actions = ["read", "write", "admin"]\n'
    )
    with LocalServer(ServerConfig(policy=policy)) as server:
        with outrig.connect(server.address, space="jobs", retry_deadline=0) as space:
            assert space.locate().here  # read on outrig://jobs (covered by outrig://jobs/*)
            with pytest.raises(outrig.PermissionDeniedError, match=r"admin outrig://\*"):
                space.list_spaces()
            with pytest.raises(outrig.PermissionDeniedError, match="read outrig://elsewhere"):
                space.with_space("elsewhere").locate()
        policy.write_text('[[grant]]\nprincipals = ["*"]\nresources = ["outrig://*"]\nactions = ["admin"]\n')
        server_reload(server)
        with outrig.connect(server.address, space="jobs", retry_deadline=0) as space:
            assert space.list_spaces() == []


def server_reload(server: LocalServer) -> None:
    assert server._server is not None
    assert asyncio.run_coroutine_threadsafe(server._server.reload_policy(), server._loop).result(10)


def test_outrig_spaces_prints_the_placements() -> None:
    with LocalServer() as server:
        with outrig.connect(server.address, space="jobs", retry_deadline=0) as space:
            space.write(Job(n=1))
            space.with_space("alpha").write(Job(n=2))
        done = subprocess.run(
            [sys.executable, "-m", "outrig.service", "spaces", "--address", server.address],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert done.returncode == 0, done.stderr
    header, *rows = done.stdout.splitlines()
    assert header.split() == [
        "space",
        "owner",
        "address",
        "epoch",
        "lease",
        "left",
        "here",
        "entries",
        "bytes",
    ]
    assert [row.split() for row in rows] == [
        ["alpha", "-", server.address, "0", "-", "yes", "1", "22"],
        ["jobs", "-", server.address, "0", "-", "yes", "1", "22"],
    ]


def test_outrig_spaces_says_when_it_cannot_reach_the_server() -> None:
    with LocalServer() as server:
        address = server.address
    done = subprocess.run(
        [sys.executable, "-m", "outrig.service", "spaces", "--address", address, "--retry-deadline", "0"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert done.stderr.startswith("outrig spaces: UnavailableError")


def test_the_spaces_table_shows_owners_and_leases() -> None:
    from outrig.service.cli.admin import spaces_table

    lines = spaces_table(
        [
            outrig.Placement("jobs", "server-a", "10.0.0.1:7480", 3, 2.5, True, 12345, 1048576),
            outrig.Placement("idle", "", "", 0, None, False),
        ]
    )
    assert [line.split() for line in lines[1:]] == [
        ["jobs", "server-a", "10.0.0.1:7480", "3", "2.5s", "yes", "12,345", "1,048,576"],
        ["idle", "-", "-", "0", "-", "no", "-", "-"],
    ]


def test_not_owner_maps_to_its_sdk_class_with_the_owner() -> None:
    err = error_from_status(grpc.StatusCode.UNAVAILABLE, "moved", pb.NOT_OWNER, {"owner": "h:1"})
    assert type(err) is outrig.NotOwnerError
    assert isinstance(err, outrig.StoreUnavailableError) and isinstance(err, outrig.UnavailableError)
    assert (err.owner, err.reason, err.code) == ("h:1", "NOT_OWNER", grpc.StatusCode.UNAVAILABLE)
    assert error_from_code(14, "moved", pb.NOT_OWNER).owner == ""  # type: ignore[attr-defined]
    # A reason that does not belong to its status picks no class.
    assert type(error_from_status(grpc.StatusCode.NOT_FOUND, "x", pb.NOT_OWNER)) is outrig.NotFoundError
    # The trailer the server writes carries the owner in the ErrorInfo's metadata.
    details = status_details(14, "moved", pb.NOT_OWNER, {"owner": "h:1"})
    from outrig._protocol import error_info

    assert error_info([("grpc-status-details-bin", details)]) == (pb.NOT_OWNER, {"owner": "h:1"})


# ---------------------------------------------------------------- two servers: forwarding


@pytest.mark.parametrize("mux", [True, False], ids=["mux", "unary"])
def test_calls_through_the_first_server_land_on_the_second(tier: Tier, mux: bool) -> None:
    name = f"remote.jobs-{mux}"
    first, second = tier.first.address, tier.second.address
    with (
        outrig.connect(first, space=name, mux=mux, retry_deadline=0, direct=False) as via_first,
        outrig.connect(second, space=name, retry_deadline=0) as at_owner,
    ):
        lease = via_first.write(Job(n=1), lease=60)
        via_first.write_many([Job(n=2), Urgent(n=3)])
        assert name in _spaces_of(tier, tier.second) and name not in _spaces_of(tier, tier.first)
        assert at_owner.count(Job()) == 3
        assert via_first.count(Job()) == 3
        assert via_first.read(Job(n=2), timeout=0) == Job(n=2)
        assert sorted(cast(Job, e).n or 0 for e in via_first.contents(Job())) == [1, 2, 3]
        assert via_first.take(Urgent(), timeout=0) == Urgent(n=3)
        assert at_owner.read_nowait(Urgent()) is None
        lease.renew(120)
        assert lease.duration == 120
        lease.cancel()
        assert at_owner.count(Job()) == 1
        with via_first.transaction() as txn:
            txn.write(Job(n=9))
            assert at_owner.read_nowait(Job(n=9)) is None
        assert at_owner.read_nowait(Job(n=9)) == Job(n=9)
        # A take through the first server waits on the second, and a write there wakes it.
        taker = threading.Thread(target=lambda: results.append(via_first.take(Job(n=7), timeout=30)))
        results: list[Any] = []
        taker.start()
        tier.wait_for_waiters(tier.second, name, 1)
        at_owner.write(Job(n=7))
        taker.join(30)
        assert results == [Job(n=7)]
        # Locate through the first names the second; ListSpaces on the first knows only its own.
        assert via_first.locate() == outrig.Location(second, False)
        assert at_owner.locate() == outrig.Location(second, True)


def test_notify_through_the_first_server_hears_writes_on_the_second(tier: Tier) -> None:
    name = "remote.events"
    with (
        outrig.connect(tier.first.address, space=name, retry_deadline=0, direct=False) as via_first,
        outrig.connect(tier.second.address, space=name, retry_deadline=0) as at_owner,
        via_first.notify(Job(), lease=30) as events,
    ):
        assert tier.run(tier.second.backend.space_figures())[name].registrations == 1
        at_owner.write(Job(n=1))
        via_first.write(Job(n=2))
        received = iter(events)
        assert [next(received).entry for _ in range(2)] == [Job(n=1), Job(n=2)]
        events.lease.cancel()
        assert list(received) == []  # the stream ends with the registration


@pytest.mark.parametrize("mux", [True, False], ids=["mux", "unary"])
def test_a_forwarded_call_fails_with_the_owners_status_and_reason(tier: Tier, mux: bool) -> None:
    name = f"remote.errors-{mux}"
    with outrig.connect(tier.first.address, space=name, mux=mux, retry_deadline=0, direct=False) as via_first:
        via_first.write(Urgent(n=1))
        with pytest.raises(outrig.TypeConflictError) as conflict:  # routing.Urgent without its supertype
            via_first.write(outrig.GenericEntry("routing.Urgent", (), {}))
        assert conflict.value.reason == "TYPE_CONFLICT" and "routing.Urgent" in conflict.value.details
        with pytest.raises(outrig.InvalidArgumentError, match="timeout"):
            via_first.read(Job(), timeout=-1)
        transaction = via_first.transaction()
        transaction.abort()
        with pytest.raises(outrig.TransactionAbortedError):
            transaction.commit()
        # NOT_OWNER from the owner keeps its owner, through unary calls and Mux results alike.
        with pytest.raises(outrig.NotOwnerError) as moved:
            via_first.with_space(MOVED).count(Job())
        assert moved.value.owner == ELSEWHERE and moved.value.code == grpc.StatusCode.UNAVAILABLE
        # The second server, called as a peer, serves a space it does not own never forwards.
        with grpc.insecure_channel(tier.second.address) as channel:
            stub = space_pb2_grpc.SpaceStub(channel)
            job = pb.Template(type_name="routing.Job")
            with pytest.raises(grpc.RpcError) as raw:
                stub.Count(pb.CountRequest(space=MOVED, templates=[job]), metadata=(("outrig-peer", SECRET),))
            err = error_from_rpc(raw.value)
            assert type(err) is outrig.NotOwnerError and err.owner == ELSEWHERE


def test_an_unreachable_owner_is_unavailable(tier: Tier) -> None:
    with LocalServer() as gone:
        address = gone.address
    backend = tier.first_backend
    try:
        backend.owner = address
        with (
            outrig.connect(
                tier.first.address, space="remote.nowhere", retry_deadline=0, direct=False
            ) as space,
            pytest.raises(outrig.UnavailableError),
        ):
            space.count(Job())
    finally:
        backend.owner = tier.second.address


@pytest.mark.parametrize("mux", [True, False], ids=["mux", "unary"])
async def test_cancelling_a_call_cancels_the_forwarded_one(tier: Tier, mux: bool) -> None:
    name = f"remote.cancel-{mux}"
    async with outrig.aio.connect(
        tier.first.address, space=name, mux=mux, retry_deadline=0, direct=False
    ) as space:
        take = asyncio.ensure_future(space.take(Job(), timeout=60))
        await asyncio.to_thread(tier.wait_for_waiters, tier.second, name, 1)
        take.cancel()
        with pytest.raises(asyncio.CancelledError):
            await take
        await asyncio.to_thread(tier.wait_for_waiters, tier.second, name, 0)
    # A notify stream the caller cancels cancels the forwarded stream, whose registration ends.
    async with grpc.aio.insecure_channel(tier.first.address) as channel:
        stub = space_pb2_grpc.SpaceStub(channel)
        request = pb.NotifyRequest(space=name, templates=[pb.Template(type_name="routing.Job")])
        call = stub.Notify(request)
        first = await call.read()
        assert isinstance(first, pb.NotifyReply) and first.HasField("registration")
        await asyncio.to_thread(_wait_registrations, tier, name, 1)
        call.cancel()
        await asyncio.to_thread(_wait_registrations, tier, name, 0)


def _wait_registrations(tier: Tier, name: str, count: int) -> None:
    deadline = time.monotonic() + 10
    while tier.run(tier.second.backend.space_figures())[name].registrations != count:
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_a_forwarded_call_skips_the_owners_guard(tmp_path: Path) -> None:
    """The owner grants nothing, so a caller of its own is denied; the same call forwarded by a
    peer (which checked it) is served."""
    policy = tmp_path / "policy.toml"
    policy.write_text('[[grant]]\nprincipals = ["nobody"]\nresources = ["outrig://*"]\nactions = ["read"]\n')
    tier = Tier(ServerConfig(listen="127.0.0.1:0", reap_interval=0.05, policy=policy))
    try:
        with (
            outrig.connect(tier.second.address, space="remote.guarded", retry_deadline=0) as at_owner,
            pytest.raises(outrig.PermissionDeniedError),
        ):
            at_owner.count(Job())
        with outrig.connect(
            tier.first.address, space="remote.guarded", retry_deadline=0, direct=False
        ) as via_first:
            via_first.write(Job(n=1))
            assert via_first.count(Job()) == 1
    finally:
        tier.close()


# ---------------------------------------------------------------- two servers: the peer stream


async def _parked_takes(tier: Tier, space: outrig.aio.AsyncSpace, name: str, count: int) -> list[Any]:
    takes = [asyncio.ensure_future(space.take(Job(), timeout=30)) for _ in range(count)]
    await asyncio.to_thread(tier.wait_for_waiters, tier.second, name, count)
    return takes


async def _owner_streams_settle(tier: Tier) -> None:
    """The owner has one Mux stream and no operation in flight on it. Polled: an operation's
    answer reaches the caller before the owner's writer counts it sent (`MuxStream._write`
    lowers its count once gRPC's write returns), so a caller may ask first."""
    await wait_until_async(
        lambda: tier.owner_streams() == (1, 0), what=lambda: f"owner streams {tier.owner_streams()}"
    )


async def test_forwarded_operations_travel_on_one_peer_stream(tier: Tier) -> None:
    """Unary calls and Mux operations through the first server alike reach the second as
    operations of one Mux stream (the first's peer stream), every kind of operation on it."""
    name = "remote.shared"
    first = tier.first.address
    async with (
        outrig.aio.connect(first, space=name, mux=False, retry_deadline=0, direct=False) as unary,
        outrig.aio.connect(first, space=name, mux=True, retry_deadline=0, direct=False) as muxed,
    ):
        takes = await _parked_takes(tier, unary, name, 3)
        takes.append(asyncio.ensure_future(muxed.take(Job(), timeout=30)))
        await asyncio.to_thread(tier.wait_for_waiters, tier.second, name, 4)
        (stream,) = tier.first.peers.streams()
        assert stream.in_flight == 4
        # At the second: one stream (the peer's), the four takes in flight on it.
        assert tier.owner_streams() == (1, 4)
        await unary.write_many([Job(n=n) for n in range(4)])
        assert sorted(cast(Job, e).n or 0 for e in await asyncio.gather(*takes)) == [0, 1, 2, 3]
        # Every other kind of operation goes the same way.
        lease = await unary.write(Job(n=5), lease=60)
        await lease.renew(120)
        assert await unary.count(Job()) == 1 and await muxed.read(Job(), timeout=0) == Job(n=5)
        assert await unary.read_many(Job(), max_entries=5) == [Job(n=5)]
        async with unary.transaction() as txn:
            assert await txn.take_many(Job(), max_entries=5) == [Job(n=5)]
        await (await unary.write(Job(n=6), lease=60)).cancel()
        assert await unary.take_many(Job(), max_entries=5, timeout=0) == []
        assert tier.first.peers.streams() == [stream] and stream.in_flight == 0
        await _owner_streams_settle(tier)


async def test_beyond_the_owners_stream_limit_operations_go_unary() -> None:
    limits = Limits(max_stream_ops=2)
    tier = Tier(ServerConfig(listen="127.0.0.1:0", reap_interval=0.05, limits=limits))
    name = "remote.limited"
    try:
        async with outrig.aio.connect(
            tier.first.address, space=name, mux=False, retry_deadline=0, direct=False
        ) as space:
            takes = await _parked_takes(tier, space, name, 3)  # the third as a unary call
            assert tier.owner_streams() == (1, 2)
            await space.write_many([Job(n=n) for n in range(3)])
            assert sorted(cast(Job, e).n or 0 for e in await asyncio.gather(*takes)) == [0, 1, 2]
            assert await space.count(Job()) == 0
    finally:
        await asyncio.to_thread(tier.close)


async def test_a_broken_peer_stream_fails_its_operations_unavailable_and_is_reopened() -> None:
    """A cut between the servers fails the operations in flight on the peer stream UNAVAILABLE
    (the SDK retries those); the next operation opens a new stream. An owner that stops fails
    them alike, and a new owner at its address is reached by a new stream."""
    tier = Tier()
    name = "remote.broken"
    proxy = TcpProxy("127.0.0.1", int(tier.second.address.rsplit(":", 1)[1])).start()
    try:
        tier.first_backend.owner = proxy.address
        async with outrig.aio.connect(
            tier.first.address, space=name, mux=False, retry_deadline=0, direct=False
        ) as space:
            assert await space.count(Job()) == 0
            (before,) = tier.first.peers.streams()
            takes = await _parked_takes(tier, space, name, 2)
            takes[0].cancel()  # ... but not the second: it blocks on the second server
            await asyncio.to_thread(tier.wait_for_waiters, tier.second, name, 1)
            await asyncio.to_thread(proxy.cut, "reset")
            with pytest.raises(outrig.UnavailableError, match="peer stream"):
                await takes[1]
            await asyncio.to_thread(proxy.restore)
            assert await space.count(Job()) == 0
            (after,) = tier.first.peers.streams()
            assert after is not before and before.ended

            # The owner stops with a take in flight: UNAVAILABLE; a new owner at its address serves.
            (take,) = await _parked_takes(tier, space, name, 1)
            await asyncio.to_thread(tier.run, tier.second.stop(0))
            with pytest.raises(outrig.UnavailableError):
                await take
            with pytest.raises(outrig.UnavailableError):
                await space.count(Job())
            config = ServerConfig(listen=tier.second.address, reap_interval=0.05)
            tier.second_backend = Owner(config)
            tier.second = await asyncio.to_thread(tier.run, _started(config, tier.second_backend))
        # The SDK retries UNAVAILABLE (the first server's channel to its peer reconnects meanwhile).
        async with outrig.aio.connect(
            tier.first.address, space=name, mux=False, direct=False, retry_deadline=10
        ) as space:
            await space.write(Job(n=2))
            assert await space.count(Job()) == 1  # a new owner: the old one's entries are gone
            await _owner_streams_settle(tier)
    finally:
        proxy.close()
        await asyncio.to_thread(tier.close)


@dataclasses.dataclass
class Blob(outrig.Entry, type_name="routing.Blob"):
    data: bytes | None = None


def test_a_forwarded_call_keeps_its_deadline_and_a_large_one_goes_unary(tier: Tier) -> None:
    name = "remote.deadline"
    with grpc.insecure_channel(tier.first.address) as channel:
        stub = space_pb2_grpc.SpaceStub(channel)
        request = pb.MatchRequest(space=name, templates=[pb.Template(type_name="routing.Job")], timeout=30)
        started = time.monotonic()
        with pytest.raises(grpc.RpcError) as expired:
            stub.Take(request, timeout=0.5)
        assert expired.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED and time.monotonic() - started < 5
    tier.wait_for_waiters(tier.second, name, 0)  # the take forwarded was cancelled at the owner
    # A request over the Mux stream's limit of 1 MiB is forwarded as a unary call of its own.
    big = Blob(data=bytes(range(256)) * 8192)  # 2 MiB
    with outrig.connect(tier.first.address, space=name, retry_deadline=0, direct=False) as via_first:
        via_first.write(big)
        assert via_first.take(Blob(), timeout=0) == big
