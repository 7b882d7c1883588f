"""Matchers, which go where a value goes in a template, and the order keys of `order_by`. No I/O.

::

    Job(region="eu", priority=outrig.GE(5))                  # priority >= 5
    Job(region=outrig.OneOf("eu", "uk"), name=outrig.Prefix("resize-"))
    Job(priority=outrig.All(outrig.GE(1), outrig.Not(3)))    # both, on one field
    space.take(Job(), order_by=outrig.desc("priority"))      # a priority queue

Each constructor is typed as the value it compares with (`GE(5)` is an `int` to mypy), so that a
matcher fits any template field's annotation; at run time it is a `Matcher`, which the SDK sends
as the template's ``matchers`` (outrig.v1.Matcher). Values compare within their kind, as
equality does: an int range never matches a float or a bool. The server refuses a matcher of the
wrong kind (a range over dicts, a NaN bound, bounds of two kinds) with `InvalidArgumentError`
naming the field.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, TypeVar, cast, overload

from outrig.v1 import space_pb2 as pb

__all__ = [
    "GE",
    "GT",
    "LE",
    "LT",
    "All",
    "Matcher",
    "Missing",
    "Not",
    "OneOf",
    "OrderBy",
    "OrderKey",
    "Prefix",
    "Present",
    "Range",
    "asc",
    "desc",
    "fill_order",
]

T = TypeVar("T")
AnyStr = TypeVar("AnyStr", str, bytes)


class Matcher:
    """A condition on one template field beyond equality (made by `Range`, `GE`, `Prefix`, ...).

    `fill` writes it into an ``outrig.v1.Matcher``; `encode_value` (from _codec, passed in to keep
    the modules apart) encodes the values it compares with, naming the field in its errors."""

    __slots__ = ()

    def fill(self, target: pb.Matcher, encode: Any, field: str) -> None:
        raise NotImplementedError


class _Equal(Matcher):
    __slots__ = ("value",)

    def __init__(self, value: object) -> None:
        self.value = value

    def fill(self, target: pb.Matcher, encode: Any, field: str) -> None:
        target.equal.CopyFrom(encode(self.value, field))

    def __repr__(self) -> str:
        return f"outrig.Equal({self.value!r})"


class _Range(Matcher):
    __slots__ = ("high", "high_inclusive", "low", "low_inclusive")

    def __init__(self, low: object, low_inclusive: bool, high: object, high_inclusive: bool) -> None:
        if low is None and high is None:
            raise ValueError("a range needs a low or a high bound (or both)")
        self.low, self.low_inclusive = low, low_inclusive
        self.high, self.high_inclusive = high, high_inclusive

    def fill(self, target: pb.Matcher, encode: Any, field: str) -> None:
        target.range.SetInParent()
        if self.low is not None:
            target.range.low.CopyFrom(encode(self.low, field))
            target.range.low_inclusive = self.low_inclusive
        if self.high is not None:
            target.range.high.CopyFrom(encode(self.high, field))
            target.range.high_inclusive = self.high_inclusive

    def __repr__(self) -> str:
        left = "(-inf" if self.low is None else ("[" if self.low_inclusive else "(") + repr(self.low)
        right = "+inf)" if self.high is None else repr(self.high) + ("]" if self.high_inclusive else ")")
        return f"outrig.Range{left}, {right}"


class _Prefix(Matcher):
    __slots__ = ("prefix",)

    def __init__(self, prefix: str | bytes) -> None:
        self.prefix = prefix

    def fill(self, target: pb.Matcher, encode: Any, field: str) -> None:
        target.prefix.CopyFrom(encode(self.prefix, field))

    def __repr__(self) -> str:
        return f"outrig.Prefix({self.prefix!r})"


class _OneOf(Matcher):
    __slots__ = ("values",)

    def __init__(self, values: tuple[object, ...]) -> None:
        if not values:
            raise ValueError("OneOf needs at least one value")
        self.values = values

    def fill(self, target: pb.Matcher, encode: Any, field: str) -> None:
        target.one_of.values.extend(encode(value, field) for value in self.values)

    def __repr__(self) -> str:
        return f"outrig.OneOf{self.values!r}"


class _Not(Matcher):
    __slots__ = ("value",)

    def __init__(self, value: object) -> None:
        self.value = value

    def fill(self, target: pb.Matcher, encode: Any, field: str) -> None:
        target.not_equal.CopyFrom(encode(self.value, field))

    def __repr__(self) -> str:
        return f"outrig.Not({self.value!r})"


class _Presence(Matcher):
    __slots__ = ("present",)

    def __init__(self, present: bool) -> None:
        self.present = present

    def fill(self, target: pb.Matcher, encode: Any, field: str) -> None:
        target.present = self.present

    def __repr__(self) -> str:
        return "outrig.Present" if self.present else "outrig.Missing"


class _All(Matcher):
    __slots__ = ("matchers",)

    def __init__(self, matchers: tuple[Matcher, ...]) -> None:
        if not matchers:
            raise ValueError("All needs at least one matcher")
        self.matchers = matchers

    def fill(self, target: pb.Matcher, encode: Any, field: str) -> None:
        target.all.SetInParent()
        for matcher in self.matchers:
            matcher.fill(target.all.matchers.add(), encode, field)

    def __repr__(self) -> str:
        return f"outrig.All{self.matchers!r}"


def _matcher(value: object) -> Matcher:
    """A part of `All`: a matcher, or a plain value (equality)."""
    return value if isinstance(value, Matcher) else _Equal(value)


# The public constructors: capitalised like the values they stand for in a template.


def Range(  # noqa: N802
    low: T | None = None, high: T | None = None, *, low_inclusive: bool = True, high_inclusive: bool = True
) -> T:
    """Values from `low` to `high` (None: unbounded on that side), both ends included unless
    said otherwise: ``Range(1, 10, high_inclusive=False)`` is 1 <= value < 10."""
    return cast(T, _Range(low, low_inclusive, high, high_inclusive))


def GT(value: T) -> T:  # noqa: N802
    """Values greater than `value` (of its kind)."""
    return cast(T, _Range(value, False, None, False))


def GE(value: T) -> T:  # noqa: N802
    """Values greater than or equal to `value` (of its kind)."""
    return cast(T, _Range(value, True, None, False))


def LT(value: T) -> T:  # noqa: N802
    """Values less than `value` (of its kind)."""
    return cast(T, _Range(None, False, value, False))


def LE(value: T) -> T:  # noqa: N802
    """Values less than or equal to `value` (of its kind)."""
    return cast(T, _Range(None, False, value, True))


@overload
def Prefix(prefix: str) -> str: ...
@overload
def Prefix(prefix: bytes) -> bytes: ...
def Prefix(prefix: str | bytes) -> str | bytes:  # noqa: N802
    """Strings (or bytes) that start with `prefix`."""
    return cast(str, _Prefix(prefix))


def OneOf(*values: T) -> T:  # noqa: N802
    """Values equal to one of `values`."""
    return cast(T, _OneOf(values))


def Not(value: T) -> T:  # noqa: N802
    """Values not equal to `value` (an absent or None field is not equal to it, so it matches)."""
    return cast(T, _Not(value))


def All(*matchers: T) -> T:  # noqa: N802
    """Every one of `matchers` (or plain values, for equality) on one field."""
    return cast(T, _All(tuple(_matcher(m) for m in matchers)))


Present: Any = _Presence(True)
"""The entry's field holds a value (it is not None)."""

Missing: Any = _Presence(False)
"""The entry's field holds None (or the entry has no such field)."""


# ---------------------------------------------------------------- order_by


@dataclass(frozen=True, slots=True)
class OrderKey:
    """One key of `order_by`: a field, ascending or descending. A plain field name is ascending."""

    field: str
    descending: bool = False


def asc(field: str) -> OrderKey:
    """Order by `field`, smallest first."""
    return OrderKey(field)


def desc(field: str) -> OrderKey:
    """Order by `field`, largest first: ``take(..., order_by=desc("priority"))`` is a priority queue."""
    return OrderKey(field, True)


OrderBy = str | OrderKey | Iterable[str | OrderKey] | None
"""What `order_by` takes: a field name, a key, or a list of them, in turn; None for the space's order."""


def fill_order(target: Any, order_by: OrderBy) -> None:
    """Add `order_by`'s keys to a request's repeated ``order_by`` field."""
    if order_by is None:
        return
    keys = [order_by] if isinstance(order_by, str | OrderKey) else list(order_by)
    for key in keys:
        if isinstance(key, str):
            target.add(field=key)
        elif isinstance(key, OrderKey):
            target.add(field=key.field, descending=key.descending)
        else:
            raise TypeError(
                f"order_by: expected a field name or outrig.desc(...), got {type(key).__qualname__}"
            )
