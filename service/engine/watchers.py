"""An index of things that wait on templates (blocked reads/takes, notify registrations).

Each watcher is filed once per template: under (type, field, key) for the template's first set
field, or under (type,) when the template has no set fields. A written entry then finds every
watcher that could match it with one dict lookup per (type in its lineage) x (its fields): the
cost of a write depends on the entry's shape, never on how many watchers are parked.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Iterable
from typing import Generic, Protocol, TypeVar

from outrig.service.engine.model import StoredEntry, Template


class Watcher(Protocol):
    @property
    def seq(self) -> int: ...

    @property
    def templates(self) -> tuple[Template, ...]: ...


W = TypeVar("W", bound=Watcher)


def _slot(template: Template) -> Hashable:
    if template.fields:
        name, value = template.fields[0]
        return (template.type_name, name, value.key)
    return (template.type_name,)


class WatcherIndex(Generic[W]):
    """Watchers filed by template, found by the entries that could wake them."""

    def __init__(self) -> None:
        # OrderedDicts so that iterating a bucket never walks slots left by departed watchers.
        self._slots: dict[Hashable, OrderedDict[int, W]] = {}
        # How many watchers wait on each type, so a write skips types nobody waits on.
        self._types: dict[str, int] = {}
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def add(self, watcher: W) -> None:
        for template in watcher.templates:
            bucket = self._slots.setdefault(_slot(template), OrderedDict())
            if watcher.seq in bucket:  # two templates of one watcher in the same slot
                continue
            bucket[watcher.seq] = watcher
            self._types[template.type_name] = self._types.get(template.type_name, 0) + 1
        self._count += 1

    def remove(self, watcher: W) -> None:
        """Unfile `watcher`; removing one that is not filed does nothing."""
        removed = False
        for template in watcher.templates:
            slot = _slot(template)
            bucket = self._slots.get(slot)
            if bucket is None or bucket.pop(watcher.seq, None) is None:
                continue
            removed = True
            if not bucket:
                del self._slots[slot]
            left = self._types[template.type_name] - 1
            if left:
                self._types[template.type_name] = left
            else:
                del self._types[template.type_name]
        if removed:
            self._count -= 1

    def candidates(self, entry: StoredEntry) -> list[W]:
        """Watchers with a template that may match `entry`, in the order they were added."""
        if not self._count:
            return []
        found: dict[int, W] = {}
        slots = self._slots
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
        return [found[seq] for seq in sorted(found)]

    def all(self) -> Iterable[W]:
        seen: dict[int, W] = {}
        for bucket in self._slots.values():
            seen.update(bucket)
        return list(seen.values())
