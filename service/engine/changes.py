"""A space's change log (issue 24): every change of its stored set, numbered, kept for a while.

Every write, take, expiry, cancel, purge and dead-letter move of a space gets a space-wide
sequence number `seq` (1, 2, 3 ..., gap-free, never reused within an epoch), assigned at the
change's commit point in the engine (space.py, deliveries.py, transacting.py) and appended here.
A reader's position is a seq: `after(seq)` gives the changes after it, in order, so replay and
live reading are one loop over the log (the backend's feed waits at the head for the next append).

Retention (SpaceSettings): at most `changes_max_count` changes, none older than
`changes_max_age` seconds, at most `changes_max_bytes` bytes (each change counting
len(payload) + CHANGE_OVERHEAD). The oldest go first: count and bytes are trimmed on append,
age by `trim` (the reaper's pass). A position older than the oldest held change - 1 is
compacted (`CompactedError`, carrying the oldest readable position); one ahead of the head is
invalid (`InvalidCursorError`).

The epoch is a random 63-bit number made with the log (a store records it with the log's first
change, so it survives restarts; a memory-only server makes a new one per start): a position of
another epoch is compacted, its log gone.

Durable subscriptions (named, per space) are positions kept here too: `subscribe` makes or
attaches one, at most one stream attached at once; `ack` moves it forward; `unsubscribe`
deletes it. They do not hold back retention.

What the log holds, for the cyclic collector: the changes' entries by seq (a taken entry lives
on here until retention drops its change) and, by seq too, each change's kind, time, transaction
and visible_at as one tuple of atomic values (shared by a batch's changes), which CPython's
collector untracks. A `Change` is made for whoever asks (the hook of `append_many`, `after`) and
not kept: an in-memory server's log holds 100,000 changes by default, and a slotted object per
change was walked by every full collection (docs/performance.md, "What the server keeps per pair,
and the collector").

Pure: no I/O; the backend records each change (its `on_change` hook) and restores the log at load.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable, Sequence
from typing import Final

from outrig.service.engine.model import (
    FROZEN_SIZE,
    FrozenEntry,
    Record,
    StoredEntry,
    frozen_entry,
    thawed_entry,
)
from outrig.service.exceptions import (
    CompactedError,
    InvalidCursorError,
    SubscriptionBusyError,
    SubscriptionNotFoundError,
)

__all__ = ["CHANGE_KINDS", "CHANGE_OVERHEAD", "Change", "ChangeLog", "new_epoch"]

CHANGE_KINDS = ("write", "take", "expire", "cancel", "purge", "dead")

#: What a change counts for towards changes_max_bytes, beyond its entry's payload.
CHANGE_OVERHEAD = 64

#: The kinds of change after which the entry is gone from its space for good: the log keeps it as
#: a `FrozenEntry` (model.py), in the place of its write's change too. Not "dead": a dead-letter
#: move may file the same entry in another space.
_GONE = frozenset(("take", "expire", "cancel", "purge"))


def new_epoch() -> int:
    """A fresh epoch: a random 63-bit number, never 0 (0 says "none" on the wire)."""
    return secrets.randbits(63) or 1


class Change(Record):
    """One change of a space's stored set: the entry as it was, when, and under which
    transaction (0: none); a delayed write's `visible_at` (epoch seconds). A `Record` (compared
    and hashed by its attributes, as the frozen dataclass it was): a batch logs one per entry."""

    __slots__ = ("at", "entry", "kind", "seq", "transaction", "visible_at")
    _fields = ("seq", "kind", "entry", "at", "transaction", "visible_at")

    def __init__(
        self,
        seq: int,
        kind: str,
        entry: StoredEntry,
        at: float,
        transaction: int = 0,
        visible_at: float | None = None,
    ) -> None:
        self.seq: Final = seq
        self.kind: Final = kind
        self.entry: Final = entry
        self.at: Final = at
        self.transaction: Final = transaction
        self.visible_at: Final = visible_at

    @property
    def size(self) -> int:
        """What the change counts for towards changes_max_bytes."""
        return self.entry.size + CHANGE_OVERHEAD  # the size of its payload (model.py)


class ChangeLog:
    """The change log of one space (see the module docstring)."""

    def __init__(
        self, max_count: int, max_age: float, max_bytes: int, *, epoch: int | None = None, space: str = ""
    ) -> None:
        self.max_count = max_count
        self.max_age = max_age
        self.max_bytes = max_bytes
        self.space = space  # for messages
        self.epoch = new_epoch() if epoch is None else epoch
        self.head = 0  # seq of the newest change; 0: none yet
        # By seq, looked up by key only (never iterated from the front, where trimming deletes):
        # each change's entry (a gone one frozen), and its (kind, at, transaction, visible_at).
        self._entries: dict[int, StoredEntry | FrozenEntry] = {}
        self._facts: dict[int, tuple[str, float, int, float | None]] = {}
        self._oldest = 1
        self._bytes = 0
        self.subscriptions: dict[str, int] = {}  # durable subscription -> position
        self.attached: set[str] = set()  # durable subscriptions a stream reads now

    # ------------------------------------------------------------------ figures

    @property
    def oldest(self) -> int:
        """The seq of the oldest held change (head + 1 when the log is empty)."""
        return self._oldest

    @property
    def count(self) -> int:
        return len(self._entries)

    @property
    def bytes(self) -> int:
        return self._bytes

    # ------------------------------------------------------------------ appending and reading

    def append(
        self,
        kind: str,
        entry: StoredEntry,
        at: float,
        transaction: int = 0,
        visible_at: float | None = None,
    ) -> Change:
        """Log a change at the next seq, then trim to the count and bytes limits."""
        seq = self.log_one(kind, entry, at, transaction, visible_at)
        return Change(seq, kind, entry, at, transaction, visible_at)

    def log_one(
        self,
        kind: str,
        entry: StoredEntry,
        at: float,
        transaction: int = 0,
        visible_at: float | None = None,
    ) -> int:
        """`append` without making the `Change` (for a caller that tells nobody of it): its seq."""
        seq = self.head = self.head + 1
        held = self._entries
        if kind in _GONE:
            # The entry as it leaves, in its write's place too (if the log still holds that
            # change as this entry), so that nothing of it is tracked here.
            frozen = held[seq] = frozen_entry(entry)
            if held.get(entry.logged) is entry:
                held[entry.logged] = frozen
        else:
            held[seq] = entry
            if kind == "write":
                entry.logged = seq
        self._facts[seq] = (kind, at, transaction, visible_at)
        self._bytes += entry.size + CHANGE_OVERHEAD  # its Change.size
        if len(held) > self.max_count or self._bytes > self.max_bytes:
            self._trim_size()
        return seq

    def append_many(
        self,
        kind: str,
        entries: Sequence[StoredEntry],
        at: float,
        transaction: int = 0,
        visible_at: float | None = None,
        *,
        made: bool = True,
    ) -> list[Change]:
        """`append` of a call's entries, in order, at one time: the same changes, trimmed once
        for the batch (so a full log drops its oldest in one pass, not one call per change).
        With `made=False` no `Change` is made (an empty list)."""
        first = self.head + 1
        seqs = range(first, first + len(entries))
        held = self._entries
        size = 0
        if kind in _GONE:
            for seq, stored in zip(seqs, entries, strict=True):
                # as in `append`: frozen, in its write's place too
                frozen = held[seq] = frozen_entry(stored)
                if held.get(stored.logged) is stored:
                    held[stored.logged] = frozen
                size += stored.size
        else:
            held.update(zip(seqs, entries, strict=True))
            if kind == "write":
                for seq, stored in zip(seqs, entries, strict=True):
                    stored.logged = seq
                    size += stored.size
            else:
                size = sum(stored.size for stored in entries)
        self._facts.update(dict.fromkeys(seqs, (kind, at, transaction, visible_at)))  # one tuple shared
        self.head = first + len(entries) - 1
        self._bytes += size + CHANGE_OVERHEAD * len(entries)  # Change.size of each
        if len(held) > self.max_count or self._bytes > self.max_bytes:
            self._trim_size()
        if not made:
            return []
        return [
            Change(seq, kind, stored, at, transaction, visible_at)
            for seq, stored in zip(seqs, entries, strict=True)
        ]

    def after(self, seq: int, limit: int) -> list[Change]:
        """Up to `limit` changes with a seq above `seq`, in order (from the oldest held, if `seq`
        is older: the caller checks positions with `check`)."""
        start = max(seq + 1, self._oldest)
        stop = min(self.head, start + limit - 1)
        held, known, changes = self._entries, self._facts, []
        for each in range(start, stop + 1):
            kind, at, transaction, visible_at = known[each]
            entry = held[each]
            stored = thawed_entry(entry) if isinstance(entry, tuple) else entry
            changes.append(Change(each, kind, stored, at, transaction, visible_at))
        return changes

    def check(self, position: int, field: str = "since") -> None:
        """Refuse a position this log cannot read after: compacted (older than the oldest held
        change - 1) or ahead of the head."""
        if position < self._oldest - 1:
            raise CompactedError(
                f"{field}: position {position} of space {self.space!r} is compacted (the oldest still "
                f"held is {self._oldest - 1})",
                epoch=self.epoch,
                oldest=self._oldest - 1,
            )
        if position > self.head:
            raise InvalidCursorError(
                f"{field}: position {position} of space {self.space!r} is ahead of the log's head {self.head}"
            )

    # ------------------------------------------------------------------ retention

    def _drop_oldest(self) -> None:
        del self._facts[self._oldest]
        self._bytes -= _size(self._entries.pop(self._oldest)) + CHANGE_OVERHEAD  # its Change.size
        self._oldest += 1

    def _trim_size(self) -> None:
        held, known, oldest, size = self._entries, self._facts, self._oldest, self._bytes
        while held and (len(held) > self.max_count or size > self.max_bytes):
            # `_drop_oldest`, with the figures in locals and `_size` inline (a full log drops a
            # change for each one added: a call each was 5% of a full log's logging of a batch pair)
            del known[oldest]
            entry = held.pop(oldest)
            if entry.__class__ is tuple:  # frozen: gone from its space
                size -= entry[FROZEN_SIZE] + CHANGE_OVERHEAD
            else:
                size -= entry.size + CHANGE_OVERHEAD  # type: ignore[union-attr]
            oldest += 1
        self._oldest, self._bytes = oldest, size

    def trim(self, now: float) -> int | None:
        """Drop what retention no longer keeps (count, bytes, and changes older than max_age
        seconds at `now`); the new oldest seq if it moved, else None."""
        before = self._oldest
        self._trim_size()
        cutoff = now - self.max_age
        known = self._facts
        while known and known[self._oldest][1] < cutoff:  # its `at`
            self._drop_oldest()
        return self._oldest if self._oldest != before else None

    def rewind(self, head: int) -> None:
        """Undo of a failed batch: drop the changes above `head` (what they trimmed stays gone)."""
        while self.head > head:
            stored = self._entries.pop(self.head, None)
            if stored is not None:
                del self._facts[self.head]
                self._bytes -= _size(stored) + CHANGE_OVERHEAD
            self.head -= 1
        self._oldest = min(self._oldest, self.head + 1)

    def restore(self, epoch: int, changes: Iterable[Change], head: int) -> None:
        """Put back a log a store recorded: its epoch, its changes (consecutive seqs, in order)
        and its head (which may exceed the last change's seq: a log emptied by trimming). A log
        with a gap, or whose last change is not its head, is held from after the gap (what
        cannot be shown whole is compacted, never shown with a hole)."""
        self.epoch = epoch
        self._entries.clear()
        self._facts.clear()
        self._bytes = 0
        loaded = list(changes)
        last = loaded[-1].seq if loaded else 0
        self.head = max(head, last)
        if last != self.head:
            loaded = []
        for at in range(len(loaded) - 1, 0, -1):
            if loaded[at].seq != loaded[at - 1].seq + 1:
                loaded = loaded[at:]
                break
        for change in loaded:
            self._entries[change.seq] = change.entry
            self._facts[change.seq] = (change.kind, change.at, change.transaction, change.visible_at)
            self._bytes += change.size
        self._oldest = loaded[0].seq if loaded else self.head + 1
        self._trim_size()

    # ------------------------------------------------------------------ durable subscriptions

    def subscribe(self, name: str, since: int | None) -> tuple[int, bool]:
        """Attach a stream to the durable subscription `name`: (its position, whether it was made
        now, at `since`, None: the head). Refused while another stream is attached, and for a
        position retention no longer holds."""
        if name in self.attached:
            raise SubscriptionBusyError(
                f"durable: subscription {name!r} of space {self.space!r} already has a stream attached"
            )
        position = self.subscriptions.get(name)
        made = position is None
        if position is None:
            position = self.head if since is None else since
        self.check(position, "since" if made else "durable")
        if made:
            self.subscriptions[name] = position
        self.attached.add(name)
        return position, made

    def release(self, name: str) -> None:
        """The stream attached to `name` ended."""
        self.attached.discard(name)

    def ack(self, name: str, position: int) -> bool:
        """Move `name` forward to `position` (an older one: no-op); whether it moved."""
        current = self.subscriptions.get(name)
        if current is None:
            raise SubscriptionNotFoundError(
                f"durable: subscription {name!r} of space {self.space!r} is unknown"
            )
        if position > self.head:
            raise InvalidCursorError(
                f"cursor: position {position} of space {self.space!r} is ahead of the log's head {self.head}"
            )
        if position <= current:
            return False
        self.subscriptions[name] = position
        return True

    def unsubscribe(self, name: str) -> int:
        """Delete `name`; returns the position it held."""
        position = self.subscriptions.pop(name, None)
        if position is None:
            raise SubscriptionNotFoundError(
                f"durable: subscription {name!r} of space {self.space!r} is unknown"
            )
        return position


def _size(entry: StoredEntry | FrozenEntry) -> int:
    """A held entry's size (model.py), frozen or not."""
    if isinstance(entry, tuple):
        size: int = entry[FROZEN_SIZE]
        return size
    return entry.size
