"""The change log through a real server process (the session's, in memory, on port 0): the SDK's
`Space.changes` and the raw protocol, and `outrig changes`.

tests/conformance/test_changes_conformance.py runs the guarantees in every deployment shape;
this module holds what needs the wire itself (the stream's messages, refusals of bad requests),
a long disconnection, and the command.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading

import grpc
import pytest

import outrig
from outrig._codec import encode_entry_into, encode_template_into
from outrig.v1 import space_pb2 as pb
from outrig.v1.space_pb2_grpc import SpaceStub

from ..conftest import ServerProcess
from .entries import Task


def _head(space: outrig.Space) -> str:
    with space.changes() as stream:
        return stream.cursor


def test_a_subscriber_away_during_10000_writes_gets_them_all_in_order_on_resume(
    server: ServerProcess, space_name: str
) -> None:
    with outrig.connect(server.address, space=space_name) as space:
        with space.changes(Task()) as stream:
            space.write(Task(job="before", n=-1))
            assert next(stream).entry == Task(job="before", n=-1)
            cursor = stream.cursor
        for start in range(0, 10_000, 500):  # while nobody listens
            space.write_many([Task(job="burst", n=n) for n in range(start, start + 500)], lease=600)
        with space.changes(Task(), since=cursor) as stream:
            numbers = [next(stream).entry.n for _ in range(10_000)]  # type: ignore[union-attr]
            space.write(Task(job="after", n=10_000))
            assert next(stream).entry == Task(job="after", n=10_000)  # nothing else in between
    assert numbers == list(range(10_000))


def test_the_stream_starts_with_its_cursors_and_says_when_it_read_past_others(
    server: ServerProcess, space_name: str
) -> None:
    with (
        grpc.insecure_channel(server.address) as channel,
        outrig.connect(server.address, space=space_name) as space,
    ):
        stub = SpaceStub(channel)
        request = pb.ChangesRequest(space=space_name, kinds=[pb.CHANGE_KIND_WRITE])
        encode_template_into(request.templates.add(), Task(job="wanted"))
        call = stub.Changes(request)
        try:
            first = next(call)
            assert first.cursor and first.oldest and not first.kind and not first.HasField("entry")
            space.write(Task(job="unwanted", n=1))
            progress = next(call)  # read past it: a cursor, no change
            assert not progress.kind and progress.cursor != first.cursor
            space.write(Task(job="wanted", n=2), lease=30.0)
            change = next(call)
            assert change.kind == pb.CHANGE_KIND_WRITE and change.seq == 2 and change.transaction == 0
            expected = pb.Entry()
            encode_entry_into(expected, Task(job="wanted", n=2))
            assert change.entry == expected and change.at > 0 and change.cursor != progress.cursor
        finally:
            call.cancel()
    # A resume from the progress message's cursor starts after the unwanted write.
    with (
        outrig.connect(server.address, space=space_name) as space,
        space.changes(since=progress.cursor) as stream,
    ):
        assert next(stream).entry == Task(job="wanted", n=2)


def test_a_transactions_commit_logs_its_changes_with_its_id(server: ServerProcess, space_name: str) -> None:
    with outrig.connect(server.address, space=space_name) as space:
        space.write(Task(job="old", n=0))
        with space.changes(Task()) as stream:
            with space.transaction() as txn:
                txn.write(Task(job="new", n=1))
                assert txn.take(Task(job="old"), timeout=0) is not None
            got = [next(stream), next(stream)]
    assert [(c.kind, c.entry.job) for c in got] == [("write", "new"), ("take", "old")]  # type: ignore[union-attr]
    assert got[0].transaction == got[1].transaction == txn.id != 0


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"kinds": [9]}, r"kinds\[0\]: 9 is no ChangeKind"),
        ({"kinds": [pb.CHANGE_KIND_TAKE, 0]}, r"kinds\[1\]: 0"),
        ({"durable": "no spaces allowed"}, "durable: 'no spaces allowed' is no subscription name"),
        ({"durable": "d" * 129}, "at most 128"),
        ({"since": "A" * 50_000}, "since: a cursor of 50000 characters"),
    ],
)
def test_bad_requests_are_invalid_arguments_naming_the_field(
    server: ServerProcess, space_name: str, change: dict[str, object], message: str
) -> None:
    with grpc.insecure_channel(server.address) as channel:
        call = SpaceStub(channel).Changes(pb.ChangesRequest(space=space_name, **change))  # type: ignore[arg-type]
        with pytest.raises(grpc.RpcError) as raised:
            next(call)
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert re.search(message, raised.value.details() or "")


def test_an_ack_needs_a_subscription_and_a_cursor_of_its_space(
    server: ServerProcess, space_name: str
) -> None:
    with outrig.connect(server.address, space=space_name) as space:
        head = _head(space)
        with grpc.insecure_channel(server.address) as channel:
            stub = SpaceStub(channel)
            with pytest.raises(grpc.RpcError) as raised:
                stub.AckChanges(pb.AckChangesRequest(space=space_name, durable="nobody", cursor=head))
            assert raised.value.code() == grpc.StatusCode.NOT_FOUND
            with pytest.raises(grpc.RpcError) as raised:
                stub.AckChanges(pb.AckChangesRequest(space=space_name, durable="", cursor=head))
            assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "durable: is required" in (raised.value.details() or "")
            with pytest.raises(grpc.RpcError) as raised:
                stub.AckChanges(pb.AckChangesRequest(space=space_name + "x", durable="d", cursor=head))
            assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "cursor: a cursor of another space" in (raised.value.details() or "")
        with pytest.raises(outrig.SubscriptionNotFoundError):
            space.delete_subscription("nobody")


def test_sdk_arguments_are_checked_before_anything_is_sent(server: ServerProcess, space_name: str) -> None:
    with outrig.connect(server.address, space=space_name) as space:
        with pytest.raises(ValueError, match="'writes' is no kind of change"):
            space.changes(kinds=["writes"])
        with pytest.raises(TypeError, match="since must be a cursor"):
            space.changes(since=5)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="subscription's name"):
            space.delete_subscription("")


def _command(server: ServerProcess, space_name: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "outrig", "changes", space_name, "--address", server.address, *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_changes_command_prints_a_json_line_per_change_and_the_cursor(
    server: ServerProcess, space_name: str
) -> None:
    with outrig.connect(server.address, space=space_name) as space:
        head = _head(space)
        space.write(Task(job="a", n=1))
        space.write(Task(job="b", n=2))
        assert space.take_nowait(Task(job="a")) is not None
    done = _command(
        server, space_name, "--since", head, "--type", "it.Task", "--where", "job=a", "--max", "2"
    )
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    assert [(d["kind"], d["entry"]["fields"]["n"]) for d in lines] == [("write", 1), ("take", 1)]
    assert lines[0]["entry"]["type"] == "it.Task" and lines[0]["transaction"] == 0
    assert done.stderr.strip().splitlines()[-1] == f"cursor: {lines[1]['cursor']}"
    takes = _command(server, space_name, "--since", head, "--kinds", "take", "--max", "1")
    assert [json.loads(line)["kind"] for line in takes.stdout.splitlines()] == ["take"]
    bad = _command(server, space_name, "--since", "garbage!")
    assert bad.returncode == 2 and "InvalidArgumentError" in bad.stderr and "since" in bad.stderr


def test_the_changes_command_acknowledges_a_durable_subscription(
    server: ServerProcess, space_name: str
) -> None:
    with outrig.connect(server.address, space=space_name) as space:
        head = _head(space)
        for n in range(3):
            space.write(Task(job="d", n=n))
        first = _command(server, space_name, "--since", head, "--durable", "cli", "--ack", "--max", "2")
        assert first.returncode == 0, first.stderr
        again = _command(server, space_name, "--durable", "cli", "--max", "1")
        assert [json.loads(line)["entry"]["fields"]["n"] for line in again.stdout.splitlines()] == [2]
        idle = _command(server, space_name, "--idle", "0.5")  # nothing comes: it stops by itself
        assert idle.returncode == 0 and idle.stdout == "" and idle.stderr.startswith("cursor: ")
        space.delete_subscription("cli")


def test_a_stream_closed_from_another_thread_ends_its_iteration(
    server: ServerProcess, space_name: str
) -> None:
    with outrig.connect(server.address, space=space_name) as space, space.changes() as stream:
        closer = threading.Timer(0.2, stream.close)
        closer.start()
        assert list(stream) == []
        closer.join()


def test_describe_shows_the_change_log_and_its_subscriptions(server: ServerProcess, space_name: str) -> None:
    with outrig.connect(server.address, space=space_name) as space:
        with space.changes(durable="shown") as stream:
            for n in range(3):
                space.write(Task(n=n))
            next(stream)
            stream.ack()
        table = subprocess.run(
            [sys.executable, "-m", "outrig", "describe", space_name, "--address", server.address],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert table.returncode == 0, table.stderr
        assert "change log: 3 changes held" in table.stdout and "shown at 1" in table.stdout
        log = space.describe().change_log
        assert log is not None and (log.head, log.oldest, log.count) == (3, 1, 3)
        assert [(s.name, s.position) for s in log.subscriptions] == [("shown", 1)]
        with space.changes(since=log.subscriptions[0].cursor) as replay:
            assert [next(replay).entry.n for _ in range(2)] == [1, 2]  # type: ignore[union-attr]
        space.delete_subscription("shown")
