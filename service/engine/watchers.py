"""An index of things that wait on templates (blocked reads/takes, notify registrations).

Each watcher is filed once per template, in the narrowest place its template allows:

- under (type, field, key) for the template's first set field (equality);
- else under (type, field, key) for each value of its smallest set matcher (`OneOf`);
- else by its prefix (`Prefix`), per (type, field, kind);
- else by its range (`Range`, or the narrowest part of an `All`), per (type, field, kind): a
  range open above by its low end, one open below by its high end (two sorted maps), a range
  bounded on both sides in an interval map (stabbing.py);
- else by `Present`, per (type, field); else by `Missing`, per type and field; else by
  `Not(v)`, per type and field and then by v (each alone, or as a part of an `All`);
- else under (type,): a template of a type and nothing more matches every entry of it;
- nowhere, if its template can match nothing (an empty range).

A written entry then finds the watchers that could match it with one dict lookup per (type in
its lineage) x (its fields), one more per distinct prefix length parked on a string field, a
walk of the sorted maps and the interval map of a field's kind that stops at the first range
that does not hold the value, one look per field with parked `Missing` or `Not` waiters, and
one bucket skipped there: the `Not(v)` waiters of the value v itself. A template filed by its
only condition is looked at by exactly the writes that match it: the cost of a write depends on
the entry's shape and on the watchers that match it, not on how many are parked. One filed by
one of several conditions is looked at by the writes that meet that one.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Hashable, Iterable, Mapping, MutableMapping
from typing import Generic, Protocol, TypeVar, cast

from sortedcontainers import SortedDict

from outrig.service.engine.matchers import (
    ORDERED_KINDS,
    All,
    Bounds,
    Matcher,
    NotEqual,
    Prefix,
    Presence,
    point,
)
from outrig.service.engine.model import StoredEntry, Template
from outrig.service.engine.stabbing import IntervalMap
from outrig.service.engine.values import FieldValue


class Watcher(Protocol):
    @property
    def seq(self) -> int: ...

    @property
    def templates(self) -> tuple[Template, ...]: ...


W = TypeVar("W", bound=Watcher)

_NEVER = object()  # the slot of templates that match nothing: no write looks there
_KIND_OF_RANK = {rank: kind for kind, rank in ORDERED_KINDS.items()}


class _Prefixes(Generic[W]):
    """Watchers of one (type, field, kind) by the prefix they wait for."""

    __slots__ = ("by_prefix", "lengths")

    def __init__(self) -> None:
        self.by_prefix: dict[str | bytes, OrderedDict[int, W]] = {}
        self.lengths: Counter[int] = Counter()

    def add(self, prefix: str | bytes, watcher: W) -> bool:
        bucket = self.by_prefix.setdefault(prefix, OrderedDict())
        if watcher.seq in bucket:
            return False
        bucket[watcher.seq] = watcher
        self.lengths[len(prefix)] += 1
        return True

    def remove(self, prefix: str | bytes, seq: int) -> bool:
        bucket = self.by_prefix.get(prefix)
        if bucket is None or bucket.pop(seq, None) is None:
            return False
        if not bucket:
            del self.by_prefix[prefix]
        self.lengths[len(prefix)] -= 1
        if not self.lengths[len(prefix)]:
            del self.lengths[len(prefix)]
        return True

    def find(self, data: str | bytes, found: dict[int, W]) -> None:
        by_prefix = self.by_prefix
        for length in self.lengths:
            if length <= len(data):
                bucket = by_prefix.get(data[:length])
                if bucket:
                    found.update(bucket)

    def __bool__(self) -> bool:
        return bool(self.by_prefix)


H = TypeVar("H", bound=Hashable)


def _into(buckets: MutableMapping[H, OrderedDict[int, W]], key: H, watcher: W) -> bool:
    """File `watcher` in the bucket of `key`; False if it is there already (by another template)."""
    bucket = buckets.get(key)
    if bucket is None:
        bucket = buckets[key] = OrderedDict()
    elif watcher.seq in bucket:
        return False
    bucket[watcher.seq] = watcher
    return True


def _out(buckets: MutableMapping[H, OrderedDict[int, W]], key: H, seq: int) -> bool:
    """Unfile `seq` from the bucket of `key` (dropping the bucket when it empties); False if it
    was not there."""
    bucket = buckets.get(key)
    if bucket is None or bucket.pop(seq, None) is None:
        return False
    if not bucket:
        del buckets[key]
    return True


class _Ranges(Generic[W]):
    """Watchers of one (type, field, kind) by the range they wait for: those open above by its
    low end, those open below by its high end, those bounded on both sides by the interval.

    A value is held by exactly the ranges open above whose low end is at or below it (a prefix
    of `above`), those open below whose high end is past it (a suffix of `below`), and what the
    interval map finds: each walk stops at the first range that does not hold it."""

    __slots__ = ("above", "below", "between")

    def __init__(self) -> None:
        self.above: SortedDict[tuple[object, ...], OrderedDict[int, W]] = SortedDict()
        self.below: SortedDict[tuple[object, ...], OrderedDict[int, W]] = SortedDict()
        self.between: IntervalMap[tuple[object, ...], OrderedDict[int, W]] = IntervalMap()

    def add(self, bounds: Bounds, watcher: W) -> bool:
        """File `watcher` by `bounds`; False if it is filed there already (by another template)."""
        start, stop = bounds
        if stop == (start[0], 1):  # open above (open below too, perhaps: either map is exact)
            return _into(self.above, start, watcher)
        if start == (stop[0], 0):
            return _into(self.below, stop, watcher)
        bucket = self.between.get(start, stop)
        if bucket is None:
            bucket = OrderedDict()
            self.between.put(start, stop, bucket)
        elif watcher.seq in bucket:
            return False
        bucket[watcher.seq] = watcher
        return True

    def remove(self, bounds: Bounds, seq: int) -> bool:
        start, stop = bounds
        if stop == (start[0], 1):
            return _out(self.above, start, seq)
        if start == (stop[0], 0):
            return _out(self.below, stop, seq)
        bucket = self.between.get(start, stop)
        if bucket is None or bucket.pop(seq, None) is None:
            return False
        if not bucket:
            self.between.pop(start, stop)
        return True

    def find(self, at: tuple[object, ...], found: dict[int, W]) -> None:
        """Add the watchers whose range holds the point `at` to `found`."""
        above, below = self.above, self.below
        if above:
            for start in above:
                if at < start:
                    break
                found.update(above[start])
        if below:
            for stop in reversed(below):
                if stop <= at:
                    break
                found.update(below[stop])
        if self.between:
            for bucket in self.between.stab(at):
                found.update(bucket)

    def buckets(self) -> Iterable[OrderedDict[int, W]]:
        yield from self.above.values()
        yield from self.below.values()
        yield from (bucket for _, bucket in self.between.items())

    def __bool__(self) -> bool:
        return bool(self.above or self.below or self.between)


class _Absent(Generic[W]):
    """Watchers of one type that a field's absence can wake: `Missing` ones by field, `Not(v)`
    ones by field and then v."""

    __slots__ = ("missing", "nots")

    def __init__(self) -> None:
        self.missing: dict[str, OrderedDict[int, W]] = {}
        self.nots: dict[str, dict[FieldValue, OrderedDict[int, W]]] = {}

    def find(self, fields: Mapping[str, FieldValue], found: dict[int, W]) -> None:
        for name, bucket in self.missing.items():
            value = fields.get(name)
            if value is None or value.kind == "null":
                found.update(bucket)
        for name, by_value in self.nots.items():
            value = fields.get(name)
            skipped = by_value.get(value) if value is not None else None  # Not(v) for v itself
            for bucket in by_value.values():
                if bucket is not skipped:
                    found.update(bucket)

    def buckets(self) -> Iterable[OrderedDict[int, W]]:
        yield from self.missing.values()
        for by_value in self.nots.values():
            yield from by_value.values()

    def __bool__(self) -> bool:
        return bool(self.missing or self.nots)


def _parts(matcher: Matcher) -> tuple[Matcher, ...]:
    return matcher.matchers if isinstance(matcher, All) else (matcher,)


def _place(template: Template) -> list[tuple[str, Hashable, object]]:
    """Where to file a template: ("slot", key, None), ("prefix", (type, field, kind), prefix),
    ("range", (type, field, kind), bounds), ("present", (type, field), None), ("missing",
    type, field) or ("not", type, (field, value))."""
    type_name = template.type_name
    if template.fields:
        name, value = template.fields[0]
        return [("slot", (type_name, name, value.key), None)]
    if template.empty:
        return [("slot", _NEVER, None)]
    sets = [(name, values) for name, m in template.matchers if (values := m.equals()) is not None]
    if sets:
        name, values = min(sets, key=lambda item: len(item[1]))
        return [("slot", (type_name, name, value.key), None) for value in values]
    for name, matcher in template.matchers:
        if isinstance(matcher, Prefix):
            return [("prefix", (type_name, name, matcher.kind), matcher.prefix)]
    for name, matcher in template.matchers:
        bounds = matcher.bounds()
        if bounds is not None:
            kind = _KIND_OF_RANK[bounds[0][0]]  # type: ignore[index]
            return [("range", (type_name, name, kind), bounds)]
    conditions = [(name, part) for name, matcher in template.matchers for part in _parts(matcher)]
    for wanted in (True, False):
        for name, part in conditions:
            if isinstance(part, Presence) and part.present is wanted:
                return [("present", (type_name, name), None) if wanted else ("missing", type_name, name)]
    for name, part in conditions:
        if isinstance(part, NotEqual):
            return [("not", type_name, (name, part.value))]
    return [("slot", (type_name,), None)]


class WatcherIndex(Generic[W]):
    """Watchers filed by template, found by the entries that could wake them."""

    def __init__(self) -> None:
        # OrderedDicts so that iterating a bucket never walks slots left by departed watchers.
        self._slots: dict[Hashable, OrderedDict[int, W]] = {}
        self._prefixes: dict[Hashable, _Prefixes[W]] = {}
        self._ranges: dict[Hashable, _Ranges[W]] = {}
        self._present: dict[Hashable, OrderedDict[int, W]] = {}
        self._absent: dict[str, _Absent[W]] = {}
        # How many watchers wait on each type, so a write skips types nobody waits on.
        self._types: dict[str, int] = {}
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def add(self, watcher: W) -> None:
        for template in watcher.templates:
            for how, key, detail in _place(template):
                if self._file(how, key, detail, watcher):
                    self._types[template.type_name] = self._types.get(template.type_name, 0) + 1
        self._count += 1

    def _file(self, how: str, key: Hashable, detail: object, watcher: W) -> bool:
        if how == "prefix":
            return self._prefixes.setdefault(key, _Prefixes()).add(detail, watcher)  # type: ignore[arg-type]
        if how == "range":
            return self._ranges.setdefault(key, _Ranges()).add(detail, watcher)  # type: ignore[arg-type]
        if how == "present":
            return _into(self._present, key, watcher)
        if how == "missing":
            missing = self._absent.setdefault(cast(str, key), _Absent()).missing
            return _into(missing, cast(str, detail), watcher)
        if how == "not":
            name, value = cast(tuple[str, FieldValue], detail)
            nots = self._absent.setdefault(cast(str, key), _Absent()).nots
            return _into(nots.setdefault(name, {}), value, watcher)
        return _into(self._slots, key, watcher)

    def remove(self, watcher: W) -> None:
        """Unfile `watcher`; removing one that is not filed does nothing."""
        removed = False
        for template in watcher.templates:
            for how, key, detail in _place(template):
                if not self._unfile(how, key, detail, watcher.seq):
                    continue
                removed = True
                left = self._types[template.type_name] - 1
                if left:
                    self._types[template.type_name] = left
                else:
                    del self._types[template.type_name]
        if removed:
            self._count -= 1

    def _unfile(self, how: str, key: Hashable, detail: object, seq: int) -> bool:
        if how == "prefix":
            prefixes = self._prefixes.get(key)
            if prefixes is None or not prefixes.remove(detail, seq):  # type: ignore[arg-type]
                return False
            if not prefixes:
                del self._prefixes[key]
            return True
        if how == "range":
            ranges = self._ranges.get(key)
            if ranges is None or not ranges.remove(detail, seq):  # type: ignore[arg-type]
                return False
            if not ranges:
                del self._ranges[key]
            return True
        if how == "present":
            return _out(self._present, key, seq)
        if how in ("missing", "not"):
            absent = self._absent.get(cast(str, key))
            if absent is None:
                return False
            if how == "missing":
                removed = _out(absent.missing, cast(str, detail), seq)
            else:
                name, value = cast(tuple[str, FieldValue], detail)
                by_value = absent.nots.get(name)
                removed = by_value is not None and _out(by_value, value, seq)
                if by_value is not None and not by_value:
                    del absent.nots[name]
            if not absent:
                del self._absent[cast(str, key)]
            return removed
        return _out(self._slots, key, seq)

    def candidates(self, entry: StoredEntry) -> list[W]:
        """Watchers with a template that may match `entry`, in the order they were added."""
        if not self._count:
            return []
        found: dict[int, W] = {}
        slots, prefixes, ranges = self._slots, self._prefixes, self._ranges
        present, absent = self._present, self._absent
        fields = entry.fields
        for type_name in entry.lineage:
            if type_name not in self._types:
                continue
            bucket = slots.get((type_name,))
            if bucket:
                found.update(bucket)
            for name, value in fields.items():
                bucket = slots.get((type_name, name, value.key))
                if bucket:
                    found.update(bucket)
                if prefixes:
                    waiting = prefixes.get((type_name, name, value.kind))
                    if waiting is not None and isinstance(value.data, str | bytes):
                        waiting.find(value.data, found)
                if ranges:
                    waiting_ranges = ranges.get((type_name, name, value.kind))
                    if waiting_ranges is not None:
                        at = point(value)
                        if at is not None:
                            waiting_ranges.find(at, found)
                if present and value.kind != "null":
                    bucket = present.get((type_name, name))
                    if bucket:
                        found.update(bucket)
            if absent:
                waiting_absent = absent.get(type_name)
                if waiting_absent is not None:
                    waiting_absent.find(fields, found)
        return [found[seq] for seq in sorted(found)]

    def all(self) -> Iterable[W]:
        seen: dict[int, W] = {}
        for bucket in self._slots.values():
            seen.update(bucket)
        for bucket in self._present.values():
            seen.update(bucket)
        for prefixes in self._prefixes.values():
            for waiting in prefixes.by_prefix.values():
                seen.update(waiting)
        for ranges in self._ranges.values():
            for bucket in ranges.buckets():
                seen.update(bucket)
        for absent in self._absent.values():
            for bucket in absent.buckets():
                seen.update(bucket)
        return list(seen.values())
