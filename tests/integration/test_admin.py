"""`outrig stats` and `outrig dump` against a real server."""

from __future__ import annotations

import array
import base64
import json
import socket
import subprocess
import sys
from dataclasses import dataclass

import outrig

from ..conftest import start_server


@dataclass
class Item(outrig.Entry, type_name="admin.Item"):
    n: int | None = None
    blob: bytes | None = None
    values: array.array[int] | None = None


@dataclass
class Special(Item, type_name="admin.Special"):
    note: str | None = None


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _outrig(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "outrig.service", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_stats_and_dump() -> None:
    metrics = f"127.0.0.1:{_free_port()}"
    server = start_server("--metrics-listen", metrics)
    try:
        with outrig.connect(server.address, space="admin", retry_deadline=0) as space:
            space.write(Item(n=1, blob=b"\x00\x01", values=array.array("i", [1, 2, 3])))
            space.write(Special(n=2, note="hi"))
            space.write(Item(n=3), lease=600)
            space.take(Item(n=3), timeout=0)
        stats = _outrig("stats", metrics)
        dump = _outrig("dump", server.address, "--space", "admin", "--type", "admin.Item")
        special = _outrig("dump", server.address, "--space", "admin", "--type", "admin.Special")
    finally:
        server.stop()
    assert stats.returncode == 0, stats.stderr
    (row,) = [line for line in stats.stdout.splitlines() if line.startswith("admin ")]
    assert row.split()[1] == "2"  # two entries left
    assert any(line.split()[:3] == ["Write", "OK", "3"] for line in stats.stdout.splitlines())
    assert dump.returncode == 0, dump.stderr
    documents = [json.loads(line) for line in dump.stdout.splitlines()]
    assert [d["type"] for d in documents] == ["admin.Item", "admin.Special"]  # subtypes too
    first = documents[0]["fields"]
    assert first["n"] == 1 and base64.b64decode(first["blob"]["bytes"]) == b"\x00\x01"
    assert array.array(first["values"]["array"], base64.b64decode(first["values"]["data"])).tolist() == [
        1,
        2,
        3,
    ]
    assert documents[1]["supertypes"] == ["admin.Item"] and documents[1]["fields"]["note"] == "hi"
    assert [json.loads(line)["type"] for line in special.stdout.splitlines()] == ["admin.Special"]


def test_stats_and_dump_say_when_they_cannot_reach_the_server() -> None:
    port = _free_port()
    stats = _outrig("stats", f"127.0.0.1:{port}")
    assert stats.returncode == 2 and "cannot read" in stats.stderr
    dump = _outrig("dump", f"127.0.0.1:{port}", "--type", "x.Y", "--retry-deadline", "0")
    assert dump.returncode == 2 and "UnavailableError" in dump.stderr


def test_the_retry_deadline_must_be_a_number_of_seconds() -> None:
    for value, says in (("-1", "must be >= 0 seconds, got -1"), ("soon", "not a number of seconds: 'soon'")):
        dump = _outrig("dump", "127.0.0.1:1", "--type", "x.Y", f"--retry-deadline={value}")
        assert dump.returncode == 2 and f"argument --retry-deadline: {says}" in dump.stderr


def test_dump_where_and_order_by() -> None:
    server = start_server()
    try:
        with outrig.connect(server.address, space="admin-where", retry_deadline=0) as space:
            for n in (5, 1, 9, 3, 7):
                space.write(Item(n=n, blob=f"b{n}".encode()))
            space.write(Special(n=6, note="eu-x"))
            space.write(Special(n=8, note="us-x"))

        def dump(*options: str) -> list[int]:
            done = _outrig("dump", server.address, "--space", "admin-where", "--type", "admin.Item", *options)
            assert done.returncode == 0, done.stderr
            return [json.loads(line)["fields"]["n"] for line in done.stdout.splitlines()]

        assert dump("--where", "n>=5", "--order-by=-n") == [9, 8, 7, 6, 5]
        assert dump("--where", "n>1", "--where", "n<=6", "--order-by", "n") == [3, 5, 6]
        assert dump("--where", "note^=eu-") == [6]
        assert dump("--where", "note!=null") == [6, 8]
        assert dump("--where", "n@=[1, 3, 42]", "--order-by=-n") == [3, 1]
        assert dump("--where", "note=us-x") == [8]
        bad = _outrig("dump", server.address, "--type", "admin.Item", "--where", "n>=5.5")
        mixed = _outrig("dump", server.address, "--type", "admin.Item", "--where", "nothing")
    finally:
        server.stop()
    assert bad.returncode == 0 and bad.stdout == ""  # a float range: ints are another kind
    assert mixed.returncode == 2 and "expected FIELD OP VALUE" in mixed.stderr


def test_dump_pending_lists_deliveries_in_flight_and_delayed_entries() -> None:
    server = start_server()
    try:
        with outrig.connect(server.address, space="admin-pending", retry_deadline=0) as space:
            space.write_many([Item(n=1), Item(n=2)])
            space.write(Item(n=3), delay=3600.0)
            held = space.take(Item(n=1), timeout=0, ack=600.0)
            assert held is not None
            plain = _outrig("dump", server.address, "--space", "admin-pending", "--type", "admin.Item")
            pending = _outrig(
                "dump", server.address, "--space", "admin-pending", "--type", "admin.Item", "--pending"
            )
            held.ack()
    finally:
        server.stop()
    assert plain.returncode == 0, plain.stderr
    assert [json.loads(line)["fields"]["n"] for line in plain.stdout.splitlines()] == [2]
    assert pending.returncode == 0, pending.stderr
    lines = [json.loads(line) for line in pending.stdout.splitlines()]
    assert [line["fields"]["n"] for line in lines] == [2, 1, 3]
    in_flight, delayed = lines[1], lines[2]
    assert in_flight["delivery"]["receipt"] == held.receipt
    assert in_flight["delivery"]["deadline"] == held.deadline
    assert in_flight["deliveries"] == 1
    assert delayed["visible_at"] > 0 and "delivery" not in delayed
