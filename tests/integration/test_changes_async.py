"""The asyncio twin of the change stream (`outrig.aio.AsyncSpace.changes`) against the session's
real server process: replay then live with no seam, filters, durable subscriptions and their
acks, a compacted cursor (a server of its own with a small retention), and a resume across a
restart of a durable server."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest

import outrig
import outrig.aio
from outrig.service.config import ServerConfig

from ..conftest import ServerProcess
from .entries import Task
from .test_sdk_retry import Outage


async def _head(space: outrig.aio.AsyncSpace) -> str:
    async with space.changes() as stream:
        return stream.cursor


async def test_replay_then_live_without_a_seam(server: ServerProcess, space_name: str) -> None:
    async with outrig.aio.connect(server.address, space=space_name) as space:
        head = await _head(space)
        for n in range(20):
            await space.write(Task(job="x", n=n))
        async with space.changes(Task(job="x"), since=head) as stream:
            got = [(await anext(stream)).entry.n for _ in range(5)]  # type: ignore[union-attr]

            async def more() -> None:
                for n in range(20, 40):
                    await space.write(Task(job="x", n=n))

            writer = asyncio.ensure_future(more())
            got += [(await anext(stream)).entry.n for _ in range(35)]  # type: ignore[union-attr]
            await writer
    assert got == list(range(40))


async def test_filters_durable_acks_and_busy(server: ServerProcess, space_name: str) -> None:
    async with outrig.aio.connect(server.address, space=space_name) as space:
        head = await _head(space)
        leases = [await space.write(Task(job="y", n=n), lease=600) for n in range(6)]
        await leases[4].cancel()
        assert await space.take_nowait(Task(n=outrig.GE(5))) is not None
        async with space.changes(Task(), since=head, kinds=("cancel", "take"), durable="a") as stream:
            first = await anext(stream)
            assert (first.kind, first.entry.n) == ("cancel", 4)  # type: ignore[union-attr]
            await stream.ack()
            with pytest.raises(outrig.SubscriptionBusyError):
                async with space.changes(durable="a"):
                    pass
        async with space.changes(durable="a") as stream:  # starts after the ack: the take is next
            second = await anext(stream)
            assert (second.kind, second.entry.n) == ("take", 5)  # type: ignore[union-attr]
        await space.delete_subscription("a")
        with pytest.raises(outrig.SubscriptionNotFoundError):
            await space.delete_subscription("a")


async def test_a_compacted_cursor_raises_with_the_oldest(
    server_factory: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    config = tmp_path / "outrig.toml"
    config.write_text("[spaces.small]\nchanges_max_count = 3\n")
    small = server_factory("--config", str(config))
    async with outrig.aio.connect(small.address, space="small") as space:
        head = await _head(space)
        for n in range(10):
            await space.write(Task(n=n))
        with pytest.raises(outrig.CompactedError) as raised:
            async with space.changes(since=head):
                pass
        async with space.changes(since=raised.value.oldest) as stream:
            assert [(await anext(stream)).entry.n for _ in range(3)] == [7, 8, 9]  # type: ignore[union-attr]


async def test_a_stream_resumes_across_a_restart(tmp_path: Path) -> None:
    server = Outage(ServerConfig(data_dir=tmp_path))
    try:
        async with outrig.aio.connect(server.address, space="s") as space, space.changes(Task()) as stream:
            await space.write(Task(n=0))
            assert (await anext(stream)).entry.n == 0  # type: ignore[union-attr]
            await asyncio.to_thread(server.back_after, 0.3)
            await asyncio.to_thread(server.wait_until_back)
            await space.write(Task(n=1))
            assert (await anext(stream)).entry.n == 1  # type: ignore[union-attr]
    finally:
        server.close()
