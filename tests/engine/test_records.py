"""The engine's per-entry records (`Record`: NewEntry, LeaseGrant, Change) compare, hash and show
as the frozen dataclasses they were."""

from __future__ import annotations

import pytest

from outrig.service.engine import StoredEntry
from outrig.service.engine.changes import Change
from outrig.service.engine.model import LeaseGrant, NewEntry
from outrig.service.engine.values import FieldValue


def test_records_are_equal_by_their_attributes_and_class() -> None:
    assert LeaseGrant(7, 10.0, 5.0) == LeaseGrant(7, 10.0, 5.0)
    assert LeaseGrant(7, 10.0, 5.0) != LeaseGrant(7, 10.0, None)
    assert LeaseGrant(7, None, None) != (7, None, None)  # not a tuple
    assert hash(LeaseGrant(7, 10.0, 5.0)) == hash(LeaseGrant(7, 10.0, 5.0))
    assert repr(LeaseGrant(7, None, 5.0)) == "LeaseGrant(id=7, expires_at=None, granted=5.0)"
    fields = {"k": FieldValue("int", 1)}
    assert NewEntry("T", (), fields, b"x", 1) == NewEntry("T", (), dict(fields), b"x", 1)
    with pytest.raises(TypeError):
        hash(NewEntry("T", (), fields, b"x", 1))  # its fields are a dict, as before
    stored = StoredEntry(1, NewEntry("T", (), fields, b"x", 1), None)
    change = Change(1, "write", stored, 2.0)
    assert change == Change(1, "write", stored, 2.0, 0, None)
    assert change != Change(2, "write", stored, 2.0)
    assert (change.transaction, change.visible_at, change.size) == (0, None, 1 + 64)


def test_records_have_no_attribute_beyond_their_own() -> None:
    grant = LeaseGrant(7, None, None)
    with pytest.raises(AttributeError):
        grant.other = 1  # type: ignore[attr-defined]
