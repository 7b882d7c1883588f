"""A partitioned space answers as one space, through the SDK, in every deployment shape.

The same tests run against:

- `plain`: "jobs" unpartitioned, on one server (the reference: every test must pass there too,
  except those about partitions themselves);
- `partitioned`: "jobs" in 3 partitions by "region", on one server (LocalServer);
- `workers`: "jobs" in 4 partitions on `outrig serve --workers 2` with a data dir (SQLite, one
  store per worker), two partitions on each worker, the SDK connected to the shared port;
- `tier-direct` and `tier-forwarded`: "jobs" in 4 partitions on a tier of two `outrig serve
  --backend postgres` processes on a real PostgreSQL, the partitions owned by both; the SDK
  either sends each call of one partition straight to its owner, or (``direct=False``) sends
  everything to one server, which forwards.

Templates with the routing field set go to one partition; without it, they fan out (reads, counts,
contents and notify to every partition at once; takes in turn; a blocking take waits on every
partition and takes where a match appears).
"""

from __future__ import annotations

import random
import shutil
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

import outrig
from outrig._codec import encode_value
from outrig._routing import value_partition
from outrig.service.config import ServerConfig
from outrig.service.engine import SpaceSettings
from outrig.testing import LocalServer
from outrig.v1 import space_pb2 as pb
from outrig.v1.space_pb2_grpc import SpaceStub

from ..conftest import ServerProcess, start_server
from ..polling import scrape, wait_until
from ..postgres_server import PostgresServer
from ..worker_processes import start_workers

REGIONS = [f"r{i}" for i in range(8)]


@dataclass
class Job(outrig.Entry, type_name="part.Job"):
    region: str | None = None
    n: int | None = None
    priority: int | None = None


@dataclass
class Urgent(Job, type_name="part.Urgent"):
    pass


@dataclass(frozen=True)
class Shape:
    name: str
    address: str
    partitions: int  # 1: unpartitioned
    direct: bool = True
    servers: tuple[ServerProcess, ...] = ()  # a tier's servers
    workers: tuple[str, ...] = ()  # `--workers N`: each worker's own address

    def connect(self, **options: Any) -> outrig.Space:
        return outrig.connect(self.address, space="jobs", direct=self.direct, **options)


def _config_file(partitions: int) -> Path:
    path = Path(tempfile.mkstemp(prefix="outrig-partitions-", suffix=".toml")[1])
    path.write_text(f'[spaces.jobs]\npartition_by = "region"\npartitions = {partitions}\n')
    return path


@pytest.fixture(scope="module", params=["plain", "partitioned", "workers", "tier-direct", "tier-forwarded"])
def shape(request: pytest.FixtureRequest) -> Iterator[Shape]:
    if request.param == "workers":
        config = _config_file(4)
        data_dir = tempfile.mkdtemp(prefix="outrig-partitions-workers-")
        workers = start_workers(2, "--data-dir", data_dir, "--config", str(config))
        try:
            yield Shape("workers", workers.public, 4, workers=tuple(workers.addresses))
        finally:
            workers.stop()
            config.unlink()
            shutil.rmtree(data_dir, ignore_errors=True)
        return
    if request.param in ("plain", "partitioned"):
        partitions = 1 if request.param == "plain" else 3
        spaces = (
            {"jobs": SpaceSettings(partition_by="region", partitions=partitions)} if partitions > 1 else {}
        )
        with LocalServer(ServerConfig(spaces=spaces)) as server:
            yield Shape(request.param, server.address, partitions)
        return
    postgres: PostgresServer = request.getfixturevalue("postgres")
    database = postgres.dsn(postgres.new_database("part"))
    config = _config_file(4)
    flags = ("--backend", "postgres", "--dsn", database, "--config", str(config))
    servers = (start_server(*flags, metrics=True), start_server(*flags, metrics=True))
    try:
        shape = Shape(request.param, servers[0].address, 4, request.param == "tier-direct", servers)
        _claim_spread(shape)
        yield shape
    finally:
        for process in servers:
            process.stop()
        config.unlink()


def _partition(region: str, partitions: int) -> int:
    k = value_partition(encode_value(region), partitions)
    assert k is not None
    return k


def _claim_spread(shape: Shape) -> None:
    """Have each server of the tier claim some partitions: a write of a region of each partition
    through alternate servers (a partition nobody serves is claimed by the server it reaches)."""
    by_partition: dict[int, str] = {}
    for region in (f"claim{i}" for i in range(200)):
        k = _partition(region, shape.partitions)
        by_partition.setdefault(k, region)
        if len(by_partition) == shape.partitions:
            break
    for k, region in sorted(by_partition.items()):
        server = shape.servers[k % len(shape.servers)]
        with outrig.connect(server.address, space="jobs", direct=False) as space:
            space.write(Job(region=region, n=-1))
            assert space.take_nowait(Job(region=region, n=-1)) is not None


@pytest.fixture
def space(shape: Shape) -> Iterator[outrig.Space]:
    with shape.connect() as connected:
        connected.take_many(Job(), max_entries=10_000, timeout=0)  # what an earlier test left
        yield connected


def partitioned(shape: Shape) -> None:
    if shape.partitions == 1:
        pytest.skip("about partitions: the plain space has none")


def _write_spread(space: outrig.Space, count: int, **fields: Any) -> list[Job]:
    written = [Job(region=REGIONS[i % len(REGIONS)], n=i, **fields) for i in range(count)]
    for job in written:
        space.write(job, lease=60.0)
    return written


# ------------------------------------------------------------------------------ reads and counts


def test_count_contents_and_reads_see_every_partition(space: outrig.Space) -> None:
    written = _write_spread(space, 24)
    assert space.count(Job()) == 24
    assert space.count(Job(region="r3")) == 3
    assert sorted(job.n for job in space.contents(Job())) == list(range(24))  # type: ignore[union-attr]
    assert sorted(job.n for job in space.contents(Job(region="r5"))) == [5, 13, 21]  # type: ignore[union-attr]
    assert space.read_nowait(Job(n=17)) == written[17]
    assert space.read_nowait(Job(region="r1", n=9)) == written[9]
    assert space.read_nowait(Job(region="r2", n=9)) is None
    assert len(space.read_many(Job(), max_entries=10, timeout=0)) == 10
    assert len(space.read_many(Job(), max_entries=100, timeout=0)) == 24
    assert len(list(space.contents(Job(), max_entries=7))) == 7
    assert space.count(Job(region=outrig.OneOf("r1", "r2"))) == 6


def test_supertype_templates_and_matchers_fan_out_too(space: outrig.Space) -> None:
    for i in range(12):
        space.write(Urgent(region=REGIONS[i % 8], n=i) if i % 3 == 0 else Job(region=REGIONS[i % 8], n=i))
    assert space.count(Urgent()) == 4
    assert space.count(Job()) == 12
    assert sorted(j.n for j in space.contents(Job(n=outrig.GE(9)))) == [9, 10, 11]  # type: ignore[union-attr]
    assert space.count(Job(region=outrig.Prefix("r1"))) == 2


def test_order_by_merges_the_partitions(space: outrig.Space) -> None:
    numbers = list(range(30))
    random.Random(5).shuffle(numbers)
    for n in numbers:
        space.write(Job(region=REGIONS[n % 8], n=n, priority=n % 7))
    ordered = [j.n for j in space.contents(Job(), order_by=["n"])]  # type: ignore[union-attr]
    assert ordered == list(range(30))
    top = space.read_many(Job(), max_entries=5, timeout=0, order_by=[outrig.desc("n")])
    assert [j.n for j in top] == [29, 28, 27, 26, 25]  # type: ignore[union-attr]
    taken = space.take_many(Job(), max_entries=4, timeout=0, order_by=[outrig.desc("priority"), "n"])
    assert [(j.priority, j.n) for j in taken] == [(6, 6), (6, 13), (6, 20), (6, 27)]  # type: ignore[union-attr]
    first = space.take(Job(), timeout=0, order_by=["n"])
    assert first is not None and first.n == 0  # type: ignore[union-attr]


# ------------------------------------------------------------------------------ takes


def test_takes_take_each_entry_once_across_partitions(space: outrig.Space) -> None:
    _write_spread(space, 40)
    taken = []
    while (job := space.take_nowait(Job())) is not None:
        taken.append(job.n)  # type: ignore[union-attr]
    assert sorted(taken) == list(range(40))
    _write_spread(space, 40)
    batches = [space.take_many(Job(), max_entries=7, timeout=0) for _ in range(7)]
    numbers = sorted(j.n for batch in batches for j in batch)  # type: ignore[union-attr]
    assert numbers == list(range(40))
    assert space.take_many(Job(), max_entries=7, timeout=0) == []


def test_a_blocking_take_without_the_routing_field_is_woken_by_a_write_to_any_partition(
    shape: Shape, space: outrig.Space
) -> None:
    for region in REGIONS:
        got: list[Any] = []

        def take(into: list[Any] = got) -> None:
            into.append(space.take(Job(n=7), timeout=30))

        taker = threading.Thread(target=take)
        taker.start()
        # It waits on every partition: a parked read on each (a plain space: one parked take).
        wait_until(lambda: space.describe().waiters >= shape.partitions, what="the taker waiting")
        space.write(Job(region=region, n=7))
        taker.join(timeout=30)
        assert got == [Job(region=region, n=7)]
    assert space.take(Job(n=7), timeout=0.2) is None


def test_ten_blocking_takers_take_each_entry_exactly_once(shape: Shape, space: outrig.Space) -> None:
    results: list[Any] = []
    lock = threading.Lock()

    def taker() -> None:
        with shape.connect() as mine:
            while (job := mine.take(Job(), timeout=1.5)) is not None:
                with lock:
                    results.append(job.n)  # type: ignore[union-attr]

    threads = [threading.Thread(target=taker) for _ in range(10)]
    for thread in threads:
        thread.start()
    for i in range(60):
        space.write(Job(region=REGIONS[i % 8], n=i))
    for thread in threads:
        thread.join(timeout=60)
    assert sorted(results) == list(range(60))
    assert space.count(Job()) == 0


def test_a_take_with_the_routing_field_goes_to_its_partition(space: outrig.Space) -> None:
    _write_spread(space, 16)
    assert space.take_nowait(Job(region="r4")) in (Job(region="r4", n=4), Job(region="r4", n=12))
    assert space.take(Job(region="r4"), timeout=0) is not None
    assert space.take(Job(region="r4"), timeout=0) is None
    assert space.count(Job()) == 14


# ------------------------------------------------------------------------------ writes and leases


def test_write_many_across_partitions_and_its_leases(space: outrig.Space) -> None:
    jobs = [Job(region=REGIONS[i % 8], n=i) for i in range(20)]
    leases = space.write_many(jobs, lease=60.0)
    assert len(leases) == 20 and len({lease.id for lease in leases}) == 20
    assert space.count(Job()) == 20
    renewed = space.renew_many(leases[:10], 120.0)
    assert all(result.error is None for result in renewed)
    cancelled = space.cancel_many(leases[::2])
    assert all(result.error is None for result in cancelled)
    assert sorted(j.n for j in space.contents(Job())) == list(range(1, 20, 2))  # type: ignore[union-attr]
    with pytest.raises(outrig.NotFoundError):
        leases[0].renew(10.0)
    leases[1].cancel()
    assert space.count(Job()) == 9


def test_notify_hears_writes_to_every_partition(space: outrig.Space) -> None:
    with space.notify(Job(), lease=60.0) as events:
        for i in range(8):
            space.write(Job(region=REGIONS[i], n=i))
        heard = [next(iter(events)) for _ in range(8)]
    assert sorted(event.entry.n for event in heard) == list(range(8))  # type: ignore[union-attr]
    sequences = [event.sequence for event in heard]
    assert sequences == sorted(sequences) and len(set(sequences)) == 8


def test_a_notify_ends_when_its_registrations_lease_does(space: outrig.Space) -> None:
    with space.notify(Job(), lease=60.0) as events:
        space.write(Job(region="r2", n=1))
        assert next(iter(events)).entry == Job(region="r2", n=1)
        events.lease.cancel()
        assert list(events) == []  # the merged stream ends with the lease it was given


# ------------------------------------------------------------------------------ transactions


def test_a_transaction_works_in_its_routing_values_partition(shape: Shape, space: outrig.Space) -> None:
    route = "r1" if shape.partitions > 1 else None  # an unpartitioned space needs none
    space.write(Job(region="r1", n=1))
    with space.transaction(route=route) as txn:
        txn.write(Job(region="r1", n=2))
        assert txn.take_nowait(Job(n=1)) == Job(region="r1", n=1)
        assert space.count(Job(region="r1")) == 0  # its write is its own, its take hides n=1
    assert sorted(j.n for j in space.contents(Job(region="r1"))) == [2]  # type: ignore[union-attr]
    txn = space.transaction(route=route)
    assert txn.take_nowait(Job(region="r1")) is not None
    txn.abort()
    assert space.count(Job(region="r1")) == 1


def test_a_transaction_crossing_partitions_is_refused(shape: Shape, space: outrig.Space) -> None:
    partitioned(shape)
    with pytest.raises(outrig.CrossPartitionError, match="region"):
        space.transaction()
    other = next(r for r in REGIONS if _partition(r, shape.partitions) != _partition("r1", shape.partitions))
    with space.transaction(route="r1") as txn:
        with pytest.raises(outrig.CrossPartitionError, match="partition"):
            txn.write(Job(region=other, n=1))
        with pytest.raises(outrig.CrossPartitionError):
            txn.take_nowait(Job(region=other))
        txn.write(Job(region="r1", n=5))
    assert space.count(Job()) == 1


# ------------------------------------------------------------------------------ bad input


def test_an_entry_without_its_routing_value_is_refused_naming_the_field(
    shape: Shape, space: outrig.Space
) -> None:
    partitioned(shape)
    with pytest.raises(outrig.RoutingValueError, match=r"entry\.fields\['region'\]"):
        space.write(Job(n=1))
    with pytest.raises(outrig.RoutingValueError, match=r"entries\[1\]\.fields\['region'\]"):
        space.write_many([Job(region="r1"), Job(region=None, n=2)])
    with pytest.raises(outrig.RoutingValueError, match=r"a bool, int, double, string or bytes, not list"):
        space.write(outrig.GenericEntry("part.Job", fields={"region": ["r1"], "n": 1}))
    with pytest.raises(outrig.InvalidArgumentError, match="route: a value of 'region'"):
        space.transaction(route=["r1"])
    assert space.count(Job()) == 0


def test_a_partition_cannot_be_named_beyond_the_space(shape: Shape) -> None:
    partitioned(shape)
    beyond = outrig.connect(shape.address, space=f"jobs~{shape.partitions}", direct=False)
    with beyond, pytest.raises(outrig.InvalidArgumentError, match="partition"):
        beyond.count(Job())
    other = outrig.connect(shape.address, space="other~1", direct=False)
    with other, pytest.raises(outrig.InvalidArgumentError, match="not partitioned"):
        other.count(Job())


# ------------------------------------------------------------------------------ admin


def test_describe_browse_and_purge_cover_every_partition(space: outrig.Space) -> None:
    _write_spread(space, 50)
    described = space.describe()
    assert described.entries == 50
    seen: list[int] = []
    page = space.browse(Job(), max_entries=7)
    while True:
        seen.extend(e.entry.n for e in page.entries)  # type: ignore[union-attr]
        if not page.next:
            break
        page = space.browse(Job(), after=page.next, max_entries=7)
    assert sorted(seen) == list(range(50))
    assert space.purge(Job(region="r0"), dry_run=True) == 7
    assert space.purge(Job()) == 50
    assert space.count(Job()) == 0


def test_each_partition_is_served_by_a_worker_of_its_own(shape: Shape) -> None:
    if not shape.workers:
        pytest.skip("not workers")
    with grpc.insecure_channel(shape.address) as channel:
        stub = SpaceStub(channel)
        owners = {
            stub.Locate(pb.LocateRequest(space="jobs", partition=k)).address for k in range(shape.partitions)
        }
    assert owners == set(shape.workers)  # partition k on worker (hash + k) mod 2: both


def test_each_partition_is_a_space_of_the_tier(shape: Shape) -> None:
    partitioned(shape)
    if shape.workers:
        pytest.skip("a worker lists its own spaces only")
    with shape.connect() as space:
        for region in REGIONS:
            space.write(Job(region=region, n=1))
        placements = {p.space: p for p in space.list_spaces()}
        names = [f"jobs~{k}" for k in range(shape.partitions)]
        assert set(names) <= set(placements)
        assert "jobs" not in placements  # the space itself is served as its partitions only
        if shape.servers:
            assert len({placements[name].address for name in names}) == len(shape.servers)
        space.take_many(Job(), max_entries=100, timeout=0)


def _forwarded(shape: Shape) -> float:
    """Calls the tier's servers forwarded to another, so far."""
    total = 0.0
    for server in shape.servers:
        assert server.metrics is not None
        samples = scrape(server.metrics)
        total += sum(
            v for k, v in samples.items() if k.startswith('outrig_routed_calls_total{how="forwarded"')
        )
    return total


def test_the_sdk_sends_a_call_of_one_partition_straight_to_its_owner(shape: Shape) -> None:
    if not shape.servers:
        pytest.skip("one server: nothing to forward")
    with shape.connect() as space:
        space.write(Job(region="r0", n=0))  # the first calls locate the space and the partition
        space.take_many(Job(), max_entries=100, timeout=0)
        before = _forwarded(shape)
        for i in range(40):
            space.write(Job(region=REGIONS[i % 8], n=i))
        for i in range(40):
            assert space.take(Job(region=REGIONS[i % 8], n=i), timeout=5) is not None
        forwarded = _forwarded(shape) - before
        owners = {p.space: p.address for p in space.list_spaces()}
    elsewhere = sum(
        owners[f"jobs~{_partition(REGIONS[i % 8], shape.partitions)}"] != shape.address for i in range(40)
    )
    if shape.direct:
        assert forwarded == 0  # every one went to the partition's owner
    else:
        assert forwarded == 2 * elsewhere > 0  # the write and the take of each the other server owns


def test_blocking_ordered_takers_lose_nothing(shape: Shape, space: outrig.Space) -> None:
    """Blocking takes with an order, woken by writes to any partition while better matches arrive
    in others: each entry is taken once, and none is taken for a caller that does not get it."""
    taken: list[int] = []
    lock = threading.Lock()

    def taker() -> None:
        with shape.connect() as mine:
            while (job := mine.take(Job(), timeout=1.0, order_by=[outrig.desc("priority")])) is not None:
                with lock:
                    taken.append(job.n)  # type: ignore[union-attr]

    threads = [threading.Thread(target=taker) for _ in range(6)]
    for thread in threads:
        thread.start()
    rng = random.Random(7)
    for i in range(200):
        space.write(Job(region=REGIONS[rng.randrange(8)], n=i, priority=rng.randrange(5)))
    for thread in threads:
        thread.join(timeout=60)
    left = [job.n for job in space.contents(Job())]  # type: ignore[union-attr]
    assert sorted(taken + left) == list(range(200))


# ------------------------------------------------------------------------------ takes with ack


def test_takes_with_ack_fan_out_and_are_settled_by_their_receipts(space: outrig.Space) -> None:
    _write_spread(space, 16)
    held = []
    while (delivery := space.take_nowait(Job(), ack=30.0)) is not None:
        held.append(delivery)
    assert sorted(d.entry.n for d in held) == list(range(16))  # type: ignore[union-attr]
    assert len({d.receipt for d in held}) == 16
    assert space.count(Job()) == 0  # in flight: invisible
    for delivery in held[:8]:
        delivery.ack()  # each goes to the partition its receipt names
    for delivery in held[8:]:
        delivery.nack(delay=0.0)
    assert sorted(j.n for j in space.contents(Job())) == sorted(d.entry.n for d in held[8:])  # type: ignore[union-attr]
    batch = space.take_many(Job(), max_entries=5, timeout=0, ack=30.0)
    assert len(batch) == 5 and all(d.deliveries == 2 for d in batch)
    for delivery in batch:
        delivery.extend(60.0)
        delivery.ack()
    routed = space.take(Job(region="r1"), timeout=0, ack=30.0)
    if routed is not None:  # r1's entry may have been in the batch
        assert routed.entry.region == "r1"  # type: ignore[union-attr]
        routed.ack()
    space.take_many(Job(), max_entries=100, timeout=0)


def test_a_blocking_take_with_ack_is_woken_by_any_partition(shape: Shape, space: outrig.Space) -> None:
    got: list[Any] = []
    taker = threading.Thread(target=lambda: got.append(space.take(Job(n=3), timeout=30, ack=30.0)))
    taker.start()
    wait_until(lambda: space.describe().waiters >= shape.partitions, what="the taker waiting")
    space.write(Job(region="r6", n=3))
    taker.join(timeout=30)
    (delivery,) = got
    assert delivery is not None and delivery.entry == Job(region="r6", n=3)
    delivery.ack()
    assert space.take_nowait(Job(n=3)) is None


def test_a_partitions_dead_letters_go_to_its_dead_letter_spaces_partition(
    shape: Shape, space: outrig.Space
) -> None:
    space.write(Job(region="r2", n=99))
    delivery = space.take_nowait(Job(n=99), ack=30.0, max_deliveries=1)
    assert delivery is not None and delivery.deliveries == 1
    delivery.nack(delay=0.0)
    assert space.take_nowait(Job(n=99)) is None
    with shape.connect() as handle, outrig.connect(shape.address, space="jobs.dead") as dead:
        moved: outrig.Delivery | None
        if shape.servers:
            # On a tier the dead-letter space may be another server's (a rebalance moves spaces
            # on their own): its owner takes the letter in at its next look, within a third of a
            # lease (docs/postgres.md), not in the nack's own change.
            moved = wait_until(
                lambda: dead.take_nowait(Job(region="r2"), ack=30.0), what="the dead letter taken in"
            )
        else:
            moved = dead.take_nowait(Job(region="r2"), ack=30.0)
        assert moved is not None and moved.entry == Job(region="r2", n=99)
        assert moved.deliveries == 2 and "max_deliveries=1" in moved.dead_letter_reason
        moved.ack()
        assert handle.count(Job(n=99)) == 0
