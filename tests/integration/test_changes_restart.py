"""Change streams across a server restart (a real in-process server on a fixed port that a test
stops and starts again, `Outage`): the SDK resumes from its last cursor by itself on a durable
server, a durable subscription starts where it was acknowledged, and a memory-only server's new
log answers an old cursor with CompactedError. The SIGKILL test is test_changes_kill.py."""

from __future__ import annotations

from pathlib import Path

import pytest

import outrig
from outrig.service.config import ServerConfig

from .entries import Task
from .test_sdk_retry import Outage


def test_a_stream_resumes_by_itself_across_a_restart_of_a_durable_server(tmp_path: Path) -> None:
    server = Outage(ServerConfig(data_dir=tmp_path))
    try:
        with outrig.connect(server.address, space="s") as space, space.changes(Task()) as stream:
            for n in range(5):
                space.write(Task(n=n))
            got = [next(stream).entry.n for _ in range(2)]  # type: ignore[union-attr]
            server.back_after(0.3)
            server.wait_until_back()
            for n in range(5, 8):
                space.write(Task(n=n))
            got += [next(stream).entry.n for _ in range(6)]  # type: ignore[union-attr]
            assert space.retries > 0
        assert got == list(range(8))  # none lost, none twice, across the restart
    finally:
        server.close()


def test_a_durable_subscription_resumes_from_its_ack_after_a_restart(tmp_path: Path) -> None:
    server = Outage(ServerConfig(data_dir=tmp_path))
    try:
        with (
            outrig.connect(server.address, space="s") as space,
            space.changes(Task(), durable="worker") as stream,
        ):
            for n in range(6):
                space.write(Task(n=n))
            seen = [next(stream) for _ in range(4)]
            stream.ack(seen[2].cursor)  # 0, 1, 2 handled; 3 seen, not acknowledged
        server.stop()
        server.start()
        with outrig.connect(server.address, space="s") as space:
            with space.changes(Task(), durable="worker") as stream:
                assert [next(stream).entry.n for _ in range(3)] == [3, 4, 5]  # type: ignore[union-attr]
            described = space.describe().change_log
            assert described is not None and [s.name for s in described.subscriptions] == ["worker"]
            space.delete_subscription("worker")
        server.stop()
        server.start()
        with (
            outrig.connect(server.address, space="s") as space,
            pytest.raises(outrig.SubscriptionNotFoundError),
        ):
            space.delete_subscription("worker")  # its deletion was recorded too
    finally:
        server.close()


def test_an_old_cursor_of_a_memory_server_that_restarted_is_compacted() -> None:
    server = Outage()
    try:
        with outrig.connect(server.address, space="s") as space:
            with space.changes(Task()) as stream:
                space.write(Task(n=1))
                cursor = next(stream).cursor
            server.stop()
            server.start()
            with pytest.raises(outrig.CompactedError) as raised, space.changes(since=cursor):
                pass
            assert raised.value.oldest  # the new log's: resume from there, knowing what was lost
            with space.changes(since=raised.value.oldest) as stream:
                space.write(Task(n=2))
                assert next(stream).entry.n == 2  # type: ignore[union-attr]
    finally:
        server.close()


def test_without_retries_a_broken_change_stream_raises(tmp_path: Path) -> None:
    server = Outage(ServerConfig(data_dir=tmp_path))
    try:
        with outrig.connect(server.address, space="s", retry_deadline=0) as space, space.changes() as stream:
            server.stop()
            with pytest.raises(outrig.UnavailableError):
                next(stream)
    finally:
        server.close()
