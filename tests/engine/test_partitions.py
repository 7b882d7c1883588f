"""engine/partitions.py: partition names, the id classes, and a partition's engine numbering in its class."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from outrig.service.engine import FakeClock, NewEntry, SpaceEngine, SpaceSettings
from outrig.service.engine.partitions import (
    ID_STRIDE,
    IdClass,
    ids_of,
    partition_name,
    partition_of,
    partition_of_id,
    split_name,
)
from outrig.service.engine.values import FieldValue


def test_names() -> None:
    assert partition_name("jobs", 3) == "jobs~3"
    assert split_name("jobs~3") == ("jobs", 3)
    assert split_name("jobs") == ("jobs", None)
    assert split_name("a~b") == ("a~b", None)
    assert ids_of("jobs") == IdClass()
    assert ids_of("jobs~5") == IdClass(ID_STRIDE, 5)


@given(offset=st.integers(0, ID_STRIDE - 1), value=st.integers(0, 10**12))
def test_at_least_is_the_smallest_id_of_the_class_not_below(offset: int, value: int) -> None:
    ids = IdClass(ID_STRIDE, offset)
    found = ids.at_least(value)
    assert found >= value and found % ID_STRIDE == offset and found - ID_STRIDE < value
    assert ids.first() >= ID_STRIDE and partition_of_id(ids.first()) == offset


def test_a_partitions_engine_numbers_its_ids_in_its_class() -> None:
    engine = SpaceEngine("jobs~7", SpaceSettings(), FakeClock(0.0))
    entry = NewEntry("T", (), {"n": FieldValue("int", 1)}, b"\x0a\x00", 2)
    grants = engine.write([entry, entry, entry], 60.0)
    assert [grant.id % ID_STRIDE for grant in grants] == [7, 7, 7]
    assert [b.id - a.id for a, b in itertools.pairwise(grants)] == [ID_STRIDE, ID_STRIDE]
    txn, grant = engine.begin(60.0)
    assert partition_of_id(txn.id) == 7 and grant.id == txn.id
    engine.resume_ids(10**6 + 1)
    assert partition_of_id(engine.next_id) == 7 and engine.next_id >= 10**6 + 1
    plain = SpaceEngine("jobs", SpaceSettings(), FakeClock(0.0))
    assert [g.id for g in plain.write([entry, entry], 60.0)] == [1, 2]


def test_the_hash_spreads_values_over_the_partitions() -> None:
    counts = [0] * 4
    for i in range(4000):
        counts[partition_of(FieldValue("string", f"customer-{i}"), 4)] += 1
    assert all(800 < count < 1200 for count in counts)
    assert partition_of(FieldValue("int", 1), 4) == partition_of(FieldValue("int", 1), 4)
    assert partition_of(FieldValue("int", 5), 1) == 0
