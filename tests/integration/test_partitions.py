"""Partitioned spaces against a naive model, across a restart, and the routing hash's one
definition (tests/conformance/test_partitioned_conformance.py runs the behaviour suite in every
deployment shape).

The property: for random sequences of writes, takes, reads, counts and contents, a space in 3
partitions and the same space unpartitioned each give an answer the model allows (a take returns
some entry that matches, or None exactly when none does; counts and contents are the model's), so
the partitioned space answers as the unpartitioned one wherever the answer is defined (which entry
a wildcard take gets is not: partitions are not one arrival order).
"""

from __future__ import annotations

import dataclasses
import tempfile
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import outrig
from outrig._codec import encode_value
from outrig._routing import value_partition
from outrig.service.config import Limits, ServerConfig
from outrig.service.engine import SpaceSettings
from outrig.service.engine.partitions import ID_STRIDE, partition_of, partition_of_id
from outrig.service.exceptions import ConfigError
from outrig.service.protocol import codec
from outrig.testing import LocalServer
from outrig.v1 import space_pb2 as pb
from outrig.v1.space_pb2_grpc import SpaceStub

REGIONS = ["eu", "us", "ap", "sa", "af"]
PARTITIONED = ServerConfig(spaces={"jobs": SpaceSettings(partition_by="region", partitions=3)})


@dataclass
class Job(outrig.Entry, type_name="parts.Job"):
    region: str | None = None
    n: int | None = None


def _key(job: Any) -> tuple[str | None, int | None]:
    return (job.region, job.n)


@pytest.fixture(scope="module", params=["plain", "partitioned"])
def served(request: pytest.FixtureRequest) -> Iterator[outrig.Space]:
    config = PARTITIONED if request.param == "partitioned" else ServerConfig()
    with LocalServer(config) as server, outrig.connect(server.address, space="jobs") as space:
        yield space


regions = st.sampled_from(REGIONS)
numbers = st.integers(0, 4)
maybe_region = st.none() | regions
maybe_number = st.none() | numbers
operations = st.lists(
    st.one_of(
        st.tuples(st.just("write"), regions, numbers),
        st.tuples(st.just("write_many"), st.lists(st.tuples(regions, numbers), min_size=1, max_size=6)),
        st.tuples(st.just("take"), maybe_region, maybe_number),
        st.tuples(st.just("take_many"), maybe_region, maybe_number, st.integers(1, 5)),
        st.tuples(st.just("take_top"), maybe_region),
        st.tuples(st.just("read"), maybe_region, maybe_number),
        st.tuples(st.just("count"), maybe_region, maybe_number),
        st.tuples(st.just("contents"), maybe_region, maybe_number),
    ),
    max_size=30,
)


def _matches(model: Counter[tuple[Any, Any]], region: str | None, n: int | None) -> list[tuple[Any, Any]]:
    return [
        key for key in model.elements() if (region is None or key[0] == region) and (n is None or key[1] == n)
    ]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=operations)
def test_a_partitioned_space_answers_as_the_model_allows(
    served: outrig.Space, ops: list[tuple[Any, ...]]
) -> None:
    space = served
    space.take_many(Job(), max_entries=10_000, timeout=0)
    model: Counter[tuple[Any, Any]] = Counter()
    for op in ops:
        kind = op[0]
        if kind == "write":
            space.write(Job(region=op[1], n=op[2]))
            model[(op[1], op[2])] += 1
        elif kind == "write_many":
            space.write_many([Job(region=region, n=n) for region, n in op[1]])
            model.update(op[1])
        elif kind in ("take", "read"):
            found = (space.take_nowait if kind == "take" else space.read_nowait)(Job(region=op[1], n=op[2]))
            candidates = _matches(model, op[1], op[2])
            if not candidates:
                assert found is None
                continue
            assert found is not None and _key(found) in candidates
            if kind == "take":
                model[_key(found)] -= 1
        elif kind == "take_many":
            taken = space.take_many(Job(region=op[1], n=op[2]), max_entries=op[3], timeout=0)
            available: Counter[tuple[Any, Any]] = Counter(_matches(model, op[1], op[2]))
            assert len(taken) == min(op[3], sum(available.values()))
            got: Counter[tuple[Any, Any]] = Counter(_key(job) for job in taken)
            assert not got - available  # every one taken was there to take
            model -= got
        elif kind == "take_top":
            found = space.take_nowait(Job(region=op[1]), order_by=[outrig.desc("n")])
            candidates = _matches(model, op[1], None)
            if not candidates:
                assert found is None
                continue
            assert found is not None and found.n == max(n for _, n in candidates)  # type: ignore[union-attr]
            model[_key(found)] -= 1
        elif kind == "count":
            assert space.count(Job(region=op[1], n=op[2])) == len(_matches(model, op[1], op[2]))
        else:
            contents = Counter(_key(job) for job in space.contents(Job(region=op[1], n=op[2])))
            assert contents == Counter(_matches(model, op[1], op[2]))
        model += Counter()  # drop zero counts
    assert space.count(Job()) == sum(model.values())


def test_a_partitioned_store_keeps_its_entries_and_ids_across_a_restart() -> None:
    with tempfile.TemporaryDirectory(prefix="outrig-partitions-") as data_dir:
        config = ServerConfig(
            data_dir=Path(data_dir),
            spaces={"jobs": SpaceSettings(partition_by="region", partitions=4)},
        )
        with LocalServer(config) as server, outrig.connect(server.address, space="jobs") as space:
            leases = [space.write(Job(region=REGIONS[i % 5], n=i), lease=600.0) for i in range(30)]
            with space.transaction(route="eu") as txn:
                txn.write(Job(region="eu", n=100))
            ids = {lease.id for lease in leases}
        for lease in leases:
            value = codec.field_value(encode_value(REGIONS[leases.index(lease) % 5]), "region", Limits())
            assert partition_of_id(lease.id) == partition_of(value, 4)  # an id names its partition
            assert lease.id >= ID_STRIDE
        with LocalServer(config) as server, outrig.connect(server.address, space="jobs") as space:
            assert space.count(Job()) == 31
            assert sorted(job.n for job in space.contents(Job(region="eu"))) == [0, 5, 10, 15, 20, 25, 100]  # type: ignore[union-attr]
            renewed = space.renew_many([_lease(space, lease_id) for lease_id in sorted(ids)], 900.0)
            assert all(result.error is None for result in renewed)
            more = [space.write(Job(region=REGIONS[i % 5], n=200 + i)) for i in range(10)]
            assert not {lease.id for lease in more} & ids


def _lease(space: outrig.Space, lease_id: int) -> outrig.Lease:
    """A Lease object for an id (what a client that kept only ids does)."""
    return outrig.Lease(space, pb.Lease(id=lease_id))


@given(value=st.one_of(st.integers(-(2**63), 2**63 - 1), st.text(), st.binary(), st.booleans(), st.floats()))
@settings(max_examples=300, deadline=None)
def test_the_sdk_hashes_a_routing_value_as_the_server_does(value: Any) -> None:
    message = encode_value(value)
    for partitions in (2, 3, 7, 1024):
        server = partition_of(codec.field_value(message, "v", Limits()), partitions)
        assert value_partition(message, partitions) == server


def test_a_store_written_with_other_partitions_is_refused_at_start() -> None:
    with tempfile.TemporaryDirectory(prefix="outrig-partitions-") as data_dir:
        four = ServerConfig(
            data_dir=Path(data_dir), spaces={"jobs": SpaceSettings(partition_by="region", partitions=4)}
        )
        with LocalServer(four) as server, outrig.connect(server.address, space="jobs") as space:
            for region in REGIONS * 3:
                space.write(Job(region=region, n=1))
        two = dataclasses.replace(four, spaces={"jobs": SpaceSettings(partition_by="region", partitions=2)})
        with pytest.raises(
            ConfigError, match=r"partition [23] of space 'jobs', which is now configured in 2"
        ):
            LocalServer(two).start()
        plain = dataclasses.replace(four, spaces={})
        with pytest.raises(ConfigError, match="now configured unpartitioned"):
            LocalServer(plain).start()
        with LocalServer(four) as server, outrig.connect(server.address, space="other") as other:
            assert other.with_space("jobs").count(Job()) == 15  # as it was written
            other.write(Job(n=1))
        now_partitioned = dataclasses.replace(
            four, spaces={**four.spaces, "other": SpaceSettings(partition_by="region", partitions=2)}
        )
        with pytest.raises(ConfigError, match="1 entries of space 'other' unpartitioned"):
            LocalServer(now_partitioned).start()


def test_a_fan_out_registration_is_not_resumed_a_partitions_own_is() -> None:
    with tempfile.TemporaryDirectory(prefix="outrig-partitions-") as data_dir:
        config = ServerConfig(
            data_dir=Path(data_dir), spaces={"jobs": SpaceSettings(partition_by="region", partitions=3)}
        )
        channel = None
        with LocalServer(config) as server:
            channel = grpc.insecure_channel(server.address)
            stub = SpaceStub(channel)
            every = stub.Notify(
                pb.NotifyRequest(space="jobs", templates=[pb.Template(type_name="parts.Job")])
            )
            one = stub.Notify(
                pb.NotifyRequest(
                    space="jobs",
                    templates=[pb.Template(type_name="parts.Job", fields={"region": encode_value("eu")})],
                )
            )
            spanning, own = next(every).registration.id, next(one).registration.id
        channel.close()  # the server stopped under the streams: it keeps the registrations for a resume
        with LocalServer(config) as server:
            channel = grpc.insecure_channel(server.address)
            stub = SpaceStub(channel)
            with pytest.raises(grpc.RpcError) as refused:
                next(stub.Notify(pb.NotifyRequest(space="jobs", resume=spanning)))
            assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert "register again" in (refused.value.details() or "")
            resumed = stub.Notify(pb.NotifyRequest(space="jobs", resume=own))
            assert next(resumed).registration.id == own
            with outrig.connect(server.address, space="jobs") as space:
                space.write(Job(region="eu", n=1))
            assert next(resumed).entry.fields["n"].int_value == 1
            channel.close()


def test_a_seen_routing_value_keeps_its_partition() -> None:
    # The SDK remembers values it hashed: 0.0 and -0.0 are equal keys but not equal routing values.
    for value in (0.0, -0.0, 0.0, 1, True, 1, "a", b"a"):
        message = encode_value(value)
        assert value_partition(message, 7) == partition_of(codec.field_value(message, "v", Limits()), 7)


@pytest.mark.parametrize("mux", [True, False], ids=["mux", "unary"])
def test_a_write_naming_a_partition_is_served_there_only_if_it_routes_there(mux: bool) -> None:
    # The SDK names the partition it routed a write to; the server checks it, every time.
    with LocalServer(PARTITIONED) as server:
        k = value_partition(encode_value("eu"), 3)
        assert k is not None
        elsewhere = next(r for r in REGIONS if value_partition(encode_value(r), 3) != k)
        right, wrong = f"jobs~{k}", f"jobs~{(k + 1) % 3}"
        named = outrig.connect(server.address, space=right, mux=mux, direct=False)
        misnamed = outrig.connect(server.address, space=wrong, mux=mux, direct=False)
        with named, misnamed:
            for n in range(2):
                named.write(Job(region="eu", n=n))
                with pytest.raises(outrig.InvalidArgumentError, match="entry: routes to another partition"):
                    misnamed.write(Job(region="eu"))
            with pytest.raises(outrig.InvalidArgumentError, match=r"entries\[1\]: routes to another"):
                named.write_many([Job(region="eu", n=5), Job(region=elsewhere)])
            with pytest.raises(outrig.RoutingValueError, match=r"entry\.fields\['region'\]"):
                named.write(Job(n=7))
        with outrig.connect(server.address, space="jobs") as space:
            assert sorted(job.n for job in space.contents(Job())) == [0, 1]  # type: ignore[union-attr]
