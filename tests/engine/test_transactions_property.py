"""Transactions are serializable on the entries they touch: whatever the interleaving, what
committed transactions wrote, read and took, and what they left behind, equals running them one
after another, in some order.

Each drawn case has a few entries in the space and two or three transactions of writes, reads and
takes (value templates or wildcards). The operations run interleaved, in a drawn order, each
without waiting: one that finds only entries another transaction has locked (a conflict, where a
real call would wait) makes its transaction abort, as a client that gives up would. The others
then commit or abort, as drawn. The check replays the committed transactions serially, in every
order, against a plain list: each read or take must have returned an entry present and matching
at that point (a take removes it), and the space must end holding exactly what the replay holds.

A read or take that finds nothing takes no lock, as in Outrigger (there are no predicate locks):
two transactions may each see "no entry" and then each write one, which no serial order explains.
So a None result is not checked here; `test_finding_nothing_locks_nothing` pins that behaviour,
and docs/transactions.md states it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from outrig.service.engine import SpaceEngine
from outrig.service.engine.model import Transaction, TransactionState
from outrig.service.engine.space import FOREVER

from ..serial_orders import PROGRAMS, Op, Seen, some_serial_order_explains
from .test_space import contents, make, new, tpl


@dataclass
class Run:
    ops: list[Op]
    txn: Transaction | None = None
    done: int = 0
    seen: list[Seen] = field(default_factory=list)


def _step(space: SpaceEngine, run: Run, values: dict[int, int]) -> None:
    kind, value = run.ops[run.done]
    run.done += 1
    assert run.txn is not None
    if kind == "write":
        assert value is not None
        (stored,), _ = space.write_entries([new("T", v=value)], FOREVER, run.txn)
        values[stored.id] = value
        run.seen.append((kind, value, stored.id))
        return
    template = tpl("T") if value is None else tpl("T", v=value)
    found, conflicted = space.find_or_conflict([template], take=kind == "take", txn=run.txn)
    if not found and conflicted:
        space.abort(run.txn)  # it would have to wait: give up
        return
    run.seen.append((kind, value, found[0].id if found else None))


@settings(max_examples=300, deadline=None)
@given(
    initial=st.lists(st.integers(0, 2), max_size=3),
    programs=PROGRAMS,
    data=st.data(),
)
def test_committed_transactions_equal_some_serial_order(
    initial: list[int], programs: list[list[Op]], data: st.DataObject
) -> None:
    space = make()
    values: dict[int, int] = {}
    for value in initial:
        (stored,), _ = space.write_entries([new("T", v=value)], FOREVER)
        values[stored.id] = value
    start = dict(values)
    runs = [Run(program) for program in programs]
    for run in runs:
        run.txn, _ = space.begin(60.0)
    while live := [r for r in runs if r.txn is not None and r.txn.active and r.done < len(r.ops)]:
        _step(space, data.draw(st.sampled_from(live)), values)
    for run in runs:
        assert run.txn is not None
        if run.txn.active:
            if data.draw(st.booleans(), label="commit"):
                space.commit(run.txn)
            else:
                space.abort(run.txn)
    committed = [r.seen for r in runs if r.txn is not None and r.txn.state is TransactionState.COMMITTED]
    final = {stored.id: values[stored.id] for stored in contents(space, [tpl("T")])}
    assert space.statistics().locked == 0 and space.statistics().transactions == 0
    assert some_serial_order_explains(dict(start), committed, dict(final)), (
        f"no serial order explains {committed} ending with {final}"
    )


def test_finding_nothing_locks_nothing() -> None:
    # Outrigger's semantics, kept: no predicate locks. Both transactions see an empty space, both
    # write, both commit; serially, the second would have seen the first's entry.
    space = make()
    first, _ = space.begin(60.0)
    second, _ = space.begin(60.0)
    assert space.find_or_conflict([tpl("T")], take=False, txn=first) == ([], False)
    assert space.find_or_conflict([tpl("T")], take=False, txn=second) == ([], False)
    space.write_entries([new("T", v=1)], FOREVER, first)
    space.write_entries([new("T", v=2)], FOREVER, second)
    space.commit(first)
    space.commit(second)
    assert space.count([tpl("T")]) == 2
