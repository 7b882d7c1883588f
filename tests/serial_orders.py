"""What both transaction property tests share: the programs they draw, and the check that some
serial order of the committed transactions explains what they saw and what they left.

A program is a list of operations on entries holding one small int: ("write", value), and
("read" | "take", value or None for any). A transaction's record is what each operation did:
(kind, value, the entry's key, or None when a read or take found nothing).
"""

from __future__ import annotations

import itertools
from collections.abc import Hashable, Mapping, Sequence
from typing import TypeVar

from hypothesis import strategies as st

Op = tuple[str, int | None]
Seen = tuple[str, int | None, Hashable | None]

OPS = st.one_of(
    st.tuples(st.just("write"), st.integers(0, 2)),
    st.tuples(st.sampled_from(["read", "take"]), st.one_of(st.none(), st.integers(0, 2))),
)
PROGRAMS = st.lists(st.lists(OPS, min_size=1, max_size=4), min_size=2, max_size=3)

#: An entry's key: its id in the engine's test, its job in the server's.
K = TypeVar("K", bound=Hashable)


def _replay(initial: Mapping[K, int], order: Sequence[list[Seen]], final: Mapping[K, int]) -> bool:
    state: dict[Hashable, int] = dict(initial.items())
    for seen in order:
        for kind, value, key in seen:
            if key is None:
                continue  # finding nothing locks nothing (no predicate locks): not checked
            if kind == "write":
                assert value is not None
                state[key] = value
            elif key not in state or (value is not None and state[key] != value):
                return False
            elif kind == "take":
                del state[key]
    return state == final


def some_serial_order_explains(
    initial: Mapping[K, int], committed: Sequence[list[Seen]], final: Mapping[K, int]
) -> bool:
    """Whether replaying the committed transactions one after another, in some order, from
    `initial`, gives every read and take a matching entry that is there, and ends at `final`."""
    return any(_replay(initial, order, final) for order in itertools.permutations(committed))
