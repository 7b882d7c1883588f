"""The engine against a naive reference: a plain list of entries, scanned linearly.

Random type hierarchies, entries, templates and operation sequences (write, read, take, take many,
count, contents, renew, cancel, time passing with and without a reap). After every step the
engine's answers must equal the reference's: the same ids, in arrival order when the space is FIFO.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from outrig.service.engine import FakeClock, NewEntry, SpaceEngine, SpaceSettings, Template
from outrig.service.engine.values import FieldValue
from outrig.service.exceptions import LeaseNotFoundError

from .test_space import contents, find

# ---------------------------------------------------------------- the value pool

_HEAD, _TAIL = b"H" * 40, b"T" * 40


def _double(x: float) -> bytes:
    return struct.pack("<d", x)


# Kinds mixed on purpose: int 1, double 1.0 and bool true are numerically equal but different
# values; the big ones share their coarse index key (same kind, length, head and tail).
VALUES: list[tuple[str, object]] = [
    ("int", 0),
    ("int", 1),
    ("double", _double(1.0)),
    ("double", _double(0.0)),
    ("double", _double(-0.0)),
    ("double", _double(math.nan)),
    ("bool", True),
    ("bool", False),
    ("string", "a"),
    ("string", ""),
    ("bytes", b"a"),
    ("bytes", _HEAD + b"x" * 300 + _TAIL),
    ("bytes", _HEAD + b"y" * 300 + _TAIL),
    ("string", "s" * 300),
    ("null", None),
]
FIELD_NAMES = ["a", "b", "c"]
N_TYPES = 5
LEASES: list[float | None] = [None, 1.0, 2.5, 5.0, 10.0, math.inf]
DEFAULT_LEASE = 4.0


def field_value(index: int) -> FieldValue:
    kind, data = VALUES[index]
    # A fresh object every time: equality must never rely on identity.
    return FieldValue(kind, data)  # type: ignore[arg-type]


# Half the draws come from the look-alikes (1 / 1.0 / true; the big values with one coarse key), so
# that an entry and a template often hold two values an index could confuse.
LOOK_ALIKES = [1, 2, 6, 11, 12]
value_st = st.one_of(st.integers(0, len(VALUES) - 1), st.sampled_from(LOOK_ALIKES))
entry_st = st.tuples(
    st.integers(0, N_TYPES - 1), st.dictionaries(st.sampled_from(FIELD_NAMES), value_st, max_size=3)
)
template_st = st.tuples(
    st.integers(0, N_TYPES - 1), st.dictionaries(st.sampled_from(FIELD_NAMES), value_st, max_size=2)
)
templates_st = st.lists(template_st, min_size=1, max_size=3)
lease_st = st.sampled_from(LEASES)


# ---------------------------------------------------------------- the reference


@dataclass
class RefEntry:
    id: int
    lineage: tuple[str, ...]
    fields: dict[str, tuple[str, object]]
    expires_at: float | None


def ref_matches(template: tuple[int, dict[str, int]], entry: RefEntry) -> bool:
    type_index, fields = template
    if f"T{type_index}" not in entry.lineage:
        return False
    for name, index in fields.items():
        wanted = VALUES[index]
        if wanted[0] == "null":
            continue  # a null template field is a wildcard
        if entry.fields.get(name) != wanted:
            return False
    return True


def lineages(parents: list[int | None]) -> list[tuple[str, ...]]:
    """Types T0, T1, ...: each under the lineage of an earlier one its parent draw picks, or none."""
    made: list[tuple[str, ...]] = []
    for i, parent in enumerate(parents):
        lineage: tuple[str, ...] = (f"T{i}",)
        if parent is not None and i > 0:
            lineage += made[parent % i]
        made.append(lineage)
    return made


class MatchingMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.clock = FakeClock()
        self.lineages: list[tuple[str, ...]] = []
        self.space: SpaceEngine
        self.fifo = True
        self.max_lease = math.inf
        self.entries: list[RefEntry] = []  # every entry not taken or cancelled, arrival order
        self.granted: list[int] = []

    @initialize(
        parents=st.lists(st.none() | st.integers(0, 100), min_size=N_TYPES, max_size=N_TYPES),
        fifo=st.booleans(),
        max_lease=st.sampled_from([math.inf, 8.0]),
    )
    def setup(self, parents: list[int | None], fifo: bool, max_lease: float) -> None:
        self.lineages = lineages(parents)
        self.fifo = fifo
        self.max_lease = max_lease
        space_settings = SpaceSettings(fifo=fifo, default_lease=DEFAULT_LEASE, max_lease=max_lease)
        self.space = SpaceEngine("prop", space_settings, self.clock)

    # ------------------------------------------------------------ reference helpers

    def live(self) -> list[RefEntry]:
        now = self.clock.time()
        return [e for e in self.entries if e.expires_at is None or e.expires_at > now]

    def ref_select(self, templates: list[tuple[int, dict[str, int]]]) -> list[int]:
        """Ids of every live match, in arrival order."""
        return [e.id for e in self.live() if any(ref_matches(t, e) for t in templates)]

    def engine_templates(self, templates: list[tuple[int, dict[str, int]]]) -> list[Template]:
        return [
            Template(f"T{type_index}", {name: field_value(i) for name, i in fields.items()})
            for type_index, fields in templates
        ]

    def expiry(self, lease: float | None) -> float | None:
        duration = DEFAULT_LEASE if lease is None else lease
        duration = min(duration, self.max_lease)
        return None if math.isinf(duration) else self.clock.time() + duration

    def check_found(self, found: list[int], expected: list[int], max_entries: int) -> None:
        """FIFO: exactly the oldest matches in order. Otherwise: the right number of matches."""
        assert len(found) == len(set(found))
        if self.fifo:
            assert found == expected[:max_entries]
        else:
            assert len(found) == min(max_entries, len(expected))
            assert set(found) <= set(expected)

    def forget(self, ids: list[int]) -> None:
        gone = set(ids)
        self.entries = [e for e in self.entries if e.id not in gone]

    # ------------------------------------------------------------ operations

    @rule(batch=st.lists(entry_st, min_size=1, max_size=3), lease=lease_st)
    def write(self, batch: list[tuple[int, dict[str, int]]], lease: float | None) -> None:
        new = [
            NewEntry(
                self.lineages[type_index][0],
                self.lineages[type_index][1:],
                {name: field_value(i) for name, i in fields.items()},
                None,
                1,
            )
            for type_index, fields in batch
        ]
        grants = self.space.write(new, lease)
        expires_at = self.expiry(lease)
        assert len(grants) == len(batch)
        for grant, (type_index, fields) in zip(grants, batch, strict=True):
            assert grant.expires_at == expires_at
            self.granted.append(grant.id)
            self.entries.append(
                RefEntry(
                    grant.id, self.lineages[type_index], {n: VALUES[i] for n, i in fields.items()}, expires_at
                )
            )

    @rule(templates=templates_st, max_entries=st.integers(1, 4))
    def read(self, templates: list[tuple[int, dict[str, int]]], max_entries: int) -> None:
        found = find(self.space, self.engine_templates(templates), take=False, max_entries=max_entries)
        self.check_found([e.id for e in found], self.ref_select(templates), max_entries)

    @rule(templates=templates_st, max_entries=st.sampled_from([1, 1, 2, 4]))
    def take(self, templates: list[tuple[int, dict[str, int]]], max_entries: int) -> None:
        found = [
            e.id
            for e in find(self.space, self.engine_templates(templates), take=True, max_entries=max_entries)
        ]
        self.check_found(found, self.ref_select(templates), max_entries)
        self.forget(found)

    @rule(templates=templates_st)
    def count(self, templates: list[tuple[int, dict[str, int]]]) -> None:
        assert self.space.count(self.engine_templates(templates)) == len(self.ref_select(templates))

    @rule(templates=st.one_of(st.just([]), templates_st), page=st.integers(1, 4))
    def browse(self, templates: list[tuple[int, dict[str, int]]], page: int) -> None:
        """Browsing page by page lists every live match once, in arrival order (whatever the
        space's order), and takes nothing; no template: every live entry."""
        expected = self.ref_select(templates) if templates else [e.id for e in self.live()]
        found: list[int] = []
        cursor, pages = 0, 0
        while True:
            entries, cursor = self.space.browse(self.engine_templates(templates), cursor, page, page * 2)
            assert len(entries) <= page
            found += [e.id for e in entries]
            pages += 1
            assert pages <= len(self.entries) + 1  # every page moves the cursor on
            if not cursor:
                break
        assert found == expected

    @rule(templates=templates_st, max_entries=st.integers(0, 4))
    def contents(self, templates: list[tuple[int, dict[str, int]]], max_entries: int) -> None:
        found = [e.id for e in contents(self.space, self.engine_templates(templates), max_entries)]
        self.check_found(found, self.ref_select(templates), max_entries or len(self.entries) + 1)

    @precondition(lambda self: self.granted)
    @rule(pick=st.integers(0, 10_000), lease=lease_st)
    def renew(self, pick: int, lease: float | None) -> None:
        lease_id = self.granted[pick % len(self.granted)]
        target = next((e for e in self.live() if e.id == lease_id), None)
        if target is None:
            try:
                self.space.renew(lease_id, lease)
            except LeaseNotFoundError:
                return
            raise AssertionError(f"renewed lease {lease_id}, which is gone")
        grant = self.space.renew(lease_id, lease)
        target.expires_at = self.expiry(lease)
        assert grant.expires_at == target.expires_at

    @precondition(lambda self: self.granted)
    @rule(pick=st.integers(0, 10_000))
    def cancel(self, pick: int) -> None:
        lease_id = self.granted[pick % len(self.granted)]
        if lease_id in {e.id for e in self.live()}:
            self.space.cancel(lease_id)
            self.forget([lease_id])
            return
        try:
            self.space.cancel(lease_id)
        except LeaseNotFoundError:
            return
        raise AssertionError(f"cancelled lease {lease_id}, which is gone")

    @rule(seconds=st.sampled_from([0.5, 1.0, 2.5, 3.0, 6.0]), reap=st.booleans())
    def advance(self, seconds: float, reap: bool) -> None:
        self.clock.advance(seconds)
        if reap:
            self.space.reap()
            self.entries = self.live()
            assert self.space.statistics().entries == len(self.entries)

    @rule(limit=st.integers(1, 3))
    def reap_some(self, limit: int) -> None:
        assert self.space.reap(limit) <= limit
        assert self.space.statistics().entries >= len(self.live())

    # ------------------------------------------------------------ after every step

    @invariant()
    def every_type_holds_what_the_reference_holds(self) -> None:
        if not self.lineages:
            return
        for type_index in range(N_TYPES):
            templates: list[tuple[int, dict[str, int]]] = [(type_index, {})]
            found = [e.id for e in contents(self.space, self.engine_templates(templates))]
            expected = self.ref_select(templates)
            if self.fifo:
                assert found == expected
            else:
                assert sorted(found) == expected


MatchingMachine.TestCase.settings = settings(
    max_examples=200,
    stateful_step_count=30,
    deadline=None,
    database=None,
    report_multiple_bugs=False,  # shrink one failure well rather than several slowly
    suppress_health_check=[HealthCheck.too_slow],
)
TestMatching = MatchingMachine.TestCase
