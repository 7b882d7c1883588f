"""Intervals that hold a point: an interval map whose lookup by point reads only the intervals
that contain it, in O(log n + k) for n intervals and k found (the log n expected).

`IntervalMap` maps half-open intervals `[start, stop)` of any totally ordered keys (here the sort
keys of matchers.Bounds: tuples, that no arithmetic applies to) to values. It is a centered
interval tree: each node has a center, one of the keys, and holds the intervals that contain it,
sorted by start and by stop; the intervals wholly before the center lie to its left, those
wholly after it to its right. A point below a node's center is in exactly those of the node's
intervals that start at or before it (a prefix of the start order), a point at or above it in
exactly those that stop after it (a suffix of the stop order): a lookup walks one path and
reads, at each node, only the intervals it returns and one more (none when the node's least
start or greatest stop already says so). An interval lives at the first node of its path whose
center it contains; one that contains no center makes its start a new center.

The centers form a treap (Seidel and Aragon, 1996): each node draws a random priority and sits
above every node of lower priority, so the tree is a random binary search tree whatever the
order of insertions (sliding windows, ascending bounds), of expected depth O(log n), kept by an
expected O(1) rotations per new center. A rotation that lifts a child above its parent moves to
the child the parent's intervals that contain the child's center too (a prefix or suffix of the
parent's lists); nothing else changes home. A node that no longer holds an interval (its last
removed, or all taken by a child lifted above it) is rotated down to a leaf, moving nothing,
and cut off: every node holds one.

Why not a library: `intervaltree` (PyPI) checks every interval of each node on the path, also
those that contain the node's center but not the point, so a lookup among n nested ranges reads
all n; `ncls`, `superintervals` and `quicksect` take integer coordinates only.
"""

from __future__ import annotations

import itertools
import random
from bisect import bisect_left, insort
from collections.abc import Iterable, Iterator
from typing import Any, Generic, TypeVar

from sortedcontainers import SortedList

__all__ = ["IntervalMap"]

K = TypeVar("K")
V = TypeVar("V")


class _Node:
    __slots__ = ("center", "least", "left", "most", "priority", "right", "starts", "stops")

    def __init__(self, center: Any, priority: float) -> None:
        self.center = center
        self.priority = priority
        self.left: _Node | None = None
        self.right: _Node | None = None
        # Sorted lists (bisect): a node holds few intervals as a rule, and where it holds many,
        # moving pointers in C to insert or delete costs less than a SortedList's Python does.
        self.starts: list[tuple[Any, Any]] = []  # (start, stop)
        self.stops: list[tuple[Any, Any]] = []  # (stop, start)
        # The least start and the greatest stop held (the center when none is): a lookup that
        # finds nothing at a node knows it from one comparison.
        self.least: Any = center
        self.most: Any = center

    def hold(self, intervals: list[tuple[Any, Any]]) -> None:
        starts, stops = self.starts, self.stops
        for start, stop in intervals:
            insort(starts, (start, stop))
            insort(stops, (stop, start))
        self._bounds()

    def release(self, intervals: list[tuple[Any, Any]]) -> None:
        starts, stops = self.starts, self.stops
        for start, stop in intervals:
            del starts[bisect_left(starts, (start, stop))]
            del stops[bisect_left(stops, (stop, start))]
        self._bounds()

    def _bounds(self) -> None:
        if self.starts:
            self.least, self.most = self.starts[0][0], self.stops[-1][0]
        else:
            self.least = self.most = self.center


def _lift_left(parent: _Node) -> _Node:
    """Rotate `parent`'s left child above it; the child takes the intervals of `parent` that
    contain its center (those that start at or before it: all stop after `parent`'s center)."""
    child = parent.left
    assert child is not None
    parent.left, child.right = child.right, parent
    center = child.center
    return _hand_over(parent, child, itertools.takewhile(lambda pair: pair[0] <= center, parent.starts))


def _lift_right(parent: _Node) -> _Node:
    """Rotate `parent`'s right child above it; the child takes the intervals of `parent` that
    contain its center (those that stop after it: all start at or before `parent`'s center)."""
    child = parent.right
    assert child is not None
    parent.right, child.left = child.left, parent
    center = child.center
    stopping = itertools.takewhile(lambda pair: pair[0] > center, reversed(parent.stops))
    return _hand_over(parent, child, ((start, stop) for stop, start in stopping))


def _hand_over(parent: _Node, child: _Node, moving: Iterable[tuple[Any, Any]]) -> _Node:
    """Move the intervals `moving` (as (start, stop)) from `parent` to `child`, now above it."""
    moved = list(moving)  # read before `parent` changes
    if moved:
        parent.release(moved)
        child.hold(moved)
    return child


class IntervalMap(Generic[K, V]):
    """Half-open intervals [start, stop) mapped to values, looked up by a point they contain."""

    __slots__ = ("_nodes", "_random", "_root", "_starts", "_stops", "_values", "least", "most")

    def __init__(self, seed: int | None = None) -> None:
        self._values: dict[tuple[K, K], V] = {}
        self._root: _Node | None = None
        self._nodes = 0
        self._random = random.Random(seed).random  # the treap's priorities, its own generator
        # Every start and stop, so that the least start and the greatest stop (None when empty)
        # tell at one comparison each that a point lies beyond every interval.
        self._starts: SortedList[K] = SortedList()
        self._stops: SortedList[K] = SortedList()
        self.least: K | None = None
        self.most: K | None = None

    def __len__(self) -> int:
        return len(self._values)

    def __bool__(self) -> bool:
        return bool(self._values)

    def get(self, start: K, stop: K) -> V | None:
        return self._values.get((start, stop))

    def items(self) -> Iterator[tuple[tuple[K, K], V]]:
        return iter(self._values.items())

    @property
    def nodes(self) -> int:
        """How many centers the tree has (each holds an interval)."""
        return self._nodes

    def depth(self) -> int:
        """The number of nodes on the longest path (0 when empty)."""
        deepest, level = 0, [self._root] if self._root is not None else []
        while level:
            deepest += 1
            level = [child for node in level for child in (node.left, node.right) if child is not None]
        return deepest

    def put(self, start: K, stop: K, value: V) -> None:
        """Map [start, stop) to `value` (replacing what it mapped to); `start < stop`."""
        if not start < stop:  # type: ignore[operator]
            raise ValueError(f"an empty interval [{start!r}, {stop!r})")
        known = (start, stop) in self._values
        self._values[start, stop] = value
        if not known:
            self._root = self._put(self._root, start, stop)
            self._starts.add(start)
            self._stops.add(stop)
            self._hull()

    def _hull(self) -> None:
        self.least, self.most = (self._starts[0], self._stops[-1]) if self._starts else (None, None)

    def _put(self, node: _Node | None, start: Any, stop: Any) -> _Node:
        if node is None:
            node = _Node(start, self._random())
            self._nodes += 1
            node.hold([(start, stop)])
            return node
        center = node.center
        if start <= center < stop:
            node.hold([(start, stop)])
        elif stop <= center:
            node.left = self._put(node.left, start, stop)
            if node.left.priority > node.priority:
                lifted = _lift_left(node)
                if not node.starts:  # the child took all it held
                    lifted.right = self._cut(lifted.right, center)
                    self._nodes -= 1
                return lifted
        else:
            node.right = self._put(node.right, start, stop)
            if node.right.priority > node.priority:
                lifted = _lift_right(node)
                if not node.starts:
                    lifted.left = self._cut(lifted.left, center)
                    self._nodes -= 1
                return lifted
        return node

    def pop(self, start: K, stop: K) -> V | None:
        """Unmap [start, stop); its value, or None if it was not mapped."""
        if (start, stop) not in self._values:
            return None
        value = self._values.pop((start, stop))
        node = self._root
        while node is not None:
            center = node.center
            if start <= center < stop:
                break
            node = node.left if stop <= center else node.right
        assert node is not None  # every mapped interval is held
        node.release([(start, stop)])
        if not node.starts:
            self._root = self._cut(self._root, node.center)
            self._nodes -= 1
        self._starts.remove(start)
        self._stops.remove(stop)
        self._hull()
        return value

    def _cut(self, node: _Node | None, center: Any) -> _Node | None:
        """The subtree without the (empty) node of `center`, rotated down to a leaf first."""
        assert node is not None
        if center < node.center:
            node.left = self._cut(node.left, center)
        elif node.center < center:
            node.right = self._cut(node.right, center)
        elif node.left is None:
            return node.right
        elif node.right is None:
            return node.left
        elif node.left.priority > node.right.priority:
            node = _lift_left(node)
            node.right = self._cut(node.right, center)
        else:
            node = _lift_right(node)
            node.left = self._cut(node.left, center)
        return node

    def stab(self, point: K) -> Iterator[V]:
        """The values of the intervals that contain `point`, each once, in no particular order."""
        values = self._values
        node = self._root
        while node is not None:
            if point < node.center:
                if node.least <= point:
                    for start, stop in node.starts:
                        if point < start:
                            break
                        yield values[start, stop]
                node = node.left
            else:
                if point < node.most:
                    for stop, start in reversed(node.stops):
                        if stop <= point:
                            break
                        yield values[start, stop]
                node = node.right
