"""Matchers and order_by against a naive reference: a plain list of entries, scanned linearly.

The reference compares Python values directly (unpacking doubles, `startswith` for prefixes,
`functools.cmp_to_key` for the order), sharing nothing with the engine's sort keys, bounds or
indexes. Random entries of mixed kinds (1, 1.0 and true; -0.0, 0.0, infinities and NaN; unicode
strings that share prefixes; bytes), random templates with equality fields and matchers (ranges,
empty ones included, prefixes, sets, not, present, missing, all), random orders over one or two
fields. After every read, take, count and contents the engine's answer must be the reference's:
the same ids in the same order (ties in the space's order, FIFO or not).

The waiters get the same treatment: random parked templates, random writes, and every waiter
that matches must be among those the write looks at, and (for a template of one condition: a
range of either side or both, a prefix, a set, not, present, missing) no other.
"""

from __future__ import annotations

import functools
import math
import struct
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, rule

from outrig.service.engine import FakeClock, NewEntry, SpaceEngine, SpaceSettings, Template
from outrig.service.engine.matchers import All, Matcher, NotEqual, OneOf, Prefix, Presence, Range
from outrig.service.engine.model import StoredEntry, Templates, make_template
from outrig.service.engine.values import FieldValue
from outrig.service.engine.watchers import WatcherIndex

from .test_matching_property import lineages
from .test_space import contents, find

# Pure CPU work bounded by its examples (300 runs of up to 30 steps; about 40 s alone on these
# machines, nearly all of it hypothesis's drawing), so no hang to catch sooner: beside other tests
# on a loaded machine (pytest-xdist) it came within 25 s of the suite's 120 s timeout.
pytestmark = pytest.mark.timeout(300)


def _double(x: float) -> bytes:
    return struct.pack("<d", x)


VALUES: list[tuple[str, object]] = [
    ("int", -1),
    ("int", 0),
    ("int", 1),
    ("int", 2),
    ("int", 1 << 62),
    ("double", _double(1.0)),
    ("double", _double(0.0)),
    ("double", _double(-0.0)),
    ("double", _double(0.5)),
    ("double", _double(math.inf)),
    ("double", _double(-math.inf)),
    ("double", _double(math.nan)),
    ("bool", True),
    ("bool", False),
    ("string", ""),
    ("string", "a"),
    ("string", "ab"),
    ("string", "b"),
    ("string", "é"),
    ("string", "éa"),
    ("string", "\U0010ffff"),
    ("string", "\U0001f600x"),
    ("bytes", b""),
    ("bytes", b"a"),
    ("bytes", b"ab"),
    ("bytes", b"\xff"),
    ("bytes", b"\xff\x00"),
    ("list", b"\x0a\x02\x18\x02"),  # some canonical list encoding: a kind of no order
    ("null", None),
]
FIELDS = ["a", "b"]
N_TYPES = 3

# Bounds, by kind, as Python values (doubles as floats).
BOUNDS: dict[str, list[object]] = {
    "int": [-1, 0, 1, 2, 3],
    "double": [-math.inf, -0.0, 0.0, 0.5, 1.0, math.inf],
    "string": ["", "a", "ab", "b", "é", "\U0010ffff"],
    "bytes": [b"", b"a", b"b", b"\xff"],
    "bool": [False, True],
}
PREFIXES: dict[str, list[object]] = {
    "string": ["", "a", "é", "\U0010ffff", "\U0001f600", "ab"],
    "bytes": [b"", b"a", b"\xff"],
}


def field_value(index: int) -> FieldValue:
    kind, data = VALUES[index]
    return FieldValue(kind, data)  # type: ignore[arg-type]


value_st = st.integers(0, len(VALUES) - 1)
non_null_st = st.integers(0, len(VALUES) - 2)


@st.composite
def range_st(draw: st.DrawFn) -> tuple[object, ...]:
    kind = draw(st.sampled_from(sorted(BOUNDS)))
    pool = BOUNDS[kind]
    low = draw(st.none() | st.sampled_from(pool))
    high = draw(st.sampled_from(pool)) if low is None else draw(st.none() | st.sampled_from(pool))
    return ("range", kind, low, draw(st.booleans()), high, draw(st.booleans()))


@st.composite
def prefix_st(draw: st.DrawFn) -> tuple[object, ...]:
    kind = draw(st.sampled_from(sorted(PREFIXES)))
    return ("prefix", kind, draw(st.sampled_from(PREFIXES[kind])))


simple_matcher_st = st.one_of(
    range_st(),
    prefix_st(),
    st.tuples(st.just("one_of"), st.lists(non_null_st, min_size=1, max_size=3)),
    st.tuples(st.just("not"), non_null_st),
    st.just(("present",)),
    st.just(("missing",)),
)
matcher_st = st.one_of(
    simple_matcher_st,
    st.tuples(st.just("all"), st.lists(simple_matcher_st, min_size=2, max_size=3)),
)
template_st = st.tuples(
    st.integers(0, N_TYPES - 1),
    st.dictionaries(st.sampled_from(FIELDS), value_st, max_size=1),
    st.dictionaries(st.sampled_from(FIELDS), matcher_st, max_size=2),
)
templates_st = st.lists(template_st, min_size=1, max_size=2)
order_st = st.lists(st.tuples(st.sampled_from(FIELDS), st.booleans()), max_size=2, unique_by=lambda k: k[0])

RefTemplate = tuple[int, dict[str, int], dict[str, tuple[object, ...]]]


# ---------------------------------------------------------------- the reference


@dataclass
class RefEntry:
    id: int
    lineage: tuple[str, ...]
    fields: dict[str, tuple[str, object]]


_RANKS = ["bool", "int", "double", "string", "bytes"]


def python_value(value: tuple[str, object]) -> object:
    kind, data = value
    return struct.unpack("<d", data)[0] if kind == "double" else data  # type: ignore[arg-type]


def ref_test(matcher: tuple[object, ...], value: tuple[str, object] | None) -> bool:
    """The naive meaning of each matcher, on the entry's (kind, data) or None."""
    what = matcher[0]
    present = value is not None and value[0] != "null"
    if what == "present":
        return present
    if what == "missing":
        return not present
    if what == "not":
        return value != VALUES[matcher[1]]  # type: ignore[call-overload]
    if what == "one_of":
        return value in [VALUES[i] for i in matcher[1]]  # type: ignore[attr-defined]
    if what == "all":
        return all(ref_test(part, value) for part in matcher[1])  # type: ignore[attr-defined]
    if not present or value[0] != matcher[1]:  # type: ignore[index]
        return False
    x = python_value(value)  # type: ignore[arg-type]
    if what == "prefix":
        return x.startswith(matcher[2])  # type: ignore[attr-defined]
    _, _, low, low_inclusive, high, high_inclusive = matcher
    if isinstance(x, float) and math.isnan(x):
        return False
    if low is not None and not (x >= low if low_inclusive else x > low):  # type: ignore[operator]
        return False
    return high is None or (x <= high if high_inclusive else x < high)  # type: ignore[operator]


def ref_matches(template: RefTemplate, entry: RefEntry) -> bool:
    type_index, fields, matchers = template
    if f"T{type_index}" not in entry.lineage:
        return False
    for name, index in fields.items():
        if VALUES[index][0] != "null" and entry.fields.get(name) != VALUES[index]:
            return False
    return all(ref_test(matcher, entry.fields.get(name)) for name, matcher in matchers.items())


def ref_compare_values(a: tuple[str, object], b: tuple[str, object]) -> int:
    """Two ordered values: by kind, then value (a double NaN after every other double)."""
    if a[0] != b[0]:
        return -1 if _RANKS.index(a[0]) < _RANKS.index(b[0]) else 1
    x, y = python_value(a), python_value(b)
    x_nan = isinstance(x, float) and math.isnan(x)
    y_nan = isinstance(y, float) and math.isnan(y)
    if x_nan or y_nan:
        return int(x_nan) - int(y_nan)
    return -1 if x < y else (1 if x > y else 0)  # type: ignore[operator]


def ref_order(entries: list[RefEntry], order: list[tuple[str, bool]], fifo: bool) -> list[RefEntry]:
    def ordered(entry: RefEntry, name: str) -> tuple[str, object] | None:
        value = entry.fields.get(name)
        return value if value is not None and value[0] in _RANKS else None

    def compare(a: RefEntry, b: RefEntry) -> int:
        for name, descending in order:
            x, y = ordered(a, name), ordered(b, name)
            if x is None or y is None:
                if x is None and y is None:
                    continue
                return 1 if x is None else -1  # without an ordered value: last either way
            sign = ref_compare_values(x, y)
            if sign:
                return -sign if descending else sign
        return (a.id - b.id) if fifo else (b.id - a.id)

    return sorted(entries, key=functools.cmp_to_key(compare))


# ---------------------------------------------------------------- the engine's side


def engine_matcher(matcher: tuple[object, ...]) -> Matcher:
    what = matcher[0]
    if what == "present":
        return Presence(True)
    if what == "missing":
        return Presence(False)
    if what == "not":
        return NotEqual(field_value(matcher[1]))  # type: ignore[arg-type]
    if what == "one_of":
        return OneOf(field_value(i) for i in matcher[1])  # type: ignore[attr-defined]
    if what == "all":
        return All(engine_matcher(part) for part in matcher[1])  # type: ignore[attr-defined]
    if what == "prefix":
        return Prefix(matcher[1], matcher[2])  # type: ignore[arg-type]
    _, kind, low, low_inclusive, high, high_inclusive = matcher
    return Range(kind, low, low_inclusive, high, high_inclusive)  # type: ignore[arg-type]


def engine_template(template: RefTemplate) -> Template:
    type_index, fields, matchers = template
    return make_template(
        f"T{type_index}",
        {name: field_value(i) for name, i in fields.items()},
        {name: engine_matcher(m) for name, m in matchers.items()},
    )


class MatcherMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.lineages: list[tuple[str, ...]] = []
        self.entries: list[RefEntry] = []
        self.fifo = True
        self.space: SpaceEngine

    @initialize(
        parents=st.lists(st.none() | st.integers(0, 100), min_size=N_TYPES, max_size=N_TYPES),
        fifo=st.booleans(),
        declared=st.booleans(),
    )
    def setup(self, parents: list[int | None], fifo: bool, declared: bool) -> None:
        self.lineages = lineages(parents)
        self.fifo = fifo
        # Declared indexes exist before the first write; the others are made on first need.
        indexes = (("T0", "a"), ("T1", "b")) if declared else ()
        self.space = SpaceEngine("prop", SpaceSettings(fifo=fifo, indexes=indexes), FakeClock())

    def templates(self, templates: list[RefTemplate], order: list[tuple[str, bool]]) -> Templates:
        return Templates((engine_template(t) for t in templates), order)

    def expected(self, templates: list[RefTemplate], order: list[tuple[str, bool]]) -> list[int]:
        matching = [e for e in self.entries if any(ref_matches(t, e) for t in templates)]
        if not self.fifo:
            matching.reverse()
        return [e.id for e in ref_order(matching, order, self.fifo)]

    def check(self, found: list[int], expected: list[int], limit: int, ordered: bool) -> None:
        if ordered or self.fifo:
            assert found == expected[:limit]
        else:
            assert len(found) == min(limit, len(expected)) and set(found) <= set(expected)

    @rule(
        batch=st.lists(
            st.tuples(
                st.integers(0, N_TYPES - 1), st.dictionaries(st.sampled_from(FIELDS), value_st, max_size=2)
            ),
            min_size=1,
            max_size=4,
        )
    )
    def write(self, batch: list[tuple[int, dict[str, int]]]) -> None:
        new = [
            NewEntry(
                self.lineages[t][0], self.lineages[t][1:], {n: field_value(i) for n, i in f.items()}, None, 1
            )
            for t, f in batch
        ]
        grants = self.space.write(new, math.inf)
        for grant, (t, fields) in zip(grants, batch, strict=True):
            self.entries.append(
                RefEntry(grant.id, self.lineages[t], {n: VALUES[i] for n, i in fields.items()})
            )

    @rule(templates=templates_st, order=order_st, limit=st.integers(1, 4))
    def read(self, templates: list[RefTemplate], order: list[tuple[str, bool]], limit: int) -> None:
        found = find(self.space, self.templates(templates, order), take=False, max_entries=limit)
        self.check([e.id for e in found], self.expected(templates, order), limit, bool(order))

    @rule(templates=templates_st, order=order_st, limit=st.sampled_from([1, 1, 2]))
    def take(self, templates: list[RefTemplate], order: list[tuple[str, bool]], limit: int) -> None:
        found = [
            e.id for e in find(self.space, self.templates(templates, order), take=True, max_entries=limit)
        ]
        self.check(found, self.expected(templates, order), limit, bool(order))
        self.entries = [e for e in self.entries if e.id not in set(found)]

    @rule(templates=templates_st)
    def count(self, templates: list[RefTemplate]) -> None:
        assert self.space.count(self.templates(templates, [])) == len(self.expected(templates, []))

    @rule(templates=templates_st, order=order_st, limit=st.integers(0, 4))
    def contents(self, templates: list[RefTemplate], order: list[tuple[str, bool]], limit: int) -> None:
        found = [e.id for e in contents(self.space, self.templates(templates, order), limit)]
        self.check(found, self.expected(templates, order), limit or len(self.entries) + 1, bool(order))

    @rule(templates=templates_st, order=order_st, limit=st.integers(1, 4))
    def first_candidates(
        self, templates: list[RefTemplate], order: list[tuple[str, bool]], limit: int
    ) -> None:
        """What a bounded contents reads first: the first `limit` matches, in order (nothing here
        is locked or expired), and whether more follow."""
        first, more = self.space.first_candidates(self.templates(templates, order), limit)
        expected = self.expected(templates, order)
        found = [e.id for e in first]  # a plain template's: every candidate (a copy at C speed)
        self.check(found[:limit], expected, limit, bool(order))
        if len(found) <= limit and len(expected) > limit:
            assert more


MatcherMachine.TestCase.settings = settings(
    max_examples=300,
    stateful_step_count=30,
    deadline=None,
    database=None,
    report_multiple_bugs=False,
    suppress_health_check=[HealthCheck.too_slow],
)
TestMatchers = MatcherMachine.TestCase


# ---------------------------------------------------------------- waiters


@dataclass
class _Watcher:
    seq: int
    templates: tuple[Template, ...]


def _filed_exactly(template: RefTemplate) -> bool:
    """Whether the waiters' index files `template` by its whole condition: its type alone, one
    equality field, or one matcher other than `all` (a range, one-sided or two-sided, a prefix, a
    set, not, present or missing)."""
    made = engine_template(template)
    if len(made.fields) + len(made.matchers) != 1:
        return not made.fields and not made.matchers
    if made.fields:
        return True
    return template[2][made.matchers[0][0]][0] != "all"


@settings(max_examples=300, deadline=None, database=None)
@given(
    parked=st.lists(st.lists(template_st, min_size=1, max_size=2), min_size=1, max_size=12),
    writes=st.lists(
        st.tuples(
            st.integers(0, N_TYPES - 1), st.dictionaries(st.sampled_from(FIELDS), value_st, max_size=2)
        ),
        min_size=1,
        max_size=6,
    ),
    gone=st.sets(st.integers(0, 11)),
)
# Two templates of one waiter with the same range: filed once by it (it was also filed by its
# type, for the second, and every write of the type looked at it).
@example(
    parked=[[(0, {}, {"a": ("range", "bool", None, False, False, False)})] * 2], writes=[(0, {})], gone=set()
)
# A two-sided range the value lies beside, a Not of the value written, a Missing on a field the
# entry has: looked at by no write here.
@example(
    parked=[
        [(0, {}, {"a": ("range", "int", 0, True, 1, False)})],
        [(0, {}, {"a": ("not", 1)})],
        [(0, {}, {"b": ("missing",)})],
        [(0, {}, {"b": ("present",)})],
    ],
    writes=[(0, {"a": 2, "b": 3}), (0, {"a": 1, "b": 28}), (0, {"a": 3})],
    gone=set(),
)
def test_a_write_looks_at_every_waiter_it_can_wake_and_no_other(
    parked: list[list[RefTemplate]], writes: list[tuple[int, dict[str, int]]], gone: set[int]
) -> None:
    index: WatcherIndex[_Watcher] = WatcherIndex()
    watchers = [_Watcher(seq, tuple(engine_template(t) for t in ts)) for seq, ts in enumerate(parked)]
    for watcher in watchers:
        index.add(watcher)
    for seq in gone:  # some leave again: nothing of theirs may stay behind
        if seq < len(watchers):
            index.remove(watchers[seq])
    staying = [(w, ts) for w, ts in zip(watchers, parked, strict=True) if w.seq not in gone]
    assert len(index) == len(staying)
    for entry_id, (t, fields) in enumerate(writes, start=1):
        lineage = (f"T{t}",) + ((f"T{t - 1}",) if t else ())
        new = NewEntry(lineage[0], lineage[1:], {n: field_value(i) for n, i in fields.items()}, None, 1)
        stored = StoredEntry(entry_id, new, None)
        ref = RefEntry(entry_id, lineage, {n: VALUES[i] for n, i in fields.items()})
        looked_at = [w.seq for w in index.candidates(stored)]
        assert looked_at == sorted(looked_at)
        for watcher, templates in staying:
            wakes = any(ref_matches(template, ref) for template in templates)
            if wakes:
                assert watcher.seq in looked_at
            elif watcher.seq in looked_at:
                # Only a template filed coarser than its whole condition may bring a waiter it
                # cannot wake: one of a type of the entry's lineage with more than one condition
                # (an `all` is several).
                assert any(
                    f"T{template[0]}" in lineage and not _filed_exactly(template) for template in templates
                ), (watcher, fields)
    for watcher, _ in staying:
        index.remove(watcher)
    assert len(index) == 0 and not list(index.all())
