"""A gone entry kept frozen (model.frozen_entry, thawed_entry): for entries of any fields (every
kind, small and large values, a large array's memoryview into its payload), the thawed entry has
the stored one's attributes, its fields compare, hash and key as the stored ones do, templates
match it as they match the stored one, and a frozen entry of untracked values is untracked by the
cyclic collector."""

from __future__ import annotations

import gc
import struct

from hypothesis import given, settings
from hypothesis import strategies as st

from outrig.service.engine.model import (
    NewEntry,
    StoredEntry,
    Template,
    frozen_entry,
    thawed_entry,
)
from outrig.service.engine.values import FULL_KEY_LIMIT, NULL, FieldValue

VALUES = st.one_of(
    st.just(NULL),
    st.booleans().map(lambda data: FieldValue("bool", data)),
    st.integers(-(2**63), 2**63 - 1).map(lambda data: FieldValue("int", data)),
    st.floats(allow_nan=True).map(lambda data: FieldValue("double", struct.pack("<d", data))),
    st.text(max_size=FULL_KEY_LIMIT + 40).map(lambda data: FieldValue("string", data)),
    st.binary(max_size=FULL_KEY_LIMIT + 40).map(lambda data: FieldValue("bytes", data)),
)
FIELDS = st.dictionaries(st.sampled_from("abcdef"), VALUES, max_size=5)


def _stored(fields: dict[str, FieldValue], array: int, number: int) -> StoredEntry:
    """An entry of `fields`, and of an "array:u1" field of `array` bytes viewing its payload."""
    payload = b"\x0a" + bytes(range(256)) * (1 + array // 256)
    if array:
        fields = {**fields, "z": FieldValue("array:u1", memoryview(payload)[1 : 1 + array])}
    return StoredEntry(number, NewEntry("Job", ("Task", "Base"), fields, payload, len(payload)), 1_000.5)


def _attributes(entry: StoredEntry) -> dict[str, object]:
    return {name: getattr(entry, name) for name in StoredEntry.__slots__ if name != "fields"}


@settings(max_examples=200, deadline=None)
@given(
    fields=FIELDS,
    array=st.sampled_from((0, 3, FULL_KEY_LIMIT + 5)),
    number=st.integers(1, 10**12),
    deliveries=st.integers(0, 5),
    hidden=st.none() | st.floats(0.0, 1e9),
    templates=st.lists(st.tuples(st.sampled_from(("Job", "Task", "Base", "Other")), FIELDS), max_size=4),
)
def test_a_thawed_entry_is_the_stored_one_again(
    fields: dict[str, FieldValue],
    array: int,
    number: int,
    deliveries: int,
    hidden: float | None,
    templates: list[tuple[str, dict[str, FieldValue]]],
) -> None:
    stored = _stored(fields, array, number)
    stored.deliveries, stored.hidden_until, stored.logged = deliveries, hidden, number + 1
    stored.arrival, stored.dead_letter_reason = number + 7, "max_deliveries=3"
    thawed = thawed_entry(frozen_entry(stored))
    assert thawed is not stored and thawed.__class__ is StoredEntry
    assert _attributes(thawed) == _attributes(stored)
    assert list(thawed.fields) == list(stored.fields)
    for name, value in stored.fields.items():
        again = thawed.fields[name]
        assert (again.kind, again.key, again.size) == (value.kind, value.key, value.size)
        assert again == value and hash(again) == hash(value) and again.data == value.data
        assert type(again.data) is type(value.data)
    for type_name, template_fields in templates:
        template = Template(type_name, template_fields)
        assert template.matches(thawed) == template.matches(stored)
        unfiled = template.unfiled(None)
        assert template.matches_filed(thawed, unfiled) == template.matches_filed(stored, unfiled)


def test_a_frozen_entry_of_atomic_values_is_untracked() -> None:
    fields = {"n": FieldValue("int", 5), "s": FieldValue("string", "x" * 300), "b": NULL}
    frozen = frozen_entry(_stored(fields, 0, 5))
    gc.collect()
    assert not gc.is_tracked(frozen)
    # a large array's memoryview into the payload is tracked: so is the frozen entry holding it
    viewing = frozen_entry(_stored(fields, FULL_KEY_LIMIT + 5, 6))
    gc.collect()
    assert gc.is_tracked(viewing)
