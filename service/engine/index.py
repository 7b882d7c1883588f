"""Where a space's entries are filed: by type, and by (type, field, value), in arrival order.

Every entry is filed under each type of its lineage (its type and all supertypes), in arrival
order, and under (type, field, value key) for each field. So a template of a supertype finds its
subtypes in one bucket, a template with set fields starts from its smallest (field, value)
bucket, and a wildcard template walks its type in arrival order: nothing scans the space.

Ordered indexes (ordered.py) file the entries of a (type, field) by value, for ranges, prefixes
and order_by: made when a template first needs one (or declared by the space's settings), then
kept up by every insert and remove. `plan` picks, for a template with matchers or a request with
an order, the source that costs least: an equality bucket, a union of them (a set of values), a
range of an ordered index, or a walk of the order's index; every candidate is checked in full
afterwards, as before.

Only the filing: `insert` and `remove` are plain dict operations (and sorted-list ones for the
ordered indexes) and touch nothing else. The engine (space.py) keeps the entries by id, their
leases and their locks, and makes each of its calls all or nothing around these steps.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
from collections import OrderedDict
from collections.abc import Hashable, Iterable, Iterator, Sequence

from outrig.service.engine.matchers import Bounds
from outrig.service.engine.model import OrderKey, StoredEntry, Template
from outrig.service.engine.ordered import OrderedField, in_request_order
from outrig.service.engine.values import FULL_KEY_LIMIT, FieldValue

__all__ = ["Bucket", "EntryIndex"]

Bucket = OrderedDict[int, StoredEntry] | StoredEntry
"""The entries filed under one key, in arrival order; a (type, field, value) slot of one entry
holds it bare."""

Slots = dict[Hashable, Bucket]
"""The slots of one (type, field): a value key's bucket."""

Fields = dict[str, Slots]
"""The slots of one type, by field."""


# A range of at most this many distinct values is read as its groups of one value each (each in
# arrival order, in the ordered index), merged: the oldest match at the cost of a bisection per
# group, however the matches are spread in arrival order.
_MERGED_GROUPS = 32


_Last = tuple[FieldValue, Slots, Bucket]
"""What `insert_many` and `remove_many` remember of a (type, field) from an earlier entry of the
batch: its value, the (type, field)'s slots and what that value's slot holds."""


_FORGOTTEN = FieldValue("null", None)
"""In a `_Last`, the value of no entry: the (type, field)'s slots are remembered, not a bucket."""


def _shares(entries: Sequence[StoredEntry]) -> bool:
    """Whether a batch's second entry has a field whose value is the first's very `FieldValue`:
    then `insert_many` and `remove_many` remember the buckets from entry to entry. Without it
    (values read one entry at a time, each its own object), remembering them only costs: 0.80
    of one `insert` after the other when the bench's entries share three fields of four, 1.25
    when they share none."""
    if len(entries) < 2:
        return False
    first = entries[0].fields
    return any(first.get(name) is value for name, value in entries[1].fields.items())


def _size(bucket: Bucket) -> int:
    return 1 if isinstance(bucket, StoredEntry) else len(bucket)


def _arrival(stored: StoredEntry) -> int:
    return stored.arrival


def _reorder(bucket: OrderedDict[int, StoredEntry], stored: StoredEntry) -> None:
    """Move `stored`, just appended to `bucket` (in arrival order but for it), to its place.

    Walks from both ends at once and stops at its place, so it costs the smaller of the entries
    before and after it: a redelivered entry, the oldest again as a rule, is O(1), not a walk of
    the queue (measured before: 1.6 ms to return one entry to a bucket of 10,000)."""
    arrival, others = stored.arrival, len(bucket) - 1
    before: list[int] = []  # from the front: arrived before it
    after: list[int] = []  # from the back (it is last): arrived after it
    front, back = iter(bucket.values()), reversed(bucket.values())
    next(back)
    while len(before) + len(after) < others:
        first = next(front)
        if first.arrival > arrival:  # its place is right behind `before`
            bucket.move_to_end(stored.id, last=False)
            for entry_id in reversed(before):
                bucket.move_to_end(entry_id, last=False)
            return
        before.append(first.id)
        if len(before) + len(after) == others:
            break  # every other one placed: those after it go behind it
        last = next(back)
        if last.arrival < arrival:  # its place is right before `after`
            for entry_id in reversed(after):
                bucket.move_to_end(entry_id)
            return
        after.append(last.id)
    for entry_id in reversed(after):  # the walks met: those after it go behind it
        bucket.move_to_end(entry_id)


class EntryIndex:
    """A space's entries by type and by (type, field, value key), found by templates."""

    def __init__(self, fifo: bool = True, indexes: Iterable[tuple[str, str]] = ()) -> None:
        self._fifo = fifo  # the space's order: oldest first, or newest first
        # Buckets are OrderedDicts, not dicts: a dict iterates over the slots its deletions left
        # behind until it is next resized, so taking the oldest entry of a plain dict that once
        # held n entries can cost O(n) (measured: 74 us vs 0.4 us per take at 1,000,000).
        # A (type, field, value) slot holds its one entry itself, or an OrderedDict once it has
        # more: most slots of unique values (ids, counters) hold one entry, and a container each
        # would cost ~400 bytes (measured: 1,879 bytes per two-field entry with containers).
        # The slots are kept by type, then field, then value key: a slot is found by two
        # lookups of a name (string keys, their hashes cached) and one of the value's key (the
        # very `value.key` object it was filed under, when an entry is unfiled), not by a (type,
        # field, key) tuple made, hashed and compared for each field of each entry. A field's
        # slots are kept once emptied (bounded by the names a space files), so that a space
        # emptied by each take does not make them again for each write (3% of an engine pair).
        self._by_type: dict[str, OrderedDict[int, StoredEntry]] = {}
        self._by_field: dict[str, Fields] = {}
        # Ordered indexes by type, then field: empty until a template needs one (or declared).
        self._ordered: dict[str, dict[str, OrderedField]] = {}
        for type_name, field in indexes:
            self.ordered(type_name, field)

    # ------------------------------------------------------------------ filing

    def insert(self, stored: StoredEntry) -> None:
        """File an entry at the back of each of its buckets."""
        entry_id = stored.id
        by_type, by_field = self._by_type, self._by_field
        for type_name in stored.lineage:
            bucket = by_type.get(type_name)
            if bucket is None:
                bucket = by_type[type_name] = OrderedDict()
            bucket[entry_id] = stored
            fields = by_field.get(type_name)
            for name, value in stored.fields.items():
                if fields is None:
                    fields = by_field[type_name] = {}
                slots = fields.get(name)
                if slots is None:
                    slots = fields[name] = {}
                key = value.key
                current = slots.get(key)
                if current is None:
                    slots[key] = stored
                elif isinstance(current, StoredEntry):
                    slots[key] = OrderedDict(((current.id, current), (entry_id, stored)))
                else:
                    current[entry_id] = stored
        if self._ordered:
            for ordered in self._ordered_of(stored):
                ordered.add(stored)

    def insert_many(self, entries: Sequence[StoredEntry]) -> None:
        """`insert` of a batch's entries, in order, all or nothing: if filing one fails, what was
        filed of it and of those before it is unfiled again (`_unfile`).

        One entry after the other, as `insert` files it, but the buckets of consecutive entries
        of one lineage are remembered (`_Last`): the type's buckets are looked up once for the
        run, and a field whose value is the very `FieldValue` the field had in an earlier entry
        of the run (the codec's one-pass reading shares a batch's equal values) goes straight to
        that slot's bucket, and any other value of the field is looked up in the (type, field)'s
        slots remembered from the earlier entry. So each bucket, and the slots' order in the
        index, end as one `insert` after the other leaves them."""
        if not _shares(entries):
            insert, filed = self.insert, 0
            try:
                for stored in entries:
                    insert(stored)
                    filed += 1
            except BaseException:
                self._unfile(entries[: filed + 1])
                raise
            return
        by_field = self._by_field
        lineage: tuple[str, ...] = ()
        runs: list[tuple[str, OrderedDict[int, StoredEntry], dict[str, _Last]]] = []
        filed = 0
        try:
            for stored in entries:
                entry_id = stored.id
                if stored.lineage is not lineage and stored.lineage != lineage:
                    lineage = stored.lineage  # a new run: its types' buckets, nothing remembered
                    runs = [(t, self._typed(t), {}) for t in lineage]
                items = stored.fields.items()
                for type_name, typed, last in runs:
                    typed[entry_id] = stored
                    for name, value in items:
                        seen = last.get(name)
                        if seen is None:  # the run's first value of the field: its slots
                            fields = by_field.get(type_name)
                            if fields is None:
                                fields = by_field[type_name] = {}
                            slots = fields.get(name)
                            if slots is None:
                                slots = fields[name] = {}
                        elif seen[0] is value:  # the slot of an earlier entry
                            earlier = seen[2]
                            if type(earlier) is OrderedDict:
                                earlier[entry_id] = stored
                            else:  # that entry alone, bare
                                assert isinstance(earlier, StoredEntry)
                                bucket = seen[1][value.key] = OrderedDict(
                                    ((earlier.id, earlier), (entry_id, stored))
                                )
                                last[name] = (value, seen[1], bucket)
                            continue
                        else:
                            slots = seen[1]
                        key = value.key
                        current = slots.get(key)
                        if current is None:  # a value's first entry (each of a unique field's)
                            slots[key] = stored
                            if seen is None:
                                last[name] = (value, slots, stored)
                            # else what is remembered still holds (the slot is another value's):
                            # an entry sharing this value finds it in the slots, no tuple made
                            continue
                        if isinstance(current, StoredEntry):
                            current = OrderedDict(((current.id, current), (entry_id, stored)))
                            slots[key] = current
                        else:
                            current[entry_id] = stored
                        last[name] = (value, slots, current)
                if self._ordered:
                    for ordered in self._ordered_of(stored):
                        ordered.add(stored)
                filed += 1
        except BaseException:
            self._unfile(entries[: filed + 1])
            raise

    def _typed(self, type_name: str) -> OrderedDict[int, StoredEntry]:
        """The bucket of a type, made if the type has none."""
        bucket = self._by_type.get(type_name)
        if bucket is None:
            bucket = self._by_type[type_name] = OrderedDict()
        return bucket

    def _unfile(self, entries: Sequence[StoredEntry]) -> None:
        """Undo what a failed `insert_many` filed of `entries` (the last one perhaps in part;
        none of them was filed before)."""
        by_type, by_field = self._by_type, self._by_field
        for stored in entries:
            if self._ordered:
                for ordered in self._ordered_of(stored):
                    with contextlib.suppress(ValueError):  # not added yet
                        ordered.discard(stored)
            entry_id = stored.id
            for type_name in stored.lineage:
                bucket = by_type.get(type_name)
                if bucket is not None:
                    bucket.pop(entry_id, None)
                    if not bucket:
                        del by_type[type_name]
                fields = by_field.get(type_name, {})
                for name, value in stored.fields.items():
                    slots = fields.get(name)
                    current = None if slots is None else slots.get(value.key)
                    if current is None:
                        continue
                    assert slots is not None
                    if isinstance(current, StoredEntry):
                        if current is stored:
                            del slots[value.key]
                    else:
                        current.pop(entry_id, None)
                        if not current:
                            del slots[value.key]
                        elif len(current) == 1:
                            slots[value.key] = next(iter(current.values()))

    def remove(self, stored: StoredEntry) -> None:
        """Unfile an entry that is filed."""
        entry_id = stored.id
        by_type, by_field = self._by_type, self._by_field
        for type_name in stored.lineage:
            bucket = by_type[type_name]
            del bucket[entry_id]
            if not bucket:
                del by_type[type_name]
            fields = by_field.get(type_name)
            for name, value in stored.fields.items():
                assert fields is not None
                slots = fields[name]
                key = value.key
                current = slots[key]
                if isinstance(current, StoredEntry):
                    del slots[key]
                else:
                    del current[entry_id]
                    if len(current) == 1:
                        slots[key] = next(iter(current.values()))
        if self._ordered:
            for ordered in self._ordered_of(stored):
                ordered.discard(stored)

    def remove_many(self, entries: Sequence[StoredEntry]) -> None:
        """`remove` of a batch's entries, each filed, one after the other, the buckets of
        consecutive entries of one lineage remembered as `insert_many` remembers them (a take's
        batch is found in arrival order, so its entries come as they were written). If unfiling
        one fails (only deletes of what is there: no more than a bug or an interrupt), those
        unfiled before it are filed again at their places."""
        if not _shares(entries):
            remove, unfiled = self.remove, 0
            try:
                for stored in entries:
                    remove(stored)
                    unfiled += 1
            except BaseException:
                for stored in entries[:unfiled]:
                    self.insert(stored)
                    self.reorder(stored)
                raise
            return
        by_type, by_field = self._by_type, self._by_field
        lineage: tuple[str, ...] = ()
        runs: list[tuple[str, OrderedDict[int, StoredEntry], dict[str, _Last]]] = []
        unfiled = 0
        try:
            for stored in entries:
                entry_id = stored.id
                if stored.lineage is not lineage and stored.lineage != lineage:
                    lineage = stored.lineage
                    runs = [(t, by_type[t], {}) for t in lineage]
                items = stored.fields.items()
                for type_name, typed, last in runs:
                    del typed[entry_id]
                    if not typed:
                        del by_type[type_name]
                    for name, value in items:
                        seen = last.get(name)
                        if seen is not None and seen[0] is value:  # a bucket of two or more
                            slots, current = seen[1], seen[2]
                        else:
                            slots = by_field[type_name][name] if seen is None else seen[1]
                            current = slots[value.key]
                            if isinstance(current, StoredEntry):
                                del slots[value.key]
                                if seen is None:  # its slots remembered, no bucket
                                    last[name] = (_FORGOTTEN, slots, current)
                                continue
                        assert not isinstance(current, StoredEntry)
                        del current[entry_id]
                        if len(current) == 1:
                            slots[value.key] = left = next(iter(current.values()))
                            last[name] = (_FORGOTTEN, slots, left)  # its slots, no bucket of two
                        elif seen is None or seen[2] is not current:
                            last[name] = (value, slots, current)
                if self._ordered:
                    for ordered in self._ordered_of(stored):
                        ordered.discard(stored)
                unfiled += 1
        except BaseException:
            for stored in entries[:unfiled]:
                self.insert(stored)
                self.reorder(stored)
            raise

    def _ordered_of(self, stored: StoredEntry) -> list[OrderedField]:
        """The ordered indexes of the types of an entry's lineage."""
        return [index for t in stored.lineage for index in self._ordered.get(t, {}).values()]

    def reorder(self, stored: StoredEntry) -> None:
        """Return an entry just filed again (undoing a step that failed, or a hidden entry shown
        again) to its place in arrival order: `insert` appended it to its buckets."""
        for type_name in stored.lineage:
            _reorder(self._by_type[type_name], stored)
            for name, value in stored.fields.items():
                bucket = self._by_field[type_name][name][value.key]
                if not isinstance(bucket, StoredEntry):
                    _reorder(bucket, stored)

    # ------------------------------------------------------------------ finding

    def bucket(self, template: Template) -> Bucket | None:
        """The smallest bucket holding every entry that can match `template`."""
        found = self.bucket_of(template)
        return None if found is None else found[0]

    def bucket_of(self, template: Template) -> tuple[Bucket, str | None] | None:
        """`bucket`, and the field whose bucket it is (None: the type's), for
        `Template.unfiled`: what its entries are known to match already."""
        type_name = template.type_name
        if not template.fields:
            bucket = self._by_type.get(type_name)
            return None if bucket is None else (bucket, None)
        fields = self._by_field.get(type_name)
        if fields is None:
            return None
        smallest: Bucket | None = None
        filed = ""
        least = 0
        for name, value in template.fields:
            slots = fields.get(name)
            found = None if slots is None else slots.get(value.key)
            if found is None:
                return None
            size = 1 if isinstance(found, StoredEntry) else len(found)
            if smallest is None or size < least:
                smallest, filed, least = found, name, size
        assert smallest is not None
        return smallest, filed

    def members(self, bucket: Bucket) -> Iterable[StoredEntry]:
        """A bucket's entries in the space's order (oldest first when FIFO)."""
        if isinstance(bucket, StoredEntry):
            return (bucket,)
        return bucket.values() if self._fifo else reversed(bucket.values())

    def in_order(self, entries: Iterable[StoredEntry]) -> list[StoredEntry]:
        """Entries gathered from several buckets, each once, in the space's order."""
        merged = {stored.id: stored for stored in entries}
        return sorted(merged.values(), key=_arrival, reverse=not self._fifo)

    def candidates(
        self, templates: Sequence[Template], order_by: Sequence[OrderKey] = ()
    ) -> list[StoredEntry]:
        """Every entry filed where one of `templates` could match it, in the space's order (or
        `order_by`'s): a copy of the buckets made at C speed. Not checked: some may not match, or
        have expired."""
        if order_by or any(template.matchers for template in templates):
            everything = 1 << 62
            found = [stored for template in templates for stored in self.plan(template, order_by, everything)]
            if len(templates) == 1:
                return found
            merged = {stored.id: stored for stored in found}
            return in_request_order(merged.values(), order_by, self._fifo)
        buckets = [bucket for bucket in map(self.bucket, templates) if bucket is not None]
        if len(buckets) == 1:
            return list(self.members(buckets[0]))
        return self.in_order(stored for bucket in buckets for stored in self.members(bucket))

    def first_candidates(
        self, templates: Sequence[Template], order_by: Sequence[OrderKey], limit: int
    ) -> tuple[list[StoredEntry], bool]:
        """The first `limit` filed entries that match one of `templates` (by the templates alone:
        expired or locked ones included), in the order `candidates` gives, and whether more may
        follow: a contents call with a bound reads no more of an ordered index than it needs."""
        found: dict[int, StoredEntry] = {}
        more = False
        for template in templates:
            taken = 0
            for stored in self.plan(template, order_by, limit):
                if not template.matches(stored):
                    continue
                if taken == limit:
                    more = True
                    break
                found[stored.id] = stored
                taken += 1
        if len(templates) == 1:
            return list(found.values()), more
        entries = in_request_order(found.values(), order_by, self._fifo)
        if len(entries) > limit:
            return entries[:limit], True
        return entries, more

    def exact_count(self, template: Template) -> int | None:
        """How many filed entries match `template`, when its bucket says so without looking (no
        field, or one whose key is the whole value); else None."""
        fields = template.fields
        if template.matchers:
            return None
        if fields and (len(fields) > 1 or fields[0][1].size > FULL_KEY_LIMIT):
            return None
        bucket = self.bucket(template)
        return 0 if bucket is None else _size(bucket)

    def in_request_order(
        self, entries: Iterable[StoredEntry], order_by: Sequence[OrderKey]
    ) -> list[StoredEntry]:
        """Entries gathered from several buckets, each once, in `order_by`'s order."""
        merged = {stored.id: stored for stored in entries}
        return in_request_order(merged.values(), order_by, self._fifo)

    # ------------------------------------------------------------------ ordered indexes

    def ordered(self, type_name: str, field: str) -> OrderedField:
        """The ordered index of (type, field), made from the type's entries on first need."""
        fields = self._ordered.setdefault(type_name, {})
        index = fields.get(field)
        if index is None:
            index = fields[field] = OrderedField(field, self._fifo, self._by_type.get(type_name, {}).values())
        return index

    def ordered_indexes(self) -> list[tuple[str, str, int]]:
        """(type, field, entries filed) of every ordered index."""
        return [(t, f, len(index)) for t, fields in self._ordered.items() for f, index in fields.items()]

    def plan(self, template: Template, order_by: Sequence[OrderKey], limit: int) -> Iterable[StoredEntry]:
        """The entries that may match `template`, in the space's order or `order_by`'s, lazily
        where it can be: the caller checks each, and stops after `limit` matches.

        The sources: the smallest equality bucket (the type's when there is none), a set
        matcher's union of buckets (both in arrival order), the narrowest range of an ordered
        index, and with an order, a walk of the first key's ordered index (in the order asked
        for). A range of few distinct values is read group by group (each group, of one value, is
        in arrival order), the groups merged; one of more values, n entries when the other
        sources hold s, is gathered and sorted when n * n <= limit * s, since walking s for
        `limit` matches spread among the n costs about limit * s / n."""
        if template.empty:
            return ()
        type_name = template.type_name
        typed = self._by_type.get(type_name)
        if typed is None:
            return ()
        base = self.bucket(template)
        if base is None:
            return ()
        size = _size(base)
        source: Iterable[StoredEntry] = self.members(base)
        ranged: tuple[OrderedField, Bounds, int] | None = None
        field_bounds: dict[str, Bounds] = {}
        by_field = self._by_field
        for name, matcher in template.matchers:
            values = matcher.equals()
            if values is not None:
                slots = by_field.get(type_name, {}).get(name, {})
                buckets = [b for v in values if (b := slots.get(v.key)) is not None]
                total = sum(map(_size, buckets))
                if not total:
                    return ()
                if total < size:
                    size, source = total, self._merged(buckets)
            bounds = matcher.bounds()
            if bounds is not None:
                field_bounds[name] = bounds
                index = self.ordered(type_name, name)
                count = index.count(bounds)
                if not count:
                    return ()
                if ranged is None or count < ranged[2]:
                    ranged = (index, bounds, count)
        if not order_by:
            if ranged is not None and ranged[2] < size:
                index, bounds, count = ranged
                groups = list(itertools.islice(index.walk(False, bounds), _MERGED_GROUPS + 1))
                if len(groups) <= _MERGED_GROUPS:  # few values: the groups merged by arrival
                    return heapq.merge(*groups, key=_arrival, reverse=not self._fifo)
                if count * count <= limit * size:
                    return self.in_order(index.within(bounds))
            return source
        smallest = size if ranged is None else min(size, ranged[2])
        if smallest < len(typed) and smallest * smallest <= limit * len(typed):
            if ranged is not None and ranged[2] < size:
                source = ranged[0].within(ranged[1])
            return in_request_order(source, order_by, self._fifo)
        return self._walk(type_name, typed, order_by, field_bounds.get(order_by[0][0]))

    def _merged(self, buckets: list[Bucket]) -> Iterator[StoredEntry]:
        """The entries of several buckets (of one field: each entry in one) in the space's order."""
        return heapq.merge(*(self.members(b) for b in buckets), key=_arrival, reverse=not self._fifo)

    def _walk(
        self,
        type_name: str,
        typed: OrderedDict[int, StoredEntry],
        order_by: Sequence[OrderKey],
        bounds: Bounds | None,
    ) -> Iterator[StoredEntry]:
        """The type's entries in `order_by`'s order, from the first key's ordered index (within
        `bounds`, a range the template puts on that field), then those it does not hold."""
        field, descending = order_by[0]
        index = self.ordered(type_name, field)
        rest = order_by[1:]
        for group in index.walk(descending, bounds):
            if rest:
                yield from in_request_order(group, rest, self._fifo)
            else:
                yield from group
        if bounds is None and len(index) < len(typed):  # those without an ordered value, last
            tail = (stored for stored in self.members(typed) if not index.holds(stored))
            if rest:
                yield from in_request_order(tail, rest, self._fifo)
            else:
                yield from tail

    def type_counts(self) -> dict[str, int]:
        """Entries filed under each type (of that type or a subtype)."""
        return {type_name: len(bucket) for type_name, bucket in self._by_type.items()}

    def field_slots(self) -> list[tuple[str, str, Hashable]]:
        """Every (type, field, value key) slot, a copy."""
        return [
            (t, f, key)
            for t, fields in self._by_field.items()
            for f, slots in fields.items()
            for key in slots
        ]

    def slot_buckets(self) -> list[tuple[tuple[str, str, Hashable], Bucket]]:
        """Every (type, field, value key) slot and what it holds, a copy (for tests and checks)."""
        return [
            ((t, f, key), bucket)
            for t, fields in self._by_field.items()
            for f, slots in fields.items()
            for key, bucket in slots.items()
        ]
