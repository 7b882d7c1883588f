"""The SDK's direct routing against a real tier: three `outrig serve --backend postgres` processes
on one database. A space connected through a server that does not own it sends its calls to the
owner (it asks Locate at its first call), keeps going when the server it was given goes away, and
after its owner is killed carries on against the new owner with nothing done twice; with
``direct=False`` every call goes to the server given.

The redirect (NOT_OWNER naming the owner, answered by a server that guessed wrong) is hard to
bring about on cue in a real tier, so its test runs two real embedded servers in this process,
the first of which answers every write and take with it.
"""

from __future__ import annotations

import asyncio
import math
import signal
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, cast

import pytest

import outrig
import outrig.aio
from outrig.service.backends.embedded.backend import EmbeddedBackend
from outrig.service.config import ServerConfig
from outrig.service.exceptions import NotOwnerError
from outrig.service.transport.server import OutrigServer

from ..conftest import ServerProcess, start_server
from ..polling import wait_until
from ..postgres_server import PostgresServer

LEASE = "1.5"  # seconds a dead owner keeps its spaces; the default is 3


@dataclass
class Job(outrig.Entry, type_name="pgroute.Job"):
    n: int | None = None


@pytest.fixture
def database(postgres: PostgresServer) -> str:
    return postgres.dsn(postgres.new_database("r"))


@pytest.fixture
def three(database: str) -> Iterator[list[ServerProcess]]:
    servers = [
        start_server("--backend", "postgres", "--dsn", database, "--owner-lease", LEASE) for _ in range(3)
    ]
    yield servers
    for server in servers:
        server.stop()


def _numbers(entries: Iterable[object]) -> list[int]:
    return [cast(Job, entry).n or 0 for entry in entries]


def _owned_by(server: ServerProcess, space: str) -> None:
    """Make `server` the owner of `space`: the first server a space's first call reaches claims it
    when nobody serves it and nobody serves fewer spaces (a fresh tier)."""
    with outrig.connect(server.address, space=space, retry_deadline=0, direct=False) as at_owner:
        at_owner.write(Job(n=-1))
        assert at_owner.locate() == outrig.Location(server.address, True)
        assert at_owner.take_nowait(Job(n=-1)) == Job(n=-1)


@pytest.mark.parametrize("mux", [True, False], ids=["mux", "unary"])
def test_a_space_reached_through_another_server_talks_to_its_owner(
    three: list[ServerProcess], mux: bool
) -> None:
    owner, given, _ = three
    _owned_by(owner, "jobs")
    with outrig.connect(given.address, space="jobs", retry_deadline=0, mux=mux) as space:
        assert space.target == given.address  # nothing asked yet
        space.write(Job(n=1))
        assert space.target == owner.address
        assert space.locate() == outrig.Location(owner.address, False)  # asks the server given
        # The server given goes away; with no retries at all, the calls still succeed: they go
        # to the owner, not through the server given.
        assert given.stop() == 0
        space.write_many([Job(n=2), Job(n=3)])
        assert space.count(Job()) == 3
        assert space.take(Job(n=2), timeout=5) == Job(n=2)
        assert sorted(_numbers(space.contents(Job()))) == [1, 3]
        with space.transaction() as txn:
            assert txn.take(Job(n=3), timeout=0) == Job(n=3)
        with space.notify(Job(), lease=30) as events:
            space.write(Job(n=4))
            assert next(iter(events)).entry == Job(n=4)
        # A space made from it is routed on its own: its first call asks where it lives (the
        # server given is gone: it stays there, and fails, as it would without routing).
        other = space.with_space("elsewhere")
        with pytest.raises(outrig.UnavailableError):
            other.count(Job())
        assert other.target == given.address and space.target == owner.address


def test_direct_false_keeps_talking_to_the_server_given(three: list[ServerProcess]) -> None:
    owner, given, _ = three
    _owned_by(owner, "jobs")
    with outrig.connect(given.address, space="jobs", retry_deadline=0, direct=False) as space:
        space.write(Job(n=1))  # forwarded to the owner
        assert space.count(Job()) == 1
        assert space.target == given.address
        assert space.locate() == outrig.Location(owner.address, False)
        assert given.stop() == 0
        with pytest.raises(outrig.UnavailableError):
            space.count(Job())
        assert space.target == given.address


async def test_an_async_space_talks_to_its_owner(three: list[ServerProcess]) -> None:
    owner, given, _ = three
    await asyncio.to_thread(_owned_by, owner, "jobs")
    async with outrig.aio.connect(given.address, space="jobs", retry_deadline=0) as space:
        await space.write(Job(n=1))
        assert space.target == owner.address
        await asyncio.to_thread(given.stop)
        assert await space.count(Job()) == 1
        async with space.notify(Job(), lease=30) as events:
            await space.write(Job(n=2))
            assert (await anext(aiter(events))).entry == Job(n=2)
        assert await space.take(Job(n=1), timeout=5) == Job(n=1)
    async with outrig.aio.connect(owner.address, space="jobs", retry_deadline=0, direct=False) as check:
        assert await check.count(Job()) == 1  # Job(n=2)


def test_after_its_owner_is_killed_a_space_carries_on_against_the_new_owner(
    three: list[ServerProcess],
) -> None:
    owner, given, third = three
    _owned_by(owner, "jobs")
    with (
        outrig.connect(given.address, space="jobs", retry_deadline=30) as space,
        outrig.connect(given.address, space="jobs", retry_deadline=30) as taker,
    ):
        space.write(Job(n=0))
        assert space.target == owner.address
        with space.notify(Job(n=1000), lease=60) as events:
            taker.count(Job())
            assert taker.target == owner.address
            # A take blocked at the owner when it dies; retried (same request id, what is left
            # of its timeout) at the new owner, it gets the entry written there, once.
            blocked: list[object] = []
            waiting = threading.Thread(target=lambda: blocked.append(taker.take(Job(n=-5), timeout=30)))
            waiting.start()
            written: list[int] = []

            def write_all() -> None:
                for n in range(1, 201):
                    space.write(Job(n=n))
                    written.append(n)

            writer = threading.Thread(target=write_all)
            writer.start()
            wait_until(lambda: len(written) >= 50, what="50 writes before the kill")
            owner.stop(signal.SIGKILL)
            writer.join(60)
            assert written == list(range(1, 201))  # every write answered, through the takeover
            space.write(Job(n=-5))
            waiting.join(60)
            assert blocked == [Job(n=-5)]
            # The registration resumes at the new owner, on the space's new channel.
            space.write(Job(n=1000))
            assert next(iter(events)).entry == Job(n=1000)
        # The calls end up at the new owner, one of the two left.
        now = space.locate()
        new_owner = now.address
        assert new_owner in (given.address, third.address)

        def routed() -> bool:
            space.count(Job())
            return space.target == new_owner

        wait_until(routed, what=lambda: f"calls sent to {new_owner}, not {space.target}")
        # Nothing was done twice: each write stored once, each take answered with its own entry.
        taken: list[int] = []

        def drain(source: outrig.Space) -> None:
            taken.extend(_numbers(iter(lambda: source.take_nowait(Job()), None)))

        takers = [threading.Thread(target=drain, args=(s,)) for s in (space, taker)]
        for thread in takers:
            thread.start()
        for thread in takers:
            thread.join(60)
        assert sorted(taken) == [*range(201), 1000]
        assert space.retries > 0


class Recording(EmbeddedBackend):
    """Records the request id (and a take's timeout) of each write and take it is asked."""

    def __init__(self, config: ServerConfig) -> None:
        super().__init__(config)
        self.seen: list[tuple[str, str, float | None]] = []

    async def write(self, space: str, entries: Any, lease: float | None, **kwargs: Any) -> Any:
        self.seen.append(("write", kwargs.get("request_id", ""), None))
        return await super().write(space, entries, lease, **kwargs)

    async def match(self, space: str, templates: Any, **kwargs: Any) -> Any:
        if kwargs["take"]:
            self.seen.append(("take", kwargs.get("request_id", ""), kwargs["timeout"]))
        return await super().match(space, templates, **kwargs)


class Moved(Recording):
    """A server that serves nothing it is asked to change: NOT_OWNER, naming `owner`."""

    owner = ""

    async def write(self, space: str, entries: Any, lease: float | None, **kwargs: Any) -> Any:
        self.seen.append(("write", kwargs.get("request_id", ""), None))
        raise NotOwnerError(f"space {space!r} is served by {self.owner}", owner=self.owner)

    async def match(self, space: str, templates: Any, **kwargs: Any) -> Any:
        if kwargs["take"]:
            self.seen.append(("take", kwargs.get("request_id", ""), kwargs["timeout"]))
            raise NotOwnerError(f"space {space!r} is served by {self.owner}", owner=self.owner)
        return await super().match(space, templates, **kwargs)


@pytest.fixture
def redirecting() -> Iterator[tuple[OutrigServer, Moved, OutrigServer, Recording]]:
    """Two embedded servers on a loop of their own: the first answers NOT_OWNER naming the second."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    config = ServerConfig(listen="127.0.0.1:0")
    owner_backend, moved_backend = Recording(config), Moved(config)
    started: list[OutrigServer] = []

    def run(coroutine: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, loop).result(30)

    async def start(backend: Recording) -> OutrigServer:
        server = OutrigServer(config, backend=backend)
        await server.start()
        started.append(server)
        return server

    try:
        owner = run(start(owner_backend))
        moved_backend.owner = owner.address
        moved = run(start(moved_backend))
        yield moved, moved_backend, owner, owner_backend
    finally:
        for server in started:
            run(server.stop(0))
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


@pytest.mark.parametrize("mux", [True, False], ids=["mux", "unary"])
def test_not_owner_naming_the_owner_moves_the_calls_there_before_the_retry(
    redirecting: tuple[OutrigServer, Moved, OutrigServer, Recording], mux: bool
) -> None:
    moved, moved_backend, owner, owner_backend = redirecting
    with outrig.connect(moved.address, space=f"w-{mux}", retry_deadline=10, mux=mux) as space:
        space.write(Job(n=1))  # refused by the first server, done by the second
        assert space.target == owner.address
        ((_, first_id, _),) = moved_backend.seen
        assert first_id and owner_backend.seen == [("write", first_id, None)]  # the same request id
        assert space.count(Job()) == 1  # the second server's count: the calls go there now
        # A blocked take, redirected: the same request id, and what remains of its timeout.
        moved_backend.seen.clear()
        owner_backend.seen.clear()
        taking = space.with_space(f"t-{mux}")
        got: list[object] = []
        taker = threading.Thread(target=lambda: got.append(taking.take(Job(n=2), timeout=20)))
        taker.start()
        wait_until(lambda: owner_backend.seen, what="the take retried at the owner")
        with outrig.connect(owner.address, space=f"t-{mux}", retry_deadline=0, direct=False) as at_owner:
            at_owner.write(Job(n=2))
        taker.join(30)
        assert got == [Job(n=2)]
        ((_, take_id, timeout),) = moved_backend.seen
        assert take_id and timeout == 20
        ((kind, retried_id, remaining),) = [seen for seen in owner_backend.seen if seen[0] == "take"]
        assert (kind, retried_id) == ("take", take_id)
        assert remaining is not None and remaining < 20 and not math.isclose(remaining, 0)
        assert taking.target == owner.address and space.retries == 2
    # direct=False sends nothing elsewhere: the refusal reaches the caller.
    with outrig.connect(moved.address, space="d", retry_deadline=0, direct=False) as stays:
        with pytest.raises(outrig.NotOwnerError) as refused:
            stays.write(Job(n=3))
        assert refused.value.owner == owner.address and stays.target == moved.address
