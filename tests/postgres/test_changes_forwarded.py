"""Change streams forwarded between servers of a tier: a client that does not follow owners
(`direct=False`) reads a space's changes through a server that owns nothing of it, and a
partitioned space's changes through a server that owns only some of its partitions (the fan-out
opens one feed per partition, forwarded to each owner). Cursors taken through one server resume
through another, and an acknowledgement of a durable subscription reaches every partition."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import outrig
from outrig._codec import encode_value
from outrig._routing import value_partition

from ..conftest import ServerProcess, start_server
from ..postgres_server import PostgresServer

PARTITIONS = 4


@dataclass
class Item(outrig.Entry, type_name="fwd.Item"):
    key: str | None = None
    n: int | None = None


@pytest.fixture
def tier(postgres: PostgresServer) -> Iterator[list[ServerProcess]]:
    config = Path(tempfile.mkstemp(prefix="outrig-fwd-", suffix=".toml")[1])
    config.write_text(f'[spaces.parts]\npartition_by = "key"\npartitions = {PARTITIONS}\n')
    flags = ("--backend", "postgres", "--dsn", postgres.dsn(postgres.new_database("fw")))
    servers = [start_server(*flags, "--config", str(config)) for _ in range(3)]
    yield servers
    for server in servers:
        server.stop()
    config.unlink()


def _read(stream: outrig.ChangeStream, count: int) -> list[tuple[str, int | None]]:
    seen: list[tuple[str, int | None]] = []
    for change in stream:
        assert isinstance(change.entry, Item)
        seen.append((change.kind, change.entry.n))
        if len(seen) == count:
            break
    return seen


def test_a_space_changes_through_a_server_that_does_not_own_it(tier: list[ServerProcess]) -> None:
    with outrig.connect(tier[0].address, space="plain", direct=False) as claim:
        claim.write(Item(key="a", n=0))
        owner = claim.locate().address
    via = [server for server in tier if server.address != owner]
    with outrig.connect(via[0].address, space="plain", direct=False) as first:
        with first.changes(Item()) as stream:
            first.write_many([Item(key="a", n=n) for n in range(1, 6)])
            assert first.take_nowait(Item(n=3)) == Item(key="a", n=3)
            assert _read(stream, 6) == [("write", n) for n in range(1, 6)] + [("take", 3)]
            cursor = stream.cursor
        first.write(Item(key="a", n=6))
    with outrig.connect(via[1].address, space="plain", direct=False) as second:
        with second.changes(Item(), since=cursor) as resumed:  # through the other non-owner
            assert _read(resumed, 1) == [("write", 6)]
        bad = pytest.raises(outrig.InvalidArgumentError, match="since")
        with bad, second.changes(Item(), since="garbage!"):
            pass


def test_a_partitioned_space_changes_through_a_server_that_owns_some_partitions(
    tier: list[ServerProcess],
) -> None:
    keys: dict[int, str] = {}
    n = 0
    while len(keys) < PARTITIONS:
        k = value_partition(encode_value(f"k{n}"), PARTITIONS)
        assert k is not None
        keys.setdefault(k, f"k{n}")
        n += 1
    for k in range(PARTITIONS):  # each partition claimed through a server in turn
        with outrig.connect(tier[k % 3].address, space="parts", direct=False) as claim:
            claim.write(Item(key=keys[k], n=-1 - k))
    with outrig.connect(tier[0].address, space="parts", direct=False) as space:
        owners = {p.address for p in space.list_spaces() if p.space.startswith("parts~") and p.expires_in}
        assert len(owners) > 1  # the fan-out reaches partitions on other servers
        with space.changes(Item(), durable="audit") as stream:
            space.write_many([Item(key=keys[k], n=k) for k in range(PARTITIONS)])
            got = _read(stream, PARTITIONS)
            assert sorted(got) == [("write", k) for k in range(PARTITIONS)]
            stream.ack()
        space.write(Item(key=keys[0], n=100))
    with outrig.connect(tier[1].address, space="parts", direct=False) as other:
        with other.changes(Item(), durable="audit") as again:  # every partition resumes past its ack
            assert _read(again, 1) == [("write", 100)]
        other.delete_subscription("audit")
        with pytest.raises(outrig.SubscriptionNotFoundError):
            other.delete_subscription("audit")
