"""An index of things that wait on templates (blocked reads/takes, notify registrations).

Each watcher is filed once per template, in the narrowest place its template allows:

- under (type, field, key) for the template's first set field (equality);
- else under (type, field, key) for each value of its smallest set matcher (`OneOf`);
- else by its prefix (`Prefix`), per (type, field, kind);
- else by its range (`Range`, or the narrowest part of an `All`), per (type, field);
- else under (type,): every write of the type looks at it (`Not`, `Present`, `Missing`);
- nowhere, if its template can match nothing (an empty range).

A written entry then finds the watchers that could match it with one dict lookup per (type in
its lineage) x (its fields), one more per distinct prefix length parked on a string field, and
two bisections per field with parked ranges: the cost of a write depends on the entry's shape
and on the watchers that may match it, not on how many are parked. A range's bisections look at
the ranges that start at or below the value, or at those that end above it, whichever are
fewer: exactly the matching ones for one-sided ranges (`GE`, `LT`, ...), a few more for
two-sided ranges that straddle nothing.
"""

from __future__ import annotations

import math
from collections import Counter, OrderedDict
from collections.abc import Hashable, Iterable
from typing import Any, Generic, Protocol, TypeVar

from sortedcontainers import SortedList

from outrig.service.engine.matchers import Bounds, Prefix, point
from outrig.service.engine.model import StoredEntry, Template


class Watcher(Protocol):
    @property
    def seq(self) -> int: ...

    @property
    def templates(self) -> tuple[Template, ...]: ...


W = TypeVar("W", bound=Watcher)

_NEVER = object()  # the slot of templates that match nothing: no write looks there


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


class _Ranges(Generic[W]):
    """Watchers of one (type, field) by the range they wait for, sorted by each end."""

    __slots__ = ("by_seq", "starts", "stops")

    def __init__(self) -> None:
        self.by_seq: dict[int, tuple[Bounds, W]] = {}
        self.starts: SortedList[tuple[tuple[object, ...], int]] = SortedList()  # (start, seq)
        self.stops: SortedList[tuple[tuple[object, ...], int]] = SortedList()  # (stop, seq)

    def add(self, bounds: Bounds, watcher: W) -> bool:
        """File `watcher` by `bounds`; False if it is filed here already (by another template)."""
        if watcher.seq in self.by_seq:
            return False
        self.by_seq[watcher.seq] = (bounds, watcher)
        self.starts.add((bounds[0], watcher.seq))
        self.stops.add((bounds[1], watcher.seq))
        return True

    def remove(self, bounds: Bounds, seq: int) -> bool:
        filed = self.by_seq.get(seq)
        if filed is None or filed[0] != bounds:
            return False
        del self.by_seq[seq]
        self.starts.remove((bounds[0], seq))
        self.stops.remove((bounds[1], seq))
        return True

    def find(self, at: tuple[object, ...], found: dict[int, W]) -> None:
        """Add the watchers whose range holds the point `at` to `found`."""
        probe: Any = (at, math.inf)  # after every (at, seq)
        started = self.starts.bisect_right(probe)  # ranges with start <= at
        if not started:
            return
        ending = self.stops.bisect_right(probe)  # ranges with stop <= at: the rest end above it
        if ending == len(self.by_seq):
            return
        by_seq = self.by_seq
        if started <= len(self.by_seq) - ending:
            for _, seq in self.starts.islice(0, started):
                bounds, watcher = by_seq[seq]
                if at < bounds[1]:
                    found[seq] = watcher
        else:
            for _, seq in self.stops.islice(ending):
                bounds, watcher = by_seq[seq]
                if bounds[0] <= at:
                    found[seq] = watcher

    def __bool__(self) -> bool:
        return bool(self.by_seq)


def _place(template: Template) -> list[tuple[str, Hashable, object]]:
    """Where to file a template: ("slot", key, None), ("prefix", (type, field, kind), prefix),
    or ("range", (type, field), bounds)."""
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
            return [("range", (type_name, name), bounds)]
    return [("slot", (type_name,), None)]


class WatcherIndex(Generic[W]):
    """Watchers filed by template, found by the entries that could wake them."""

    def __init__(self) -> None:
        # OrderedDicts so that iterating a bucket never walks slots left by departed watchers.
        self._slots: dict[Hashable, OrderedDict[int, W]] = {}
        self._prefixes: dict[Hashable, _Prefixes[W]] = {}
        self._ranges: dict[Hashable, _Ranges[W]] = {}
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
            ranges = self._ranges.setdefault(key, _Ranges())
            if ranges.add(detail, watcher):  # type: ignore[arg-type]
                return True
            if ranges.by_seq[watcher.seq][0] == detail:
                return False  # the same range, from another of its templates: filed already
            key = key[:1]  # type: ignore[index]  # another range on that field: its type's slot
        bucket = self._slots.setdefault(key, OrderedDict())
        if watcher.seq in bucket:  # two templates of one watcher in the same slot
            return False
        bucket[watcher.seq] = watcher
        return True

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
            if ranges is not None and ranges.remove(detail, seq):  # type: ignore[arg-type]
                if not ranges:
                    del self._ranges[key]
                return True
            key = key[:1]  # type: ignore[index]  # filed under its type's slot (see _file)
        bucket = self._slots.get(key)
        if bucket is None or bucket.pop(seq, None) is None:
            return False
        if not bucket:
            del self._slots[key]
        return True

    def candidates(self, entry: StoredEntry) -> list[W]:
        """Watchers with a template that may match `entry`, in the order they were added."""
        if not self._count:
            return []
        found: dict[int, W] = {}
        slots, prefixes, ranges = self._slots, self._prefixes, self._ranges
        for type_name in entry.lineage:
            if type_name not in self._types:
                continue
            bucket = slots.get((type_name,))
            if bucket:
                found.update(bucket)
            for name, value in entry.fields.items():
                bucket = slots.get((type_name, name, value.key))
                if bucket:
                    found.update(bucket)
                if prefixes:
                    waiting = prefixes.get((type_name, name, value.kind))
                    if waiting is not None and isinstance(value.data, str | bytes):
                        waiting.find(value.data, found)
                if ranges:
                    waiting_ranges = ranges.get((type_name, name))
                    if waiting_ranges is not None:
                        at = point(value)
                        if at is not None:
                            waiting_ranges.find(at, found)
        return [found[seq] for seq in sorted(found)]

    def all(self) -> Iterable[W]:
        seen: dict[int, W] = {}
        for bucket in self._slots.values():
            seen.update(bucket)
        for prefixes in self._prefixes.values():
            for waiting in prefixes.by_prefix.values():
                seen.update(waiting)
        for ranges in self._ranges.values():
            seen.update((seq, watcher) for seq, (_, watcher) in ranges.by_seq.items())
        return list(seen.values())
