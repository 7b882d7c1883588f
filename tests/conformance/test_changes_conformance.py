"""A space's change log through the SDK (`Space.changes`), the same in every deployment shape:

- `memory`: one server, spaces in memory only;
- `sqlite`: one server with a data dir (the embedded SQLite store, `durability = always`);
- `partitioned` and `partitioned-sqlite`: "items" in 3 partitions by "region" on one server
  (in memory, and on SQLite): one feed per partition, merged, every cursor holding each
  partition's position;
- `postgres` and `partitioned-postgres`: the PostgreSQL owner tier (one server of it, on a fresh
  database of the session's PostgreSQL), the log recorded in PostgreSQL.

A test starts from the space's head (`_head`): a shape's server is shared by its tests. Across
partitions the merged stream keeps each partition's order, not one order of all (docs/
notifications.md), so the partitioned shapes compare each region's sequence and the whole set.
"""

from __future__ import annotations

import base64
import dataclasses
import shutil
import tempfile
import threading
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

import outrig
from outrig._codec import encode_value
from outrig._routing import value_partition
from outrig.service.config import ServerConfig
from outrig.service.engine import SpaceSettings
from outrig.testing import LocalServer
from outrig.v1 import space_pb2 as pb

from ..postgres_server import PostgresServer

REGIONS = ("r0", "r1", "r2", "r3", "r4", "r5")
#: The retention of the "small" space, per partition: its cursors are soon compacted.
SMALL = 4


@dataclass
class Item(outrig.Entry, type_name="chg.Item"):
    region: str | None = None
    n: int | None = None
    tag: str | None = None


@dataclass(frozen=True)
class Shape:
    name: str
    address: str
    partitions: int

    def connect(self, space: str = "items", **options: object) -> outrig.Space:
        return outrig.connect(self.address, space=space, **options)  # type: ignore[arg-type]


@pytest.fixture(
    scope="module",
    params=["memory", "sqlite", "partitioned", "partitioned-sqlite", "postgres", "partitioned-postgres"],
)
def shape(request: pytest.FixtureRequest) -> Iterator[Shape]:
    partitions = 3 if request.param.startswith("partitioned") else 1
    split = {"partition_by": "region", "partitions": partitions} if partitions > 1 else {}
    spaces = {
        "items": SpaceSettings(**split),  # type: ignore[arg-type]
        "small": SpaceSettings(changes_max_count=SMALL, **split),  # type: ignore[arg-type]
        "quiet": SpaceSettings(changes=False),
    }
    data_dir = tempfile.mkdtemp(prefix="outrig-changes-") if request.param.endswith("sqlite") else None
    try:
        config = ServerConfig(spaces=spaces, data_dir=Path(data_dir) if data_dir else None)
        if request.param.endswith("postgres"):
            postgres: PostgresServer = request.getfixturevalue("postgres")
            dsn = postgres.dsn(postgres.new_database("chg"))
            config = dataclasses.replace(config, backend="postgres", dsn=dsn)
        with LocalServer(config) as server:
            yield Shape(request.param, server.address, partitions)
    finally:
        if data_dir is not None:
            shutil.rmtree(data_dir, ignore_errors=True)


@pytest.fixture
def space(shape: Shape) -> Iterator[outrig.Space]:
    with shape.connect() as connected:
        connected.take_many(Item(), max_entries=10_000, timeout=0)  # what an earlier test left
        yield connected


def _head(space: outrig.Space) -> str:
    """The cursor at the space's head now."""
    with space.changes() as stream:
        return stream.cursor


def _read(stream: outrig.ChangeStream, count: int) -> list[outrig.Change]:
    return [next(stream) for _ in range(count)]


def _seen(changes: list[outrig.Change]) -> list[tuple[str, int | None]]:
    return [(c.kind, c.entry.n) for c in changes]  # type: ignore[union-attr]


def _same_sequence(
    shape: Shape, got: Sequence[tuple[str, int | None]], expected: Sequence[tuple[str, int | None]]
) -> None:
    """`got` is `expected`: exactly, for a space; for a partitioned one, the same changes, each
    region's in its order (partitions interleave as they happen)."""
    if shape.partitions == 1:
        assert got == expected
        return
    assert sorted(got, key=repr) == sorted(expected, key=repr)  # none lost, none twice
    for region in REGIONS:
        mine = {n for n in range(1000) if REGIONS[n % len(REGIONS)] == region}
        assert [x for x in got if x[1] in mine] == [x for x in expected if x[1] in mine]


def _write(space: outrig.Space, numbers: range, tag: str = "a", lease: float = 600.0) -> list[outrig.Lease]:
    return [space.write(Item(region=REGIONS[n % len(REGIONS)], n=n, tag=tag), lease=lease) for n in numbers]


def test_replay_then_live_has_no_gap_and_no_duplicate_at_the_seam(shape: Shape, space: outrig.Space) -> None:
    head = _head(space)
    _write(space, range(40))
    got: list[outrig.Change] = []
    with space.changes(Item(), since=head) as stream:
        got += _read(stream, 10)  # replaying, while the writer below goes on live
        writer = threading.Thread(target=_write, args=(space, range(40, 80)))
        writer.start()
        got += _read(stream, 70)
        writer.join()
        space.write(Item(region="r0", n=999, tag="end"))
        assert next(stream).entry == Item(region="r0", n=999, tag="end")  # nothing more in between
    _same_sequence(shape, _seen(got), [("write", n) for n in range(80)])
    assert all(c.entry == Item(region=REGIONS[c.entry.n % 6], n=c.entry.n, tag="a") for c in got)  # type: ignore[union-attr]


def test_a_resume_from_any_cursor_gets_exactly_what_follows(shape: Shape, space: outrig.Space) -> None:
    head = _head(space)
    leases = _write(space, range(30))
    for n in range(10):
        assert space.take_nowait(Item(n=n)) is not None
    for lease in leases[25:]:
        lease.cancel()
    with space.changes(Item(), since=head) as stream:
        everything = _read(stream, 45)
    expected = [("write", n) for n in range(30)] + [("take", n) for n in range(10)]
    expected += [("cancel", n) for n in range(25, 30)]
    _same_sequence(shape, _seen(everything), expected)
    markers: list[int] = []  # written after `everything`: each later resume sees them too
    for i in (0, 13, 29, 44):
        with space.changes(Item(), since=everything[i].cursor) as stream:
            rest = _seen(_read(stream, 44 - i + len(markers)))
            space.write(Item(region="r1", n=500 + i))
            last = _seen(_read(stream, 1))
        _same_sequence(shape, [x for x in rest if x[1] not in markers], _seen(everything[i + 1 :]))
        assert [x for x in rest if x[1] in markers] == [("write", n) for n in markers]
        assert last == [("write", 500 + i)]  # and nothing else in between
        markers.append(500 + i)


def test_kinds_and_templates_with_matchers_choose_the_changes(shape: Shape, space: outrig.Space) -> None:
    head = _head(space)
    leases = _write(space, range(20), tag="a") + _write(space, range(20, 30), tag="b")
    for n in (3, 7, 12, 22):
        assert space.take_nowait(Item(n=n)) is not None
    for lease in (leases[15], leases[16], leases[25]):
        lease.cancel()
    with space.changes(Item(tag="a", n=outrig.GE(5)), since=head, kinds=("take", "cancel")) as stream:
        got = _read(stream, 4)
        space.write(Item(region="r2", n=40, tag="a"))  # a write: not of these kinds
        leases[8].cancel()
        last = next(stream)
    _same_sequence(shape, _seen(got), [("take", 7), ("take", 12), ("cancel", 15), ("cancel", 16)])
    assert (last.kind, last.entry.n) == ("cancel", 8)  # type: ignore[union-attr]
    with space.changes(Item(tag="b"), since=head, kinds=["write"]) as stream:
        assert sorted(c.entry.n for c in _read(stream, 10)) == list(range(20, 30))  # type: ignore[union-attr]


def test_the_stream_cursor_moves_past_changes_that_do_not_match(shape: Shape, space: outrig.Space) -> None:
    head = _head(space)
    with space.changes(Item(tag="wanted"), since=head) as stream:
        _write(space, range(12), tag="other")
        space.write(Item(region="r3", n=100, tag="wanted"))
        first = next(stream)
        assert first.entry.n == 100  # type: ignore[union-attr]
    # A stream from that change's cursor, with no template, sees nothing of what came before it.
    with space.changes(since=first.cursor) as stream:
        space.write(Item(region="r4", n=101, tag="other"))
        assert next(stream).entry.n == 101  # type: ignore[union-attr]


def test_a_durable_subscription_starts_where_it_was_acknowledged(shape: Shape, space: outrig.Space) -> None:
    name = f"d-{uuid.uuid4().hex[:8]}"
    head = _head(space)
    _write(space, range(10))
    with space.changes(Item(), since=head, durable=name) as stream:
        first = _read(stream, 6)
        with pytest.raises(outrig.SubscriptionBusyError), space.changes(durable=name):
            pass
        stream.ack(first[3].cursor)
        stream.ack(first[1].cursor)  # older: changes nothing
    _write(space, range(10, 14))
    with space.changes(Item(), since=head, durable=name) as stream:  # since ignored: it exists
        again = _read(stream, 10)
        stream.ack()
    acknowledged = set(_seen(first[:4]))
    expected = [("write", n) for n in range(14) if ("write", n) not in acknowledged]
    _same_sequence(shape, _seen(again), expected)
    with space.changes(durable=name) as stream:
        space.write(Item(region="r5", n=77))
        assert next(stream).entry.n == 77  # type: ignore[union-attr]
    description = space.describe()
    assert description.change_log is not None
    assert name in {s.name for s in description.change_log.subscriptions}
    space.delete_subscription(name)
    with pytest.raises(outrig.SubscriptionNotFoundError):
        space.delete_subscription(name)
    with pytest.raises(ValueError, match="durable"), space.changes() as plain:
        plain.ack()


def test_a_compacted_cursor_raises_with_the_oldest_cursor_still_held(shape: Shape) -> None:
    with shape.connect("small") as small:
        head = _head(small)
        _write(small, range(30))
        with pytest.raises(outrig.CompactedError) as raised, small.changes(since=head):
            pass
        assert raised.value.oldest
        assert raised.value.code.name == "OUT_OF_RANGE"
        with small.changes(since=raised.value.oldest) as stream:
            held = _read(
                stream, sum(min(SMALL, len(ns)) for ns in _by_partition(30, shape.partitions).values())
            )
            small.write(Item(region="r0", n=1000))
            assert next(stream).entry.n == 1000  # type: ignore[union-attr]
        expected = sorted(n for ns in _by_partition(30, shape.partitions).values() for n in ns[-SMALL:])
        assert sorted(c.entry.n for c in held) == expected  # type: ignore[union-attr]


def _by_partition(count: int, partitions: int) -> dict[int, list[int]]:
    """The numbers 0 .. count-1 written by `_write`, by the partition of their region."""
    found: dict[int, list[int]] = {}
    for n in range(count):
        k = value_partition(encode_value(REGIONS[n % len(REGIONS)]), partitions) if partitions > 1 else 0
        found.setdefault(k or 0, []).append(n)
    return found


def _cursor(*positions: tuple[str, int, int]) -> str:
    import zlib

    cursor = pb.ChangeCursor()
    for name, epoch, seq in positions:
        cursor.positions.add(space=zlib.crc32(name.encode()), epoch=epoch, seq=seq)
    return base64.urlsafe_b64encode(cursor.SerializeToString()).rstrip(b"=").decode()


def _positions(cursor: str) -> list[pb.ChangePosition]:
    return list(
        pb.ChangeCursor.FromString(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))).positions
    )


def test_bad_cursors_are_invalid_arguments_naming_since(shape: Shape, space: outrig.Space) -> None:
    head = _head(space)
    with shape.connect("elsewhere") as other:
        foreign = _head(other)
    names = ["items"] if shape.partitions == 1 else [f"items~{k}" for k in range(shape.partitions)]
    ahead = [(name, p.epoch, p.seq + 1000) for name, p in zip(names, _positions(head), strict=True)]
    wrong_count = [(f"items~{k}", 1, 0) for k in range(shape.partitions + 1)]
    for cursor, why in (
        ("not a cursor!", "is no cursor"),
        ("", "empty"),
        (foreign if shape.partitions == 1 else _cursor(*(("x", 1, 0),) * shape.partitions), "another space"),
        (_cursor(*wrong_count), "positions"),
        (_cursor(*ahead), "ahead"),
    ):
        with pytest.raises(outrig.InvalidArgumentError, match=f"since.*{why}"), space.changes(since=cursor):
            pass


def test_a_space_without_a_log_refuses_changes_naming_the_setting(shape: Shape) -> None:
    with (
        shape.connect("quiet") as quiet,
        pytest.raises(outrig.FailedPreconditionError, match="changes"),
        quiet.changes(),
    ):
        pass


def test_describe_shows_the_change_log(shape: Shape, space: outrig.Space) -> None:
    before = space.describe().change_log
    assert before is not None
    _write(space, range(5))
    after = space.describe().change_log
    assert after is not None
    assert after.head == before.head + 5 and after.count >= 5 and after.bytes > 0
    with space.changes(since=after.head_cursor) as stream:
        space.write(Item(region="r0", n=600))
        assert next(stream).entry.n == 600  # type: ignore[union-attr]
