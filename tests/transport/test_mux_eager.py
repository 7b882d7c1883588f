"""Mux operations that cannot wait run without a task of their own on a lone server
(transport/mux.py, `runs_eagerly`), against a real in-process server: the tasks its loop makes are
counted by a task factory. The stream's behaviour is the same either way (tests/integration/
test_mux.py); these pin which operations take the short path and that one that waits after all
(a durable write) still gets its answer."""

from __future__ import annotations

import asyncio
import dataclasses
from collections import Counter
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any

import pytest

import outrig
from outrig.service.config import ServerConfig
from outrig.service.transport import handlers
from outrig.service.transport.mux import OPERATIONS, runs_eagerly, served_operations
from outrig.service.transport.server import OutrigServer
from outrig.service.transport.servicer import SpaceServicer
from outrig.testing import LocalServer
from outrig.v1 import space_pb2 as pb

from ..integration.entries import Task


def _match(timeout: float | None) -> pb.MatchRequest:
    return pb.MatchRequest(space="default", timeout=timeout)


def test_which_operations_run_without_a_task() -> None:
    assert runs_eagerly("Write", object()) and runs_eagerly("CancelLeases", object())
    assert runs_eagerly("Take", _match(0.0)) and runs_eagerly("ReadMany", _match(0.0))
    # A read or take that may park starts eagerly too: its deadline is a timer of the loop's,
    # not asyncio.timeout, so it binds no task, and it gets one only when it parks.
    assert runs_eagerly("Take", _match(5.0)) and runs_eagerly("Take", _match(None))
    assert runs_eagerly("Read", _match(5.0)) and runs_eagerly("TakeMany", _match(None))
    # Anything else that may wait (a transaction's commit, an ack, a move) gets a task.
    assert not runs_eagerly("Commit", object()) and not runs_eagerly("Nack", object())
    # Bytes that are no valid request are refused at once, whichever operation they were for.
    assert runs_eagerly("Commit", handlers.Undecodable("outrig.v1.CommitRequest", "truncated"))


async def _servicer() -> SpaceServicer:
    """The servicer of an in-memory server, as `outrig serve --in-memory` builds it (not started)."""
    return OutrigServer(ServerConfig(in_memory=True, listen="127.0.0.1:0"))._servicer


def test_a_streams_operations_say_once_what_runs_eagerly_says_of_their_decoded_requests() -> None:
    """`Served.eager`, found once per server, is `runs_eagerly` of any decoded request of its
    operation on a lone server, and false on any other (whose operations all get a task)."""
    servicer = asyncio.run(_servicer())
    lone, tier = served_operations(servicer, lone=True), served_operations(servicer, lone=False)
    assert set(lone) == set(tier) == set(OPERATIONS)
    for field, operation in OPERATIONS.items():
        decoded = operation.request()
        assert lone[field].eager is runs_eagerly(operation.name, decoded), operation.name
        assert tier[field].eager is False
        assert lone[field].method is getattr(servicer, operation.name).operation
        assert lone[field][:4] == operation


class _Counted:
    """Counts the tasks the server's loop makes, by the name of the coroutine they run."""

    def __init__(self) -> None:
        self.by_name: Counter[str] = Counter()

    def __call__(
        self, loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, Any], **options: Any
    ) -> asyncio.Task[Any]:
        self.by_name[getattr(coro, "__qualname__", type(coro).__name__)] += 1
        return asyncio.Task(coro, loop=loop, **options)


@pytest.fixture(params=["memory", "durable"])
def counted(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str, _Counted]]:
    config = ServerConfig(in_memory=True)
    if request.param == "durable":
        config = dataclasses.replace(config, in_memory=False, data_dir=tmp_path, durability="always")
    counter = _Counted()
    with LocalServer(config) as server:
        loop = server._loop
        loop.call_soon_threadsafe(lambda: loop.set_task_factory(counter))  # type: ignore[arg-type]
        yield request.param, server.address, counter


@pytest.mark.parametrize("timeout", [0.0, 5.0])  # a take that may park, but matches at once, too
def test_writes_and_takes_that_match_make_no_operation_task(
    counted: tuple[str, str, _Counted], timeout: float
) -> None:
    kind, address, counter = counted
    with outrig.connect(address, space="default") as space:
        space.count(Task())  # the stream is open
        before = counter.by_name.copy()
        for n in range(50):
            space.write(Task(n=n), lease=60)
        taken = [space.take(Task(n=n), timeout=timeout) for n in range(50)]
        made = counter.by_name - before
    assert taken == [Task(n=n) for n in range(50)]
    assert made["MuxStream._answered"] == 0, made
    # In memory nothing waits; a durable write waits for its commit and only then gets a task
    # (the rest of it, `_resume`, in `_resumed`); a take of an entry just committed does too.
    if kind == "memory":
        assert made["MuxStream._resumed"] == 0, made
    else:
        assert 50 <= made["MuxStream._resumed"] <= 100, made


def test_a_take_that_parks_gets_a_task_then(counted: tuple[str, str, _Counted]) -> None:
    _, address, counter = counted
    with outrig.connect(address, space="default") as space:
        space.count(Task())
        before = counter.by_name.copy()
        assert space.take(Task(n=-1), timeout=0.2) is None  # parked, then its timeout ends it
        made = counter.by_name - before
        # The stream goes on after the timeout (a timer of the loop's: no task was cancelled).
        space.write(Task(n=7), lease=60)
        assert space.take(Task(n=7), timeout=5) == Task(n=7)
    assert made["MuxStream._answered"] == 0, made
    assert made["MuxStream._resumed"] == 1, made  # the rest of the take, from where it parked
