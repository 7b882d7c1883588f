"""Ordered indexes and the order of matches.

An `OrderedField` holds the entries of one type (with its subtypes) that have an ordered value
(matchers.sort_key) in one field, sorted by that value and then by the space's order (oldest
first when FIFO), in a `sortedcontainers.SortedKeyList`: a range, a prefix or an order_by over
the field bisects it in O(log n) instead of walking the type. An entry whose field is absent,
null, or of no order (an array, list or map) is not in it.

`in_request_order` sorts gathered entries by a request's order_by, the one definition of that
order; the index walks (`OrderedField.walk`) give the same order lazily.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence

from sortedcontainers import SortedKeyList

from outrig.service.engine.matchers import Bounds, sort_key
from outrig.service.engine.model import OrderKey, StoredEntry

__all__ = ["OrderedField", "in_request_order"]

_AFTER = math.inf  # after every tie key: (*value, _AFTER) follows each (*value, tie)


def _arrival(stored: StoredEntry) -> int:
    return stored.arrival


def _latest_first(stored: StoredEntry) -> int:
    return -stored.arrival


class OrderedField:
    """The entries of one (type, field) that hold an ordered value there, by (value, space order)."""

    __slots__ = ("_entries", "field", "tie")

    def __init__(self, field: str, fifo: bool, entries: Iterable[StoredEntry] = ()) -> None:
        self.field = field
        self.tie = _arrival if fifo else _latest_first
        self._entries: SortedKeyList[StoredEntry, tuple[object, ...]] = SortedKeyList(
            (stored for stored in entries if sort_key(stored.fields.get(field)) is not None), key=self._key
        )

    def _key(self, stored: StoredEntry) -> tuple[object, ...]:
        return (*sort_key(stored.fields[self.field]), self.tie(stored))  # type: ignore[misc]

    def __len__(self) -> int:
        return len(self._entries)

    def holds(self, stored: StoredEntry) -> bool:
        """Whether `stored` belongs in this index (has an ordered value in the field)."""
        return sort_key(stored.fields.get(self.field)) is not None

    def add(self, stored: StoredEntry) -> None:
        if sort_key(stored.fields.get(self.field)) is not None:
            self._entries.add(stored)

    def discard(self, stored: StoredEntry) -> None:
        if sort_key(stored.fields.get(self.field)) is not None:
            self._entries.remove(stored)

    def _span(self, bounds: Bounds | None) -> tuple[int, int]:
        if bounds is None:
            return 0, len(self._entries)
        start = self._entries.bisect_key_left(bounds[0])
        stop = self._entries.bisect_key_left(bounds[1])
        return start, max(start, stop)

    def count(self, bounds: Bounds | None) -> int:
        """How many entries lie within `bounds` (all of them for None): two bisections."""
        start, stop = self._span(bounds)
        return stop - start

    def within(self, bounds: Bounds | None) -> Iterator[StoredEntry]:
        """The entries within `bounds`, by value."""
        start, stop = self._span(bounds)
        return self._entries.islice(start, stop)

    def walk(self, descending: bool, bounds: Bounds | None = None) -> Iterator[Iterator[StoredEntry]]:
        """The entries within `bounds` in groups of equal value, ascending or descending by value;
        each group in the space's order. Lazily, a bisection per group: a priority take looks at
        one group, and the oldest entry of a range is the oldest of its groups' first entries.

        By key ranges (`irange_key`), never by position: a position in a sorted list of a million
        entries is a walk of its positional index (about log2 of its thousand sublists in
        Python, the index rebuilt whole after a sublist splits or merges), a key range two
        bisections in C."""
        low, high = bounds if bounds is not None else (None, None)
        entries = self._entries
        if not descending:
            while True:
                rest = entries.irange_key(low, high, (True, False))
                head = next(rest, None)
                if head is None:
                    return
                low = (*self._value(head), _AFTER)
                yield self._group(head, rest, low)
        while True:
            top = next(entries.irange_key(low, high, (True, False), reverse=True), None)
            if top is None:
                return
            high = self._value(top)
            start = high if low is None else max(low, high)
            yield entries.irange_key(start, (*high, _AFTER), (True, False))

    def _group(
        self, head: StoredEntry, rest: Iterator[StoredEntry], after: tuple[object, ...]
    ) -> Iterator[StoredEntry]:
        """The group of `head`: it, then what follows it below the key `after`. A merge of groups
        that stops at the first match looks no further into the others."""
        yield head
        key = self._key
        for stored in rest:
            if not key(stored) < after:
                return
            yield stored

    def _value(self, stored: StoredEntry) -> tuple[object, ...]:
        return sort_key(stored.fields[self.field])  # type: ignore[return-value]


def in_request_order(
    entries: Iterable[StoredEntry], order_by: Sequence[OrderKey], fifo: bool
) -> list[StoredEntry]:
    """Entries sorted by `order_by`, each key ascending or descending; an entry whose field holds
    no ordered value (absent, null, an array, list or map) after all that do, whichever the
    direction; ties in the space's order (oldest first when `fifo`).

    Stable sorts, from the last key to the first (Python's sort stays stable when reversed)."""
    result = sorted(entries, key=_arrival, reverse=not fifo)
    for field, descending in reversed(order_by):
        if descending:
            result.sort(key=lambda s, f=field: _descending_key(s, f), reverse=True)  # type: ignore[misc]
        else:
            result.sort(key=lambda s, f=field: _ascending_key(s, f))  # type: ignore[misc]
    return result


def _ascending_key(stored: StoredEntry, field: str) -> tuple[object, ...]:
    key = sort_key(stored.fields.get(field))
    return (1, ()) if key is None else (0, key)


def _descending_key(stored: StoredEntry, field: str) -> tuple[object, ...]:
    key = sort_key(stored.fields.get(field))
    return (0, ()) if key is None else (1, key)
