"""The change log against a naive model: for random writes, takes, expiries, cancels, acks and
transactions (committed or aborted), each operation appends exactly the changes the model says,
with consecutive seqs (a commit's writes then takes, under its id); and a reader at any position,
with any templates and kinds, reading the log in batches of any size, sees exactly the model's
matching changes after that position, in order, none twice, none missed."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from outrig.service.engine import FakeClock, SpaceEngine
from outrig.service.engine.changes import CHANGE_KINDS
from outrig.service.engine.space import FOREVER

from .test_space import find, make, new, tpl

VALUES = st.integers(0, 2)
LEASES = st.sampled_from([FOREVER, 5.0, 10.0])

OPS = st.one_of(
    st.tuples(st.just("write"), st.lists(VALUES, min_size=1, max_size=3), LEASES),
    st.tuples(st.just("take"), st.none() | VALUES, st.integers(1, 3)),
    st.tuples(st.just("expire"), st.floats(1.0, 12.0)),
    st.tuples(st.just("cancel"), st.integers(0, 10)),
    st.tuples(st.just("ack"), st.none() | VALUES),
    st.tuples(st.just("transaction"), st.lists(VALUES, max_size=3), st.none() | VALUES, st.booleans()),
)


@dataclass(frozen=True)
class Expected:
    """A change as the model has it: kind, entry id, the entry's value, transaction."""

    kind: str
    entry: int
    value: int
    transaction: int = 0


class Model:
    """The space as a plain dict, and the log it should have."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.present: dict[int, tuple[int, float | None]] = {}  # id -> (value, expires_at)
        self.log: list[Expected] = []

    def matching(self, value: int | None) -> list[int]:
        return [i for i, (v, _) in self.present.items() if value is None or v == value]

    def leave(self, kind: str, entry: int, transaction: int = 0) -> Expected:
        value, _ = self.present.pop(entry)
        return Expected(kind, entry, value, transaction)


def _run(space: SpaceEngine, model: Model, op: tuple[object, ...], draw: st.DataObject) -> list[Expected]:
    """Apply one operation to the engine and return the changes the model expects of it."""
    clock = model.clock
    kind = op[0]
    if kind == "write":
        values, lease = op[1], op[2]
        assert isinstance(values, list) and isinstance(lease, float)
        grants = space.write([new("T", v=v) for v in values], lease)
        expected = []
        for grant, v in zip(grants, values, strict=True):
            model.present[grant.id] = (v, grant.expires_at)
            expected.append(Expected("write", grant.id, v))
        return expected
    if kind == "take":
        value, count = op[1], op[2]
        assert (value is None or isinstance(value, int)) and isinstance(count, int)
        template = tpl("T") if value is None else tpl("T", v=value)
        taken = find(space, [template], take=True, max_entries=count)
        assert len(taken) == min(count, len(model.matching(value)))
        return [model.leave("take", stored.id) for stored in taken]
    if kind == "expire":
        seconds = op[1]
        assert isinstance(seconds, float)
        clock.advance(seconds)
        space.reap()
        now = clock.time()
        due = {i for i, (_, expires) in model.present.items() if expires is not None and expires <= now}
        assert space.changes is not None
        # The reaper's order within one pass is its lease queue's: the model takes it from the log.
        order = [c.entry.id for c in space.changes.after(space.changes.head - len(due), len(due))]
        assert set(order) == due
        return [model.leave("expire", entry) for entry in order]
    if kind == "cancel":
        index = op[1]
        assert isinstance(index, int)
        ids = sorted(model.present)
        if not ids:
            return []
        entry = ids[index % len(ids)]
        space.cancel(entry)
        return [model.leave("cancel", entry)]
    if kind == "ack":
        value = op[1]
        assert value is None or isinstance(value, int)
        template = tpl("T") if value is None else tpl("T", v=value)
        deliveries = space.deliver([template], 1, 30.0)
        if not deliveries:
            assert not model.matching(value)
            return []
        space.ack(deliveries[0].receipt)
        return [model.leave("take", deliveries[0].entry.id)]
    values, value, commit = op[1], op[2], op[3]
    assert isinstance(values, list) and (value is None or isinstance(value, int))
    txn, _ = space.begin(FOREVER)
    written = []
    for v in values:
        (stored,), _ = space.write_entries([new("T", v=v)], FOREVER, txn)
        written.append((stored.id, v))
    template = tpl("T") if value is None else tpl("T", v=value)
    outside = set(model.matching(value))
    found = find(space, [template], take=True, txn=txn)
    taken = [s for s in found if s.id in outside]
    # Its own write taken back: never a change.
    written = [(entry, v) for entry, v in written if entry not in {s.id for s in found}]
    if not commit:
        space.abort(txn)
        return []
    space.commit(txn)
    expected = []
    for entry, v in written:
        model.present[entry] = (v, None)
        expected.append(Expected("write", entry, v, txn.id))
    expected += [model.leave("take", stored.id, txn.id) for stored in taken]
    return expected


@settings(max_examples=200, deadline=None)
@given(ops=st.lists(OPS, max_size=30), data=st.data())
def test_the_log_is_the_models_changes_and_every_reader_sees_its_matching_suffix(
    ops: list[tuple[object, ...]], data: st.DataObject
) -> None:
    clock = FakeClock()
    space = make(clock)
    model = Model(clock)
    log = space.changes
    assert log is not None
    for op in ops:
        before = log.head
        expected = _run(space, model, op, data)
        appended = log.after(before, 1 << 20)
        assert [change.seq for change in appended] == list(range(before + 1, before + 1 + len(expected)))
        assert [
            Expected(c.kind, c.entry.id, c.entry.fields["v"].data, c.transaction)  # type: ignore[arg-type]
            for c in appended
        ] == expected
        model.log += expected
    assert log.head == len(model.log) and log.oldest == 1
    for _ in range(5):  # readers at any position, of any templates and kinds, in any batch size
        position = data.draw(st.integers(0, log.head))
        value = data.draw(st.none() | VALUES)
        kinds = frozenset(data.draw(st.sets(st.sampled_from(CHANGE_KINDS), min_size=1)))
        batch = data.draw(st.integers(1, 7))
        template = tpl("T") if value is None else tpl("T", v=value)
        seen, at = [], position
        while batch_changes := log.after(at, batch):
            seen += [
                (c.seq, c.kind, c.entry.id)
                for c in batch_changes
                if c.kind in kinds and template.matches(c.entry)
            ]
            at = batch_changes[-1].seq
        wanted = [
            (seq, e.kind, e.entry)
            for seq, e in enumerate(model.log, start=1)
            if seq > position and e.kind in kinds and (value is None or e.value == value)
        ]
        assert seen == wanted
