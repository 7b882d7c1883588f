"""The locks transactions hold on entries, and the lock table that says what each lets others do.

A transaction (model.py) is leased, like an entry; while it is active it holds locks:

- a **write lock** on each entry it wrote: the entry is in the space (it counts against the quota)
  but only the writing transaction sees it, until commit;
- a **take lock** on each entry it took: nobody sees it any more, the taker included; commit
  removes it for good, abort puts it back;
- a **read lock** on each entry it read: others may still read it, but only a transaction that is
  its sole reader may take it.

The table (Outrigger's, from ../shared/reference/javaspaces-semantics.md) says, for an entry's
`EntryLock` and the transaction asking (None for an operation under no transaction), whether the
entry is `OK` to use, `HIDDEN` (as if it were not there), or in `CONFLICT` (it may become usable
when the locking transaction ends, so a blocked call waits, and an if_exists call
(`read_if_exists`, `take_if_exists`) waits only for such entries):

| lock on the entry | read, by the holder | read, by another | take, by the holder   | take, by another |
|-------------------|---------------------|------------------|-----------------------|------------------|
| none              | OK                  | OK               | OK                    | OK               |
| write-locked      | OK                  | CONFLICT         | OK                    | CONFLICT         |
| take-locked       | HIDDEN              | CONFLICT         | HIDDEN                | CONFLICT         |
| read-locked       | OK                  | OK               | OK if the sole reader | CONFLICT         |

Plain data and two pure functions: the engine applies them (matching in space.py; taking and
releasing locks, begin, commit and abort in transacting.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from outrig.service.engine.model import Transaction

__all__ = [
    "CONFLICT",
    "HIDDEN",
    "OK",
    "EntryLock",
    "read_access",
    "take_access",
]

OK: Final = 0
HIDDEN: Final = 1
CONFLICT: Final = 2


class EntryLock:
    """The locks on one entry. An entry without any has ``lock = None``: the common case costs one
    attribute test on the matching path."""

    __slots__ = ("readers", "taker", "writer")

    def __init__(self) -> None:
        self.writer: Transaction | None = None
        self.taker: Transaction | None = None
        self.readers: set[Transaction] = set()

    def empty(self) -> bool:
        return self.writer is None and self.taker is None and not self.readers

    def __repr__(self) -> str:
        readers = sorted(t.id for t in self.readers)
        writer = self.writer.id if self.writer else None
        taker = self.taker.id if self.taker else None
        return f"EntryLock(writer={writer}, taker={taker}, readers={readers})"


def read_access(lock: EntryLock, txn: Transaction | None) -> int:
    """May ``txn`` (None: no transaction) read an entry with this lock: OK, HIDDEN or CONFLICT."""
    if lock.taker is not None:
        return HIDDEN if lock.taker is txn else CONFLICT
    if lock.writer is not None and lock.writer is not txn:
        return CONFLICT
    return OK


def take_access(lock: EntryLock, txn: Transaction | None) -> int:
    """May ``txn`` (None: no transaction) take an entry with this lock: OK, HIDDEN or CONFLICT."""
    if lock.taker is not None:
        return HIDDEN if lock.taker is txn else CONFLICT
    if lock.writer is not None and lock.writer is not txn:
        return CONFLICT
    readers = lock.readers
    if readers and (len(readers) > 1 or txn not in readers):
        return CONFLICT
    return OK
