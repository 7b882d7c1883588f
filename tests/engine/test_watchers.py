"""WatcherIndex: watchers filed by template, found by the entries that could wake them."""

from __future__ import annotations

from dataclasses import dataclass

from outrig.service.engine.matchers import All, Matcher, NotEqual, Prefix, Presence, Range
from outrig.service.engine.model import NewEntry, StoredEntry, Template, make_template
from outrig.service.engine.values import FieldValue
from outrig.service.engine.watchers import WatcherIndex


@dataclass(frozen=True)
class W:
    seq: int
    templates: tuple[Template, ...]


def entry(type_name: str, supertypes: tuple[str, ...] = (), **fields: int | str) -> StoredEntry:
    values = {
        name: FieldValue("int", v) if isinstance(v, int) else FieldValue("string", v)
        for name, v in fields.items()
    }
    return StoredEntry(1, NewEntry(type_name, supertypes, values, None, 1), None)


def template(type_name: str, **fields: int | str) -> Template:
    return Template(
        type_name,
        {
            name: FieldValue("int", v) if isinstance(v, int) else FieldValue("string", v)
            for name, v in fields.items()
        },
    )


def seqs(watchers: list[W]) -> list[int]:
    return [watcher.seq for watcher in watchers]


def test_empty_index_has_no_candidates() -> None:
    index: WatcherIndex[W] = WatcherIndex()
    assert len(index) == 0
    assert index.candidates(entry("A", k=1)) == []
    assert list(index.all()) == []


def test_wildcard_template_is_found_by_any_entry_of_its_type() -> None:
    index: WatcherIndex[W] = WatcherIndex()
    index.add(W(1, (template("A"),)))
    assert seqs(index.candidates(entry("A"))) == [1]
    assert seqs(index.candidates(entry("A", k=5))) == [1]
    assert index.candidates(entry("B", k=5)) == []


def test_candidates_found_through_the_entry_lineage() -> None:
    index: WatcherIndex[W] = WatcherIndex()
    index.add(W(1, (template("Base"),)))
    index.add(W(2, (template("Mid", k=1),)))
    index.add(W(3, (template("Leaf"),)))
    index.add(W(4, (template("Other"),)))
    leaf = entry("Leaf", ("Mid", "Base"), k=1)
    assert seqs(index.candidates(leaf)) == [1, 2, 3]
    # A Mid entry is not a Leaf: the Leaf watcher is not a candidate.
    assert seqs(index.candidates(entry("Mid", ("Base",), k=1))) == [1, 2]


def test_candidates_found_by_the_first_set_field() -> None:
    index: WatcherIndex[W] = WatcherIndex()
    index.add(W(1, (template("A", a=1, b=2),)))  # filed under its first field, a=1
    index.add(W(2, (template("A", a=2),)))
    index.add(W(3, (template("A", b=2),)))
    assert seqs(index.candidates(entry("A", a=1, b=9))) == [1]  # a candidate, not yet a match
    assert seqs(index.candidates(entry("A", a=2, b=2))) == [2, 3]
    assert index.candidates(entry("A", a=3)) == []
    assert index.candidates(entry("A", c=1)) == []


def test_the_first_field_is_by_name_not_by_insertion_order() -> None:
    index: WatcherIndex[W] = WatcherIndex()
    index.add(W(1, (Template("A", {"z": FieldValue("int", 1), "b": FieldValue("int", 2)}),)))
    assert seqs(index.candidates(entry("A", b=2, z=0))) == [1]
    assert index.candidates(entry("A", b=0, z=1)) == []


def test_value_kind_is_part_of_the_slot() -> None:
    index: WatcherIndex[W] = WatcherIndex()
    index.add(W(1, (Template("A", {"k": FieldValue("int", 1)}),)))
    one_as_bool = StoredEntry(1, NewEntry("A", (), {"k": FieldValue("bool", True)}, None, 1), None)
    assert index.candidates(one_as_bool) == []


def test_candidates_come_in_the_order_watchers_were_added() -> None:
    index: WatcherIndex[W] = WatcherIndex()
    for seq in (5, 3, 9, 1):
        index.add(W(seq, (template("A", k=seq % 2),)))
    index.add(W(7, (template("A"),)))
    assert seqs(index.candidates(entry("A", k=1))) == [1, 3, 5, 7, 9]


def test_a_watcher_with_several_templates_is_returned_once() -> None:
    index: WatcherIndex[W] = WatcherIndex()
    watcher = W(1, (template("A", k=1), template("A"), template("B")))
    index.add(watcher)
    assert len(index) == 1
    assert seqs(index.candidates(entry("A", k=1))) == [1]
    assert seqs(index.candidates(entry("B"))) == [1]
    index.remove(watcher)
    assert len(index) == 0
    assert index.candidates(entry("A", k=1)) == []
    assert index.candidates(entry("B")) == []


def test_two_templates_of_one_watcher_in_the_same_slot() -> None:
    index: WatcherIndex[W] = WatcherIndex()
    watcher = W(1, (template("A", k=1, x=1), template("A", k=1, x=2)))
    other = W(2, (template("A", k=1),))
    index.add(watcher)
    index.add(other)
    assert len(index) == 2
    assert seqs(index.candidates(entry("A", k=1, x=2))) == [1, 2]
    index.remove(watcher)
    assert len(index) == 1
    assert seqs(index.candidates(entry("A", k=1))) == [2]
    index.remove(other)
    assert len(index) == 0
    assert index.candidates(entry("A", k=1)) == []


def test_removal_is_idempotent() -> None:
    index: WatcherIndex[W] = WatcherIndex()
    kept = W(1, (template("A"),))
    gone = W(2, (template("A", k=1), template("B")))
    index.add(kept)
    index.add(gone)
    index.remove(gone)
    index.remove(gone)
    index.remove(W(3, (template("C"),)))  # never added
    assert len(index) == 1
    assert seqs(index.candidates(entry("A", k=1))) == [1]
    assert index.candidates(entry("B")) == []
    # Type counts survived the double removal: a later watcher on B is still found.
    index.add(W(4, (template("B"),)))
    assert seqs(index.candidates(entry("B"))) == [4]


def test_type_counts_track_removals() -> None:
    index: WatcherIndex[W] = WatcherIndex()
    a1, a2 = W(1, (template("A", k=1),)), W(2, (template("A", k=2),))
    index.add(a1)
    index.add(a2)
    index.remove(a1)
    assert seqs(index.candidates(entry("A", k=2))) == [2]
    index.remove(a2)
    assert index.candidates(entry("A", k=2)) == []


def test_all_lists_each_watcher_once() -> None:
    index: WatcherIndex[W] = WatcherIndex()
    index.add(W(1, (template("A"), template("B"))))
    index.add(W(2, (template("A", k=1),)))
    assert sorted(w.seq for w in index.all()) == [1, 2]


# ---------------------------------------------------------------- matchers: what a write looks at


def _parked(index: WatcherIndex[W], matchers: dict[str, Matcher], seq: int, type_name: str = "Job") -> W:
    watcher = W(seq, (make_template(type_name, {}, matchers),))
    index.add(watcher)
    return watcher


def _int(n: int) -> FieldValue:
    return FieldValue("int", n)


def test_a_write_looks_only_at_the_waiters_it_matches_among_thousands() -> None:
    """5,000 parked waiters of every kind a write of priority 50, region "eu" cannot wake (ranges
    beside it, around it nested and not, on either side, of another kind; Not(50); Missing
    region; Present on a field it lacks; a prefix it does not start with), and a few it can:
    the write looks at exactly those few. Counted, not timed."""
    index: WatcherIndex[W] = WatcherIndex()
    seq = iter(range(1, 10**6))
    for i in range(500):
        _parked(index, {"priority": Range("int", 100 + 3 * i, True, 101 + 3 * i, True)}, next(seq))  # beside
        _parked(index, {"priority": Range("int", 60 + i, True, 2_000 + i, False)}, next(seq))  # nested above
        _parked(index, {"priority": Range("int", -i, True, 49, True)}, next(seq))  # nested below
        _parked(index, {"priority": Range("int", 51 + i, True, None, False)}, next(seq))  # GE above
        _parked(index, {"priority": Range("int", None, False, 50 - i, False)}, next(seq))  # LT below
        _parked(index, {"priority": Range("double", -1e9, True, 1e9, True)}, next(seq))  # another kind
        _parked(index, {"priority": NotEqual(_int(50))}, next(seq))
        _parked(index, {"region": Presence(False)}, next(seq))  # Missing
        _parked(index, {"zone": Presence(True)}, next(seq))  # Present, on a field it lacks
        _parked(index, {"region": Prefix("string", f"us-{i}")}, next(seq))
    wakes = [
        _parked(index, {"priority": Range("int", 50, True, 51, False)}, next(seq)),
        _parked(index, {"priority": Range("int", -5, False, 500, True)}, next(seq)),
        _parked(index, {"priority": Range("int", 50, True, None, False)}, next(seq)),
        _parked(index, {"priority": Range("int", None, False, 50, True)}, next(seq)),
        _parked(index, {"priority": NotEqual(_int(49))}, next(seq)),
        _parked(index, {"zone": Presence(False)}, next(seq)),
        _parked(index, {"region": Presence(True)}, next(seq)),
        _parked(index, {"region": Prefix("string", "e")}, next(seq)),
        _parked(index, {"zone": NotEqual(_int(1))}, next(seq)),  # absent: not equal to 1
        _parked(index, {}, next(seq)),
    ]
    assert len(index) == 5_010
    written = StoredEntry(
        1, NewEntry("Job", (), {"priority": _int(50), "region": FieldValue("string", "eu")}, None, 1), None
    )
    looked_at = index.candidates(written)
    assert seqs(looked_at) == seqs(wakes)
    assert all(watcher.templates[0].matches(written) for watcher in looked_at)
    # A write of another type looks at none of them.
    other = StoredEntry(2, NewEntry("Other", (), {"priority": _int(50)}, None, 1), None)
    assert index.candidates(other) == []


def test_present_missing_and_not_are_looked_at_only_by_writes_they_match() -> None:
    index: WatcherIndex[W] = WatcherIndex()
    present = _parked(index, {"k": Presence(True)}, 1)
    missing = _parked(index, {"k": Presence(False)}, 2)
    not_one = _parked(index, {"k": NotEqual(_int(1))}, 3)
    not_two = _parked(index, {"k": NotEqual(_int(2))}, 4)
    both = _parked(index, {"k": All([Presence(True), NotEqual(_int(1))])}, 5)  # filed by Present
    assert seqs(index.candidates(entry("Job", k=1))) == [1, 4, 5]
    assert seqs(index.candidates(entry("Job", k=2))) == [1, 3, 5]
    assert seqs(index.candidates(entry("Job"))) == [2, 3, 4]
    null = StoredEntry(1, NewEntry("Job", (), {"k": FieldValue("null", None)}, None, 1), None)
    assert seqs(index.candidates(null)) == [2, 3, 4]  # null: missing, and equal to neither
    for watcher in (present, missing, not_one, not_two, both):
        index.remove(watcher)
    assert len(index) == 0 and not list(index.all())
    assert index.candidates(entry("Job", k=1)) == [] and index._types == {}


def test_the_same_range_in_two_templates_is_filed_once_and_unfiled_once() -> None:
    index: WatcherIndex[W] = WatcherIndex()
    between = make_template("Job", {}, {"p": Range("int", 1, True, 5, True)})
    above = make_template("Job", {}, {"p": Range("int", 1, True, None, False)})
    twice = W(1, (between, between, above, above))
    other = W(2, (between, make_template("Job", {}, {"p": Range("int", 2, True, 3, True)})))
    index.add(twice)
    index.add(other)
    assert seqs(index.candidates(entry("Job", p=2))) == [1, 2]
    assert seqs(index.candidates(entry("Job", p=9))) == [1]
    index.remove(twice)
    assert seqs(index.candidates(entry("Job", p=2))) == [2]
    index.remove(other)
    assert len(index) == 0 and index._types == {}
