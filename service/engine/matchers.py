"""Matchers: conditions on one field of an entry beyond equality, and the order of values.

A template's equality fields (model.Template.fields) are the fast path and stay as they were.
A matcher says more of one field: a range, a prefix, a set of values, not equal, present or
missing, or all of several. Values compare within their canonical kind only (values.py): an int
range never holds a double or a bool, a string prefix never matches bytes.

Ordered kinds and their place in one total order (`sort_key`): bool < int < double < string <
bytes, each by value (strings by code point, bytes bytewise, false < true); a double NaN comes
after every other double, and -0.0 and 0.0 tie. Arrays, lists, maps and null have no order.

A range or prefix is kept as two bisection keys (`Bounds`) in that order: `low` is the first key
in it, `high` the first past it, compared against `point(value)`. The ordered indexes (ordered.py)
and the parked waiters' range index (watchers.py) both bisect by them, so a bound means the same
thing everywhere.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterable

from outrig.service.engine.values import FieldValue

__all__ = [
    "ORDERED_KINDS",
    "All",
    "Bounds",
    "Equal",
    "Matcher",
    "NotEqual",
    "OneOf",
    "Prefix",
    "Presence",
    "Range",
    "SortKey",
    "point",
    "sort_key",
]

ORDERED_KINDS = {"bool": 0, "int": 1, "double": 2, "string": 3, "bytes": 4}
"""The kinds a range or order compares, by their rank in the total order."""

SortKey = tuple[int, int, object]
"""(kind rank, 1 for a NaN else 0, value): a value's place in the total order."""

Bounds = tuple[tuple[object, ...], tuple[object, ...]]
"""(low, high): a range of sort keys, `low <= point(value) < high`."""

_unpack_double = struct.Struct("<d").unpack
_AFTER = math.inf  # after every arrival: (*key, _AFTER) follows each (*key, arrival)
_MAX_CODE_POINT = 0x10FFFF


def sort_key(value: FieldValue | None) -> SortKey | None:
    """A value's place in the total order of ordered values; None for a value of no order (an
    array, list, map or null) or an absent one."""
    if value is None:
        return None
    rank = ORDERED_KINDS.get(value.kind)
    if rank is None:
        return None
    data = value.data
    if rank == 2:
        number = _unpack_double(data)[0]  # type: ignore[arg-type]  # a double's data is 8 bytes
        return (2, 1, 0.0) if number != number else (2, 0, number)
    if isinstance(data, memoryview):
        data = bytes(data)
    return (rank, 0, data)


def point(value: FieldValue) -> tuple[object, ...] | None:
    """Where a value lies among `Bounds` (None: in no range)."""
    key = sort_key(value)
    if key is None or key[1]:
        return None
    return (*key, 0)


class Matcher:
    """One condition on one field: `test` is given the entry's value (None when absent)."""

    __slots__ = ()

    def test(self, value: FieldValue | None) -> bool:
        raise NotImplementedError

    def bounds(self) -> Bounds | None:
        """The range of sort keys every matching value lies in, if the matcher says (a range or a
        prefix): what an ordered index or the waiters' range index can look up."""
        return None

    def equals(self) -> tuple[FieldValue, ...] | None:
        """The values a matching field must equal one of, if the matcher says (a set or an
        equality): a union of equality buckets."""
        return None

    @property
    def empty(self) -> bool:
        """True when nothing can match (an empty range)."""
        return False


class Equal(Matcher):
    __slots__ = ("value",)

    def __init__(self, value: FieldValue) -> None:
        self.value = value

    def test(self, value: FieldValue | None) -> bool:
        return value == self.value

    def equals(self) -> tuple[FieldValue, ...]:
        return (self.value,)

    def __repr__(self) -> str:
        return f"Equal({self.value!r})"


class NotEqual(Matcher):
    """Not equal to a value: an absent or null field equals no value, so it matches."""

    __slots__ = ("value",)

    def __init__(self, value: FieldValue) -> None:
        self.value = value

    def test(self, value: FieldValue | None) -> bool:
        return value != self.value

    def __repr__(self) -> str:
        return f"NotEqual({self.value!r})"


class OneOf(Matcher):
    __slots__ = ("values",)

    def __init__(self, values: Iterable[FieldValue]) -> None:
        self.values = frozenset(values)

    def test(self, value: FieldValue | None) -> bool:
        return value in self.values

    def equals(self) -> tuple[FieldValue, ...]:
        return tuple(self.values)

    def __repr__(self) -> str:
        return f"OneOf({sorted(self.values, key=repr)!r})"


class Presence(Matcher):
    """`present`: the field holds a value (not null); else it is absent or null."""

    __slots__ = ("present",)

    def __init__(self, present: bool) -> None:
        self.present = present

    def test(self, value: FieldValue | None) -> bool:
        return (value is not None and value.kind != "null") is self.present

    def __repr__(self) -> str:
        return "Present" if self.present else "Missing"


class Range(Matcher):
    """Values of one ordered kind between two bounds, each inclusive or not, or unbounded (None).

    `low` and `high` are sort keys' values (int, float, str, bytes, bool) of the kind `kind`."""

    __slots__ = ("_bounds", "high", "high_inclusive", "kind", "low", "low_inclusive")

    def __init__(
        self,
        kind: str,
        low: object | None,
        low_inclusive: bool,
        high: object | None,
        high_inclusive: bool,
    ) -> None:
        rank = ORDERED_KINDS[kind]
        self.kind = kind
        self.low, self.low_inclusive = low, low_inclusive
        self.high, self.high_inclusive = high, high_inclusive
        if low is None:
            start: tuple[object, ...] = (rank, 0)
        else:
            start = (rank, 0, low) if low_inclusive else (rank, 0, low, _AFTER)
        if high is None:
            stop: tuple[object, ...] = (rank, 1)  # before the NaNs: a NaN is in no range
        else:
            stop = (rank, 0, high, _AFTER) if high_inclusive else (rank, 0, high)
        self._bounds: Bounds = (start, stop)

    def test(self, value: FieldValue | None) -> bool:
        if value is None or value.kind != self.kind:
            return False
        found = point(value)
        start, stop = self._bounds
        return found is not None and start <= found < stop

    def bounds(self) -> Bounds:
        return self._bounds

    @property
    def empty(self) -> bool:
        start, stop = self._bounds
        return not start < stop

    def __repr__(self) -> str:
        left = "(-inf" if self.low is None else ("[" if self.low_inclusive else "(") + repr(self.low)
        right = "+inf)" if self.high is None else repr(self.high) + ("]" if self.high_inclusive else ")")
        return f"Range({self.kind}, {left}, {right})"


def _successor(prefix: str | bytes) -> str | bytes | None:
    """The least string (bytes) greater than every one that starts with `prefix`; None if none
    is (the prefix is all maximal code points or 0xff bytes)."""
    if isinstance(prefix, str):
        text = prefix.rstrip(chr(_MAX_CODE_POINT))
        return text[:-1] + chr(ord(text[-1]) + 1) if text else None
    data = prefix.rstrip(b"\xff")
    return data[:-1] + bytes((data[-1] + 1,)) if data else None


class Prefix(Matcher):
    """Strings (or bytes) that start with `prefix`, a value of `kind` "string" or "bytes"."""

    __slots__ = ("_bounds", "kind", "prefix")

    def __init__(self, kind: str, prefix: str | bytes) -> None:
        rank = ORDERED_KINDS[kind]
        self.kind = kind
        self.prefix = prefix
        after = _successor(prefix)
        self._bounds: Bounds = ((rank, 0, prefix), (rank, 1) if after is None else (rank, 0, after))

    def test(self, value: FieldValue | None) -> bool:
        if value is None or value.kind != self.kind:
            return False
        data = value.data
        return isinstance(data, str | bytes) and data.startswith(self.prefix)  # type: ignore[arg-type]

    def bounds(self) -> Bounds:
        return self._bounds

    def __repr__(self) -> str:
        return f"Prefix({self.prefix!r})"


class All(Matcher):
    """Every one of several matchers (on the same field)."""

    __slots__ = ("matchers",)

    def __init__(self, matchers: Iterable[Matcher]) -> None:
        self.matchers = tuple(matchers)

    def test(self, value: FieldValue | None) -> bool:
        return all(matcher.test(value) for matcher in self.matchers)

    def bounds(self) -> Bounds | None:
        """The narrowest of the parts' bounds (their intersection would be narrower, but each
        part is checked anyway)."""
        found = [bounds for matcher in self.matchers if (bounds := matcher.bounds()) is not None]
        if not found:
            return None
        start = max(bounds[0] for bounds in found)
        stop = min(bounds[1] for bounds in found)
        return (start, stop)

    def equals(self) -> tuple[FieldValue, ...] | None:
        found = [values for matcher in self.matchers if (values := matcher.equals()) is not None]
        return min(found, key=len) if found else None

    @property
    def empty(self) -> bool:
        bounds = self.bounds()
        return any(matcher.empty for matcher in self.matchers) or (
            bounds is not None and not bounds[0] < bounds[1]
        )

    def __repr__(self) -> str:
        return f"All({', '.join(map(repr, self.matchers))})"
