"""IntervalMap (stabbing.py): the intervals that hold a point, against a naive list; its shape
kept (every node holds an interval that contains its center, a search tree by center, a heap by
priority); and what a lookup reads, counted in comparisons rather than timed."""

from __future__ import annotations

import math
import re
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from outrig.service.engine.stabbing import IntervalMap, _Node


def _shape(node: _Node | None, low: Any = None, high: Any = None) -> int:
    """Check the subtree's invariants; its node count."""
    if node is None:
        return 0
    assert (low is None or low < node.center) and (high is None or node.center < high)
    assert node.starts, "a node that holds nothing"
    assert sorted(node.starts) == node.starts and sorted(node.stops) == node.stops
    assert sorted((stop, start) for start, stop in node.starts) == node.stops
    for start, stop in node.starts:
        assert start <= node.center < stop
        assert low is None or low < start  # wholly after every center it went right of
        assert high is None or stop <= high  # wholly before every center it went left of
    assert (node.least, node.most) == (node.starts[0][0], node.stops[-1][0])
    for child in (node.left, node.right):
        assert child is None or child.priority <= node.priority
    return 1 + _shape(node.left, low, node.center) + _shape(node.right, node.center, high)


class IntervalMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.map: IntervalMap[float, str] = IntervalMap(seed=0)
        self.model: dict[tuple[float, float], str] = {}

    @rule(start=st.integers(-20, 20), width=st.integers(1, 45), value=st.text(max_size=2))
    def put(self, start: int, width: int, value: str) -> None:
        self.map.put(start, start + width, value)
        self.model[start, start + width] = value

    @rule(data=st.data())
    def pop(self, data: st.DataObject) -> None:
        if not self.model:
            assert self.map.pop(0, 1) is None
            return
        start, stop = data.draw(st.sampled_from(sorted(self.model)))
        assert self.map.pop(start, stop) == self.model.pop((start, stop))
        assert self.map.pop(start, stop) is None

    @rule(start=st.integers(-20, 20), width=st.integers(1, 45))
    def pop_unknown(self, start: int, width: int) -> None:
        if (start, start + width) not in self.model:
            assert self.map.pop(start, start + width) is None

    @rule(at=st.integers(-22, 66), half=st.booleans())
    def stab(self, at: int, half: bool) -> None:
        point = at + 0.5 if half else float(at)
        found = sorted(self.map.stab(point))
        assert found == sorted(v for (start, stop), v in self.model.items() if start <= point < stop)

    @invariant()
    def shaped(self) -> None:
        assert len(self.map) == len(self.model)
        assert _shape(self.map._root) == self.map.nodes
        assert dict(self.map.items()) == self.model
        hull = (min(s for s, _ in self.model), max(e for _, e in self.model)) if self.model else (None, None)
        assert (self.map.least, self.map.most) == hull


IntervalMachine.TestCase.settings = settings(
    max_examples=200, stateful_step_count=60, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
TestIntervalMap = IntervalMachine.TestCase


def test_an_empty_interval_is_refused() -> None:
    intervals: IntervalMap[int, str] = IntervalMap()
    with pytest.raises(ValueError, match=re.escape("[3, 3)")):
        intervals.put(3, 3, "x")
    assert not intervals and list(intervals.stab(3)) == []


def test_putting_again_replaces_the_value() -> None:
    intervals: IntervalMap[int, str] = IntervalMap()
    intervals.put(1, 5, "a")
    intervals.put(1, 5, "b")
    assert len(intervals) == 1 and list(intervals.stab(4)) == ["b"] and intervals.get(1, 5) == "b"
    assert intervals.pop(1, 5) == "b" and intervals.nodes == 0 and intervals.depth() == 0


class Counted:
    """A key that counts the comparisons made with it."""

    made = 0

    def __init__(self, value: float) -> None:
        self.value = value

    def __eq__(self, other: object) -> bool:
        Counted.made += 1
        return isinstance(other, Counted) and self.value == other.value

    def __lt__(self, other: Counted) -> bool:
        Counted.made += 1
        return self.value < other.value

    def __le__(self, other: Counted) -> bool:
        Counted.made += 1
        return self.value <= other.value

    def __gt__(self, other: Counted) -> bool:
        Counted.made += 1
        return self.value > other.value

    def __ge__(self, other: Counted) -> bool:
        Counted.made += 1
        return self.value >= other.value

    def __hash__(self) -> int:
        return hash(self.value)


def _comparisons(intervals: IntervalMap[Counted, int], at: float) -> tuple[int, list[int]]:
    Counted.made = 0
    found = sorted(intervals.stab(Counted(at)))
    return Counted.made, found


def test_a_lookup_reads_the_path_and_what_it_finds_only() -> None:
    """Among 4,000 ranges, disjoint or nested or sliding, a point's lookup makes at most three
    comparisons per node of its path (its center, the node's least start or greatest stop, the
    first interval past what it finds) and one per interval found: never one per range."""
    n = 4_000
    shapes = {
        "disjoint": lambda i: (10 * i, 10 * i + 5),
        "sliding": lambda i: (i, i + 10),
        "nested": lambda i: (-i, i + 1),
        "nested, ascending": lambda i: (0, i + 1),
    }
    for name, shape in shapes.items():
        intervals: IntervalMap[Counted, int] = IntervalMap(seed=7)
        for i in range(n):
            start, stop = shape(i)
            intervals.put(Counted(start), Counted(stop), i)
        depth = intervals.depth()
        assert depth <= 4 * math.log2(n), (name, depth)  # a treap's: about 2.5 log2 n here
        for at in (-10.5, 0.5, 7.5, 1_234.5, 3_999.5, 20_000.5, 50_000.5):
            comparisons, found = _comparisons(intervals, at)
            expected = sorted(i for i in range(n) if shape(i)[0] <= at < shape(i)[1])
            assert found == expected, (name, at)
            assert comparisons <= 3 * depth + len(found), (name, at, comparisons, depth, len(found))


def test_removing_every_interval_leaves_no_node() -> None:
    intervals: IntervalMap[int, int] = IntervalMap(seed=3)
    for i in range(500):
        intervals.put(i, i + 7, i)
        intervals.put(-i, i + 1, -i)
    assert _shape(intervals._root) == intervals.nodes
    for i in range(0, 500, 2):
        intervals.pop(i, i + 7)
        intervals.pop(-i, i + 1)
    assert _shape(intervals._root) == intervals.nodes
    held = [i for i in range(94, 101) if i % 2] + [-i for i in range(100, 500) if i % 2]
    assert sorted(intervals.stab(100)) == sorted(held)
    for i in range(1, 500, 2):
        intervals.pop(i, i + 7)
        intervals.pop(-i, i + 1)
    assert len(intervals) == 0 and intervals.nodes == 0 and intervals.depth() == 0
