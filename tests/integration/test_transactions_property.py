"""Concurrent transactions through the SDK against a real server: whatever the interleaving, what
committed transactions wrote, read and took, and what they left behind, equals running them one
after another in some order (a few drawn cases; the engine's own property test draws hundreds).

Operations run interleaved in a drawn order, each a `*_nowait` call, so one that meets another
transaction's lock returns None. A None result is not checked: finding nothing locks nothing
(no predicate locks, as in Outrigger; see docs/transactions.md).
"""

from __future__ import annotations

import itertools
import uuid
from dataclasses import dataclass, field
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import outrig

from ..serial_orders import PROGRAMS, Op, Seen, some_serial_order_explains
from .entries import Task


@dataclass
class Run:
    ops: list[Op]
    txn: outrig.Transaction
    done: int = 0
    seen: list[Seen] = field(default_factory=list)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    initial=st.lists(st.integers(0, 2), max_size=3),
    programs=PROGRAMS,
    data=st.data(),
)
def test_committed_transactions_equal_some_serial_order(server, initial, programs, data) -> None:
    with outrig.connect(server.address, space=f"p-{uuid.uuid4().hex[:10]}", retry_deadline=0) as space:
        start = {f"i{k}": value for k, value in enumerate(initial)}
        if start:
            space.write_many([Task(job=uid, n=value) for uid, value in start.items()])
        runs = [Run(program, space.transaction()) for program in programs]
        writes = itertools.count()
        while live := [r for r in runs if r.done < len(r.ops)]:
            run = data.draw(st.sampled_from(live))
            kind, value = run.ops[run.done]
            run.done += 1
            if kind == "write":
                uid = f"w{next(writes)}"
                run.txn.write(Task(job=uid, n=value))
                run.seen.append((kind, value, uid))
                continue
            template = Task(n=value)
            got = run.txn.take_nowait(template) if kind == "take" else run.txn.read_nowait(template)
            run.seen.append((kind, value, None if got is None else got.job))
        committed = []
        for run in runs:
            if data.draw(st.booleans(), label="commit"):
                run.txn.commit()
                committed.append(run.seen)
            else:
                run.txn.abort()
        tasks: list[Any] = list(space.contents(Task()))  # Any: each job and n is set, not None
        final = {task.job: task.n for task in tasks}
    assert some_serial_order_explains(dict(start), committed, dict(final)), (
        f"no serial order explains {committed} ending with {final}"
    )
