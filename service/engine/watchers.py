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

A written entry then finds the watchers that could match it with one dict lookup per type in
its lineage and per field of it that the type's watchers wait on, one more per distinct prefix
length parked on a string field, a walk of the sorted maps and the interval map of the value's
kind that stops at the first range that does not hold the value (none at all when it lies beyond
every range there), one look per field with parked `Missing` or `Not` waiters, and one bucket
skipped there: the `Not(v)` waiters of the value v itself. A template filed by its
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

    __slots__ = ("above", "below", "between", "highest", "lowest")

    def __init__(self) -> None:
        self.above: SortedDict[tuple[object, ...], OrderedDict[int, W]] = SortedDict()
        self.below: SortedDict[tuple[object, ...], OrderedDict[int, W]] = SortedDict()
        self.between: IntervalMap[tuple[object, ...], OrderedDict[int, W]] = IntervalMap()
        # The least low end of `above`, the greatest high end of `below` (None when empty): a
        # value below the one (or at or above the other) is in none of them, at one comparison.
        self.lowest: tuple[object, ...] | None = None
        self.highest: tuple[object, ...] | None = None

    def add(self, bounds: Bounds, watcher: W) -> bool:
        """File `watcher` by `bounds`; False if it is filed there already (by another template)."""
        start, stop = bounds
        if stop == (start[0], 1):  # open above (open below too, perhaps: either map is exact)
            filed = _into(self.above, start, watcher)
        elif start == (stop[0], 0):
            filed = _into(self.below, stop, watcher)
        else:
            bucket = self.between.get(start, stop)
            if bucket is None:
                bucket = OrderedDict()
                self.between.put(start, stop, bucket)
            elif watcher.seq in bucket:
                return False
            bucket[watcher.seq] = watcher
            return True
        self._ends()
        return filed

    def remove(self, bounds: Bounds, seq: int) -> bool:
        start, stop = bounds
        if stop == (start[0], 1):
            removed = _out(self.above, start, seq)
        elif start == (stop[0], 0):
            removed = _out(self.below, stop, seq)
        else:
            bucket = self.between.get(start, stop)
            if bucket is None or bucket.pop(seq, None) is None:
                return False
            if not bucket:
                self.between.pop(start, stop)
            return True
        self._ends()
        return removed

    def _ends(self) -> None:
        self.lowest = self.above.peekitem(0)[0] if self.above else None
        self.highest = self.below.peekitem(-1)[0] if self.below else None

    def find(self, at: tuple[object, ...], found: dict[int, W]) -> None:
        """Add the watchers whose range holds the point `at` to `found`."""
        lowest, highest, between = self.lowest, self.highest, self.between
        if lowest is not None and lowest <= at:
            above = self.above
            for start in above:
                if at < start:
                    break
                found.update(above[start])
        if highest is not None and at < highest:
            below = self.below
            for stop in reversed(below):
                if stop <= at:
                    break
                found.update(below[stop])
        least = between.least
        if least is not None and least <= at < between.most:  # type: ignore[operator]
            for bucket in between.stab(at):
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


def _place(template: Template) -> list[tuple[str, str, object]]:
    """Where to file a template, within its type: ("never", "", None), ("any", "", None),
    ("equal", field, key), ("prefix", field, (kind, prefix)), ("range", field, (kind, bounds)),
    ("present", field, None), ("missing", field, None) or ("not", field, value)."""
    if template.fields:
        name, value = template.fields[0]
        return [("equal", name, value.key)]
    if template.empty:
        return [("never", "", None)]
    sets = [(name, values) for name, m in template.matchers if (values := m.equals()) is not None]
    if sets:
        name, values = min(sets, key=lambda item: len(item[1]))
        return [("equal", name, value.key) for value in values]
    for name, matcher in template.matchers:
        if isinstance(matcher, Prefix):
            return [("prefix", name, (matcher.kind, matcher.prefix))]
    for name, matcher in template.matchers:
        bounds = matcher.bounds()
        if bounds is not None:
            return [("range", name, (_KIND_OF_RANK[bounds[0][0]], bounds))]  # type: ignore[index]
    conditions = [(name, part) for name, matcher in template.matchers for part in _parts(matcher)]
    for wanted in ("present", "missing"):
        for name, part in conditions:
            if isinstance(part, Presence) and part.present is (wanted == "present"):
                return [(wanted, name, None)]
    for name, part in conditions:
        if isinstance(part, NotEqual):
            return [("not", name, part.value)]
    return [("any", "", None)]


class _TypeWaiters(Generic[W]):
    """The watchers of one type, by where their templates are filed (see the module's doc)."""

    __slots__ = ("absent", "any", "equal", "fields", "filed", "prefixes", "present", "ranges")

    def __init__(self) -> None:
        self.any: OrderedDict[int, W] = OrderedDict()  # the type and nothing more
        self.equal: dict[tuple[str, Hashable], OrderedDict[int, W]] = {}  # (field, value key)
        self.prefixes: dict[tuple[str, str], _Prefixes[W]] = {}  # (field, kind)
        self.ranges: dict[tuple[str, str], _Ranges[W]] = {}  # (field, kind)
        self.present: dict[str, OrderedDict[int, W]] = {}
        self.absent: _Absent[W] = _Absent()
        # Filings by field (for the fields a write has: a field nobody waits on costs one
        # lookup), and in all (the type is dropped when none is left).
        self.fields: Counter[str] = Counter()
        self.filed = 0

    def file(self, how: str, name: str, detail: object, watcher: W) -> bool:
        """File `watcher`; False if it is filed there already (by another of its templates)."""
        if how == "any":
            filed = watcher.seq not in self.any
            self.any[watcher.seq] = watcher
        elif how == "equal":
            filed = _into(self.equal, (name, detail), watcher)
        elif how == "prefix":
            kind, prefix = cast(tuple[str, str | bytes], detail)
            filed = self.prefixes.setdefault((name, kind), _Prefixes()).add(prefix, watcher)
        elif how == "range":
            kind, bounds = cast(tuple[str, Bounds], detail)
            filed = self.ranges.setdefault((name, kind), _Ranges()).add(bounds, watcher)
        elif how == "present":
            filed = _into(self.present, name, watcher)
        elif how == "missing":
            filed = _into(self.absent.missing, name, watcher)
        else:
            filed = _into(self.absent.nots.setdefault(name, {}), cast(FieldValue, detail), watcher)
        if filed:
            self.filed += 1
            if how != "any":
                self.fields[name] += 1
        return filed

    def unfile(self, how: str, name: str, detail: object, seq: int) -> bool:
        if how == "any":
            unfiled = self.any.pop(seq, None) is not None
        elif how == "equal":
            unfiled = _out(self.equal, (name, detail), seq)
        elif how == "prefix":
            kind, prefix = cast(tuple[str, str | bytes], detail)
            prefixes = self.prefixes.get((name, kind))
            unfiled = prefixes is not None and prefixes.remove(prefix, seq)
            if prefixes is not None and not prefixes:
                del self.prefixes[name, kind]
        elif how == "range":
            kind, bounds = cast(tuple[str, Bounds], detail)
            ranges = self.ranges.get((name, kind))
            unfiled = ranges is not None and ranges.remove(bounds, seq)
            if ranges is not None and not ranges:
                del self.ranges[name, kind]
        elif how == "present":
            unfiled = _out(self.present, name, seq)
        elif how == "missing":
            unfiled = _out(self.absent.missing, name, seq)
        else:
            by_value = self.absent.nots.get(name)
            unfiled = by_value is not None and _out(by_value, cast(FieldValue, detail), seq)
            if by_value is not None and not by_value:
                del self.absent.nots[name]
        if unfiled:
            self.filed -= 1
            if how != "any":
                self.fields[name] -= 1
                if not self.fields[name]:
                    del self.fields[name]
        return unfiled

    def find(self, fields: Mapping[str, FieldValue], found: dict[int, W]) -> None:
        """Add the watchers of this type that `fields` may match to `found`."""
        if self.any:
            found.update(self.any)
        watched = self.fields
        if not watched:
            return
        equal, prefixes, ranges, present = self.equal, self.prefixes, self.ranges, self.present
        for name, value in fields.items():
            if name not in watched:
                continue
            if equal:
                bucket = equal.get((name, value.key))
                if bucket:
                    found.update(bucket)
            if prefixes:
                waiting = prefixes.get((name, value.kind))
                if waiting is not None and isinstance(value.data, str | bytes):
                    waiting.find(value.data, found)
            if ranges:
                waiting_ranges = ranges.get((name, value.kind))
                if waiting_ranges is not None:
                    at = point(value)
                    if at is not None:
                        waiting_ranges.find(at, found)
            if present and value.kind != "null":
                bucket = present.get(name)
                if bucket:
                    found.update(bucket)
        if self.absent:
            self.absent.find(fields, found)

    def buckets(self) -> Iterable[OrderedDict[int, W]]:
        yield self.any
        yield from self.equal.values()
        for prefixes in self.prefixes.values():
            yield from prefixes.by_prefix.values()
        for ranges in self.ranges.values():
            yield from ranges.buckets()
        yield from self.present.values()
        yield from self.absent.buckets()


class WatcherIndex(Generic[W]):
    """Watchers filed by template, found by the entries that could wake them."""

    def __init__(self) -> None:
        # OrderedDicts so that iterating a bucket never walks slots left by departed watchers.
        self._types: dict[str, _TypeWaiters[W]] = {}  # a write skips the types nobody waits on
        self._never: OrderedDict[int, W] = OrderedDict()  # templates that match nothing
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def add(self, watcher: W) -> None:
        for template in watcher.templates:
            for how, name, detail in _place(template):
                if how == "never":
                    self._never[watcher.seq] = watcher
                    continue
                waiters = self._types.get(template.type_name)
                if waiters is None:
                    waiters = self._types[template.type_name] = _TypeWaiters()
                waiters.file(how, name, detail, watcher)
        self._count += 1

    def remove(self, watcher: W) -> None:
        """Unfile `watcher`; removing one that is not filed does nothing."""
        removed = self._never.pop(watcher.seq, None) is not None
        for template in watcher.templates:
            waiters = self._types.get(template.type_name)
            if waiters is None:
                continue
            for how, name, detail in _place(template):
                if how != "never" and waiters.unfile(how, name, detail, watcher.seq):
                    removed = True
            if not waiters.filed:
                del self._types[template.type_name]
        if removed:
            self._count -= 1

    def candidates(self, entry: StoredEntry) -> list[W]:
        """Watchers with a template that may match `entry`, in the order they were added."""
        if not self._count:
            return []
        found: dict[int, W] = {}
        types, fields = self._types, entry.fields
        for type_name in entry.lineage:
            waiters = types.get(type_name)
            if waiters is not None:
                waiters.find(fields, found)
        if len(found) < 2:
            return list(found.values())
        return [found[seq] for seq in sorted(found)]

    def all(self) -> Iterable[W]:
        seen: dict[int, W] = dict(self._never)
        for waiters in self._types.values():
            for bucket in waiters.buckets():
                seen.update(bucket)
        return list(seen.values())
