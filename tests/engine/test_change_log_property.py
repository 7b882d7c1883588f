"""The change log alone (engine/changes.py) against a naive model, a list of `Change`s: for random
batches of appends (kinds, sizes, times, transactions, visible_at), trims by count, bytes and age,
rewinds of the last batch and restores, the log holds exactly the model's changes (the same
`Change`s back from `after`, from any position in batches of any size: an entry gone from its
space, which the log keeps frozen, back as an equal one), the same oldest, head, count and bytes;
and what it keeps per change is untracked by the cyclic collector but for an entry still in its
space."""

from __future__ import annotations

import gc

from hypothesis import given, settings
from hypothesis import strategies as st

from outrig.service.engine.changes import CHANGE_KINDS, CHANGE_OVERHEAD, Change, ChangeLog
from outrig.service.engine.model import NewEntry, StoredEntry
from outrig.service.engine.values import FieldValue

APPEND = st.tuples(
    st.just("append"),
    st.sampled_from(CHANGE_KINDS),
    st.lists(st.integers(0, 300), min_size=1, max_size=4),  # the entries' sizes
    st.floats(0.0, 5.0),  # time passed before it
    st.integers(0, 2),  # transaction
    st.none() | st.floats(0.0, 100.0),  # visible_at
)
# A change of entries the log already holds (their write's), which then are gone: by index among
# the model's entries still in their space.
GONE = st.tuples(
    st.just("gone"),
    st.sampled_from(("take", "expire", "cancel", "purge")),
    st.lists(st.integers(0, 1_000), min_size=1, max_size=3, unique=True),
    st.floats(0.0, 5.0),
)
OPS = st.one_of(
    APPEND,
    GONE,
    st.tuples(st.just("trim"), st.floats(0.0, 20.0)),
    st.tuples(st.just("rewind")),
    st.tuples(st.just("restore")),
)


def _entry(entry_id: int, size: int) -> StoredEntry:
    fields = {"n": FieldValue("int", entry_id), "s": FieldValue("string", "y" * (size % 7))}
    return StoredEntry(entry_id, NewEntry("T", ("S",), fields, b"x" * size, size), None)


def _shown(change: Change) -> tuple[object, ...]:
    """What a change shows of itself and its entry: a frozen entry comes back a new StoredEntry."""
    entry = change.entry
    shown = tuple(getattr(entry, name) for name in StoredEntry.__slots__ if name not in ("fields", "lock"))
    fields = {name: (value.kind, value.data, value.key) for name, value in entry.fields.items()}
    return (change.seq, change.kind, change.at, change.transaction, change.visible_at, shown, fields)


class Model:
    """The log as a list of changes, trimmed as the module docstring says."""

    def __init__(self, max_count: int, max_age: float, max_bytes: int) -> None:
        self.max_count, self.max_age, self.max_bytes = max_count, max_age, max_bytes
        self.changes: list[Change] = []
        self.head = 0
        self.oldest = 1

    def bytes(self) -> int:
        return sum(change.entry.size + CHANGE_OVERHEAD for change in self.changes)

    def trim_size(self) -> None:
        while self.changes and (len(self.changes) > self.max_count or self.bytes() > self.max_bytes):
            self.changes.pop(0)
            self.oldest += 1

    def append(self, made: list[Change]) -> None:
        self.changes += made
        self.head = made[-1].seq
        self.trim_size()

    def trim(self, now: float) -> None:
        self.trim_size()
        while self.changes and self.changes[0].at < now - self.max_age:
            self.changes.pop(0)
            self.oldest += 1

    def rewind(self, head: int) -> None:
        self.changes = [change for change in self.changes if change.seq <= head]
        self.head = head
        self.oldest = min(self.oldest, head + 1)


@settings(max_examples=150, deadline=None)
@given(
    max_count=st.integers(1, 8),
    max_age=st.floats(1.0, 10.0),
    max_bytes=st.integers(100, 2_000),
    ops=st.lists(OPS, max_size=30),
    limit=st.integers(1, 5),
)
def test_the_log_holds_what_the_model_holds(
    max_count: int, max_age: float, max_bytes: int, ops: list[tuple], limit: int
) -> None:
    log = ChangeLog(max_count, max_age, max_bytes)
    # The same changes logged without making a `Change` (as for an in-memory server's engine:
    # `log_one` for one entry, `append_many(made=False)` for more) must leave the same log.
    quiet = ChangeLog(max_count, max_age, max_bytes)
    model = Model(max_count, max_age, max_bytes)
    now, entry_id, before_last = 0.0, 0, None
    quiet_twin: dict[int, StoredEntry] = {}  # the quiet log's entries, apart (each its own `logged`)
    present: list[StoredEntry] = []  # written entries still in their space
    for op in ops:
        if op[0] == "gone" and present:
            _, kind, picks, passed = op
            now += passed
            entries = [present[at] for at in dict.fromkeys(pick % len(present) for pick in picks)]
            present = [each for each in present if each not in entries]
            before_last = log.head
            _log_quietly(quiet, kind, [quiet_twin[stored.id] for stored in entries], now, 0, None)
            made = log.append_many(kind, entries, now)
            expected = [Change(model.head + 1 + at, kind, stored, now) for at, stored in enumerate(entries)]
            assert made == expected
            model.append(expected)
        elif op[0] == "append":
            _, kind, sizes, passed, transaction, visible_at = op
            now += passed
            entries = [_entry(entry_id + at, size) for at, size in enumerate(sizes)]
            twins = [_entry(entry_id + at, size) for at, size in enumerate(sizes)]
            quiet_twin.update((twin.id, twin) for twin in twins)
            entry_id += len(sizes)
            before_last = log.head
            _log_quietly(quiet, kind, twins, now, transaction, visible_at)
            made = log.append_many(kind, entries, now, transaction, visible_at)
            first = model.head + 1
            expected = [
                Change(first + at, kind, stored, now, transaction, visible_at)
                for at, stored in enumerate(entries)
            ]
            assert made == expected
            model.append(expected)
            if kind == "write":
                present += entries
        elif op[0] == "trim":
            now += op[1]
            moved = log.trim(now)
            assert quiet.trim(now) == moved
            oldest = model.oldest
            model.trim(now)
            assert moved == (model.oldest if model.oldest != oldest else None)
        elif op[0] == "rewind" and before_last is not None:
            log.rewind(before_last)  # the undo of the last batch, as a failed store batch does
            quiet.rewind(before_last)
            model.rewind(before_last)
            before_last = None
        elif op[0] == "restore":
            held = log.after(log.oldest - 1, log.count)
            restored = ChangeLog(max_count, max_age, max_bytes)
            restored.restore(log.epoch, held, log.head)
            quiet_held = quiet.after(quiet.oldest - 1, quiet.count)
            quiet = ChangeLog(max_count, max_age, max_bytes)
            quiet.restore(log.epoch, quiet_held, log.head)
            log, before_last, present = restored, None, []
        assert (log.oldest, log.head, log.count, log.bytes) == (
            model.oldest,
            model.head,
            len(model.changes),
            model.bytes(),
        )
        assert (quiet.oldest, quiet.head, quiet.count, quiet.bytes) == (
            log.oldest,
            log.head,
            log.count,
            log.bytes,
        )
        assert [_shown(change) for change in quiet.after(quiet.oldest - 1, quiet.count)] == [
            _shown(change) for change in log.after(log.oldest - 1, log.count)
        ]
        for position in range(log.oldest - 1, log.head + 1):
            read, at = [], position
            while at < log.head:
                batch = log.after(at, limit)
                read += batch
                at = batch[-1].seq
            assert [_shown(change) for change in read] == [
                _shown(change) for change in model.changes if change.seq > position
            ]


def _log_quietly(
    log: ChangeLog,
    kind: str,
    entries: list[StoredEntry],
    now: float,
    transaction: int,
    visible_at: float | None,
) -> None:
    if len(entries) == 1:
        assert log.log_one(kind, entries[0], now, transaction, visible_at) == log.head
    else:
        assert log.append_many(kind, entries, now, transaction, visible_at, made=False) == []


def test_a_logged_change_keeps_only_an_entry_in_its_space_tracked_by_the_collector() -> None:
    log = ChangeLog(1_000, 60.0, 1 << 30)
    entries = [_entry(number, 10) for number in range(100)]
    for stored in entries:
        log.append("write", stored, 1.0)
    log.append_many("take", entries[:60], 2.0, 7, 3.0)
    del stored
    gc.collect()  # untracks tuples of atomic values
    held = gc.get_referents(log._entries, log._facts)
    tracked = [each for each in held if gc.is_tracked(each)]
    # the 40 entries not taken; the 60 taken ones are frozen in their writes' places too
    assert sorted(each.id for each in tracked) == list(range(60, 100)) and len(log._facts) == 160
    assert log.after(0, 1)[0].entry is not entries[0] and _shown(log.after(0, 1)[0]) == _shown(
        Change(1, "write", entries[0], 1.0)
    )
