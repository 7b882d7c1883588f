"""EntryIndex on its own: how entries are filed by type and by (type, field, value), the bucket a
template starts from, the space's order, and putting an entry back at its place."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import pytest
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from outrig.service.engine import StoredEntry
from outrig.service.engine.index import EntryIndex, _reorder
from outrig.service.engine.model import NewEntry, Template
from outrig.service.engine.values import FULL_KEY_LIMIT, FieldValue

from .test_space import DOG, MAMMAL, ids, new, tpl


def filed(index: EntryIndex, entry_id: int, *lineage: str, **fields: Any) -> StoredEntry:
    type_name, *supertypes = lineage
    stored = StoredEntry(entry_id, new(type_name, *supertypes, **fields), None)
    index.insert(stored)
    return stored


def test_an_entry_is_filed_under_every_type_of_its_lineage_and_every_field() -> None:
    index = EntryIndex()
    dog = filed(index, 1, *DOG, name="rex", legs=4)
    assert index.type_counts() == {"Dog": 1, "Mammal": 1, "Animal": 1}
    for type_name in DOG:
        assert ids(index.candidates([tpl(type_name)])) == [dog.id]
        assert ids(index.candidates([tpl(type_name, legs=4)])) == [dog.id]
    index.remove(dog)
    assert index.type_counts() == {}
    assert index.field_slots() == []  # a (type, field)'s emptied slots are kept, holding none


def test_a_slot_of_one_entry_holds_it_bare_and_a_container_only_for_more() -> None:
    index = EntryIndex()
    first, second = filed(index, 1, "A", k=1), filed(index, 2, "A", k=1)
    key = first.fields["k"].key
    assert index._by_field["A"]["k"][key] == OrderedDict(((1, first), (2, second)))
    index.remove(first)
    assert index._by_field["A"]["k"][key] is second
    assert index.slot_buckets() == [(("A", "k", key), second)]
    index.remove(second)
    assert index._by_field == {"A": {"k": {}}} and index.field_slots() == []


def test_a_template_starts_from_its_smallest_bucket_or_none() -> None:
    index = EntryIndex()
    for i in range(5):
        filed(index, i + 1, "A", job="j", k=i)
    bucket = index.bucket(tpl("A", job="j", k=3))
    assert isinstance(bucket, StoredEntry) and bucket.id == 4
    assert index.bucket(tpl("A", job="j", k=99)) is None  # a field nobody has: nothing can match
    assert index.bucket(tpl("B")) is None


def test_members_and_merges_follow_the_space_order() -> None:
    for fifo in (True, False):
        index = EntryIndex(fifo)
        entries = [filed(index, i + 1, *MAMMAL, k=i % 2) for i in range(4)]
        oldest_first = [e.id for e in entries]
        expected = oldest_first if fifo else oldest_first[::-1]
        assert ids(index.candidates([tpl("Animal")])) == expected
        # Two buckets that overlap: each entry once, in the space's order.
        assert ids(index.candidates([tpl("Mammal", k=0), tpl("Animal")])) == expected


def test_reorder_puts_an_entry_filed_again_back_at_its_place() -> None:
    index = EntryIndex()
    entries = [filed(index, i + 1, "A", k=1) for i in range(3)]
    index.remove(entries[0])
    index.insert(entries[0])
    assert ids(index.candidates([tpl("A")])) == [2, 3, 1]
    index.reorder(entries[0])
    assert ids(index.candidates([tpl("A")])) == [1, 2, 3]
    assert ids(index.candidates([tpl("A", k=1)])) == [1, 2, 3]


def test_exact_count_only_where_the_bucket_is_the_answer() -> None:
    index = EntryIndex()
    long = b"x" * (FULL_KEY_LIMIT + 1)
    for i in range(3):
        filed(index, i + 1, "A", k=i % 2, blob=long)
    assert index.exact_count(tpl("A")) == 3
    assert index.exact_count(tpl("A", k=0)) == 2
    assert index.exact_count(tpl("A", k=5)) == 0
    assert index.exact_count(tpl("A", k=0, blob=long)) is None  # two fields: the bucket is a bound
    assert index.exact_count(tpl("A", blob=long)) is None  # a long value is keyed by its ends only


@given(
    st.lists(st.integers(0, 10_000), unique=True, max_size=40),
    st.integers(0, 10_000),
)
def test_reorder_puts_an_appended_entry_in_its_arrival_place(arrivals: list[int], arrival: int) -> None:
    assume(arrival not in arrivals)
    entries = [_arrived(a) for a in sorted(arrivals)]
    moved = _arrived(arrival)
    bucket = OrderedDict((e.id, e) for e in [*entries, moved])
    _reorder(bucket, moved)
    assert [e.arrival for e in bucket.values()] == sorted([*arrivals, arrival])


def _arrived(arrival: int) -> StoredEntry:
    """An entry whose arrival is `arrival` (its id too: ids are unique where arrivals are)."""
    stored = StoredEntry(arrival + 1, new("T"), None)
    stored.arrival = arrival
    return stored


def test_a_declared_ordered_index_exists_from_the_start_and_files_every_write() -> None:
    declared = EntryIndex(indexes=[("Mammal", "legs")])
    assert declared.ordered_indexes() == [("Mammal", "legs", 0)]  # before any template needs it
    for i, legs in enumerate([4, 2, 4]):
        filed(declared, i + 1, *DOG, legs=legs)
    filed(declared, 9, *DOG, name="no legs")  # no value: not filed under the field
    assert declared.ordered_indexes() == [("Mammal", "legs", 3)]
    undeclared = EntryIndex()
    filed(undeclared, 1, *DOG, legs=4)
    assert undeclared.ordered_indexes() == []  # made on first need only
    undeclared.ordered("Mammal", "legs")
    assert undeclared.ordered_indexes() == [("Mammal", "legs", 1)]


class _Unhashable:
    """A value whose index key cannot be hashed: filing an entry that has it fails midway."""

    def __hash__(self) -> int:
        raise RuntimeError("no hash")


def _state(index: EntryIndex) -> tuple[object, ...]:
    """What is filed where, in order, and how (bare or in a container)."""
    return (
        {t: list(bucket) for t, bucket in index._by_type.items()},
        {
            slot: current.id if isinstance(current, StoredEntry) else list(current)
            for slot, current in index.slot_buckets()
        },
        index.ordered_indexes(),
    )


def _sharing(shared: bool, entries: list[StoredEntry]) -> list[StoredEntry]:
    """`entries`, whose equal values are made one object if `shared` (as the codec's one-pass
    reading makes a batch's: `insert_many` and `remove_many` then remember their buckets)."""
    if shared:
        values: dict[object, FieldValue] = {}
        for stored in entries:
            stored.fields = {name: values.setdefault(v.key, v) for name, v in stored.fields.items()}
    return entries


@pytest.mark.parametrize("shared", [False, True])
def test_a_field_with_no_slot_left_keeps_its_empty_slots(shared: bool) -> None:
    """The slots are kept by type, then field, then value key: a field whose last slot goes keeps
    its (empty) slots, by `remove_many` (whichever way it remembers) as by `remove`, so that a
    space emptied by each take does not make them again for each write; nothing lists them."""
    index = EntryIndex()
    kept = filed(index, 1, "A", k=1)
    batch = _sharing(shared, [StoredEntry(i, new("A", "B", k=1, u=i, s="x"), None) for i in range(2, 6)])
    index.insert_many(batch)
    assert sorted(index._by_field) == ["A", "B"]
    assert sorted(index._by_field["A"]) == ["k", "s", "u"]
    assert len(index.field_slots()) == 2 * (1 + 4 + 1)
    index.remove_many(batch)
    emptied = {"A": {"k": {kept.fields["k"].key: kept}, "s": {}, "u": {}}, "B": {"k": {}, "s": {}, "u": {}}}
    assert index._by_field == emptied
    assert index.field_slots() == [("A", "k", kept.fields["k"].key)]
    index.insert_many(batch)
    for stored in batch:
        index.remove(stored)
    assert index._by_field == emptied
    index.remove(kept)
    assert index.field_slots() == [] and index.slot_buckets() == []


@pytest.mark.parametrize("shared", [False, True])
def test_a_batch_that_fails_midway_is_filed_not_at_all(shared: bool) -> None:
    index = EntryIndex(indexes=[("Mammal", "legs")])
    filed(index, 1, *DOG, legs=4, name="rex")
    filed(index, 2, *DOG, legs=2)
    before = _state(index)
    batch = [StoredEntry(3 + i, new(*DOG, legs=4, name="rex", n=i), None) for i in range(3)]
    bad = StoredEntry(9, new(*DOG, legs=4), None)
    batch = _sharing(shared, [*batch, bad])[:3]
    bad.fields = {**bad.fields, "odd": FieldValue("int", _Unhashable())}  # type: ignore[arg-type]
    try:
        index.insert_many([*batch, bad])
    except RuntimeError:
        pass
    else:
        raise AssertionError("insert_many filed an entry whose key cannot be hashed")
    assert _state(index) == before
    index.insert_many(batch)  # and a batch that files, files all of it, in order
    assert ids(index.candidates([tpl("Mammal", legs=4)])) == [1, 3, 4, 5]


@pytest.mark.parametrize("shared", [False, True])
def test_a_batch_that_fails_to_unfile_midway_is_filed_again_in_order(shared: bool) -> None:
    index = EntryIndex()
    made = [StoredEntry(i, new(*DOG, legs=4, n=i), None) for i in range(1, 6)]
    stranger = StoredEntry(99, new(*DOG, legs=4), None)  # never filed: unfiling it fails
    entries = _sharing(shared, [*made, stranger])[:5]
    index.insert_many(entries)
    before = _state(index)
    try:
        index.remove_many([entries[1], entries[3], stranger])
    except KeyError:
        pass
    else:
        raise AssertionError("remove_many unfiled an entry that was not filed")
    assert _state(index) == before
    index.remove_many([entries[1], entries[3]])
    assert ids(index.candidates([tpl("Dog")])) == [1, 3, 5]


# Values that differ only where a large value's key does not look (the middle of a long string),
# small ones that a key tells apart (1, True, "1"), and null (a template's wildcard).
_LONG = "a" * FULL_KEY_LIMIT
_VALUES = st.sampled_from(
    [
        FieldValue("int", 1),
        FieldValue("bool", True),
        FieldValue("string", "1"),
        FieldValue("string", _LONG + "x" + _LONG),
        FieldValue("string", _LONG + "y" + _LONG),
        FieldValue("bytes", memoryview((_LONG + "x" + _LONG).encode())),
        FieldValue("bytes", (_LONG + "x" + _LONG).encode()),
        FieldValue("null", None),
    ]
)
_LINEAGES = st.sampled_from([("Dog", "Mammal"), ("Cat", "Mammal"), ("Mammal",), ("Other",)])
_FIELDS = st.dictionaries(st.sampled_from(["a", "b"]), _VALUES, max_size=2)


@settings(max_examples=300)
@given(
    st.lists(st.tuples(_LINEAGES, _FIELDS), max_size=12),
    st.sampled_from(["Dog", "Mammal", "Other", "Cow"]),
    _FIELDS,
)
@example(  # a long value's bucket holds another long value of the same key
    [(("Dog",), {"a": FieldValue("string", _LONG + "y" + _LONG)})],
    "Dog",
    {"a": FieldValue("string", _LONG + "x" + _LONG)},
)
def test_a_bucket_s_entries_checked_for_what_it_does_not_say_match_as_in_full(
    entries: list[tuple[tuple[str, ...], dict[str, FieldValue]]],
    type_name: str,
    fields: dict[str, FieldValue],
) -> None:
    """The equality fast path (`bucket_of`, `Template.unfiled`, `matches_filed`) finds what
    `matches` finds among all the entries, each of them, in the same order."""
    index = EntryIndex()
    stored = []
    for i, (lineage, values) in enumerate(entries):
        stored.append(StoredEntry(i + 1, NewEntry(lineage[0], lineage[1:], values, None, 1), None))
        index.insert(stored[-1])
    template = Template(type_name, fields)
    expected = [entry for entry in stored if template.matches(entry)]
    found = index.bucket_of(template)
    if found is None:
        assert expected == []
        return
    bucket, field = found
    assert bucket is index.bucket(template)
    unfiled = template.unfiled(field)
    assert template.unfiled(field) is unfiled  # kept for the template's next call
    assert [entry for entry in index.members(bucket) if template.matches_filed(entry, unfiled)] == expected


# A batch's values: the same objects again (as the codec's one-pass reading shares a batch's equal
# values) and equal ones that are other objects (each a slot's value too), of kinds a key tells
# apart and long ones whose keys are equal.
_SHARED = [FieldValue("int", 1), FieldValue("int", 1), FieldValue("int", 2), FieldValue("bool", True)]
_SHARED += [FieldValue("string", _LONG + "x" + _LONG), FieldValue("string", _LONG + "y" + _LONG)]
_BATCH_FIELDS = st.dictionaries(st.sampled_from(["a", "b", "c"]), st.sampled_from(_SHARED), max_size=3)
_BATCH = st.lists(st.tuples(_LINEAGES, _BATCH_FIELDS), max_size=10)


def _layout(index: EntryIndex) -> tuple[object, ...]:
    """`_state`, with the order of the slots and types themselves."""
    return (
        [(t, list(bucket)) for t, bucket in index._by_type.items()],
        [
            (slot, current.id if isinstance(current, StoredEntry) else list(current))
            for slot, current in index.slot_buckets()
        ],
        index.ordered_indexes(),
    )


@settings(max_examples=300)
@given(_BATCH, _BATCH, st.lists(st.integers(0, 19), unique=True), st.booleans(), st.booleans())
@example(  # three of one value object: a bare slot made a container, then emptied by the take
    [],
    [(("Dog", "Mammal"), {"a": _SHARED[0]})] * 3,
    [0, 1, 2],
    True,
    False,
)
@example(  # the batch's first entry joins a bare slot; a taken pair of one value shared
    [(("Dog", "Mammal"), {"a": _SHARED[0]})],
    [(("Dog", "Mammal"), {"a": _SHARED[0]}), (("Dog", "Mammal"), {"a": _SHARED[1]})],
    [1, 2],
    True,
    False,
)
def test_a_batch_is_filed_and_unfiled_as_one_entry_after_the_other(
    before: list[tuple[tuple[str, ...], dict[str, FieldValue]]],
    batch: list[tuple[tuple[str, ...], dict[str, FieldValue]]],
    picked: list[int],
    in_order: bool,
    ordered: bool,
) -> None:
    """`insert_many` and `remove_many` leave the index as `insert` and `remove` of each entry in
    turn: the same buckets, holding the same entries in the same order, the same slots in the
    same order, and the same candidates for every template."""
    indexes = [("Mammal", "a")] if ordered else []
    each, batched = EntryIndex(indexes=indexes), EntryIndex(indexes=indexes)
    entries = [
        StoredEntry(i + 1, NewEntry(lineage[0], lineage[1:], values, None, 1), None)
        for i, (lineage, values) in enumerate([*before, *batch])
    ]
    old, new = entries[: len(before)], entries[len(before) :]
    for stored in old:
        each.insert(stored)
        batched.insert(stored)
    for stored in new:
        each.insert(stored)
    batched.insert_many(new)
    assert _layout(batched) == _layout(each)
    templates = [tpl(t) for t in ("Dog", "Mammal", "Cat", "Other")]
    templates += [Template("Mammal", {"a": value}) for value in _SHARED]
    templates += [Template("Dog", {"a": _SHARED[0], "b": _SHARED[2]})]
    for template in templates:
        assert ids(batched.candidates([template])) == ids(each.candidates([template]))
    # A take's batch: some of the entries (of either write), in arrival order or not.
    taken = [entries[i] for i in picked if i < len(entries)]
    if in_order:
        taken.sort(key=_arrival_of)
    for stored in taken:
        each.remove(stored)
    batched.remove_many(taken)
    assert _layout(batched) == _layout(each)
    for template in templates:
        assert ids(batched.candidates([template])) == ids(each.candidates([template]))


def _arrival_of(stored: StoredEntry) -> int:
    return stored.arrival
