"""The transactional half of `SpaceEngine`: begin, commit and abort, and the locks a transaction
takes on entries (the lock table itself is in locks.py).

A mixin, so that space.py stays about matching and indexes: `SpaceEngine` inherits it, and these
methods use the engine's indexes and waiters through the names declared for the type checker below.

Commit and abort keep the engine's rule (space.py): what can fail comes first and is undone if it
does (the entries that leave the space with the transaction, its registrations, its parked calls,
its lease); then the transaction ends, and from there on only locks are released, entries
published and offered, and callbacks told.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

from outrig.service.engine.clock import Clock
from outrig.service.engine.locks import EntryLock
from outrig.service.engine.model import (
    LeaseGrant,
    Registration,
    StoredEntry,
    Template,
    Transaction,
    TransactionOutcome,
    TransactionState,
    Waiter,
)
from outrig.service.engine.partitions import IdClass
from outrig.service.exceptions import TransactionNotFoundError

__all__ = ["TransactionsMixin"]

log = logging.getLogger("outrig.service.engine")


class TransactionsMixin:
    """Transactions of one space: see `SpaceEngine` and docs/transactions.md."""

    name: str
    _clock: Clock
    _next_id: int
    _ids: IdClass
    _entries: dict[int, StoredEntry]
    _registration_by_id: dict[int, Registration]
    _transactions: dict[int, Transaction]
    _locked: int
    _if_exists: dict[int, Waiter]
    _by_seq: dict[int, Waiter]
    on_transaction_end: Callable[[TransactionOutcome], None] | None

    if TYPE_CHECKING:  # SpaceEngine's, used here

        def _grant(
            self, requested: float | None, now: float, field: str = "lease"
        ) -> tuple[float | None, float | None]: ...
        def _new_id(self) -> int: ...
        def _move_expiry(self, lease_id: int, old: float | None, new: float | None) -> None: ...
        def _remove(self, stored: StoredEntry) -> None: ...
        def _put_back(self, stored: StoredEntry) -> None: ...
        def _offer(self, stored: StoredEntry) -> bool: ...
        def _publish(self, stored: StoredEntry, writer: Transaction | None = None) -> None: ...
        def _log(
            self, kind: str, stored: StoredEntry, transaction: int = 0, visible_at: float | None = None
        ) -> None: ...
        def unregister(self, registration: Registration) -> None: ...
        def _file_registration(self, registration: Registration) -> None: ...
        def unpark(self, waiter: Waiter) -> None: ...
        def _file_waiter(self, waiter: Waiter) -> None: ...
        def _select(
            self,
            templates: Sequence[Template],
            limit: int,
            txn: Transaction | None = None,
            take: bool = False,
        ) -> tuple[list[StoredEntry], bool]: ...
        @staticmethod
        def _expired(stored: StoredEntry, now: float) -> bool: ...

    def begin(self, lease: float | None) -> tuple[Transaction, LeaseGrant]:
        """Open a transaction under a lease (its id is a lease id of the space); it aborts when
        the lease runs out."""
        expires_at, granted = self._grant(lease, self._clock.time())
        txn = Transaction(self._new_id(), expires_at)
        try:
            self._move_expiry(txn.id, None, expires_at)
        except BaseException:
            self._next_id = txn.id
            raise
        self._transactions[txn.id] = txn
        return txn, LeaseGrant(txn.id, expires_at, granted)

    def transaction(self, transaction_id: int) -> Transaction:
        """The active transaction with this id; TransactionNotFoundError if it has ended."""
        txn = self._transactions.get(transaction_id)
        if txn is not None and self._expired_transaction(txn, self._clock.time()):
            self.abort(txn)  # due, and the reaper has not got to it yet
            txn = None
        if txn is None:
            raise TransactionNotFoundError(
                f"transaction {transaction_id} in space {self.name!r} is unknown or has ended "
                "(committed, aborted, or its lease ran out)"
            )
        return txn

    def _check_active(self, txn: Transaction) -> None:
        if not txn.active or self._transactions.get(txn.id) is not txn:
            raise TransactionNotFoundError(f"transaction {txn.id} in space {self.name!r} has ended")
        if self._expired_transaction(txn, self._clock.time()):
            self.abort(txn)
            raise TransactionNotFoundError(f"transaction {txn.id} in space {self.name!r} ran out of lease")

    @staticmethod
    def _expired_transaction(txn: Transaction, now: float) -> bool:
        return txn.expires_at is not None and txn.expires_at <= now

    def commit(self, txn: Transaction) -> TransactionOutcome:
        """Make the transaction's writes visible to all and its takes final, release its read
        locks, and end its notify registrations; then offer what became usable to waiters."""
        self._check_active(txn)
        taken = list(txn.taken.values())
        ending = self._unfile(txn, taken, taken=True)  # its takes leave the space for good
        written = list(txn.written.values())
        read = self._close(txn, TransactionState.COMMITTED, ending)
        for stored in written:
            self._release(stored, writer=txn)
        # Logged as the commit's changes, consecutive: its writes still in the space, its takes.
        for stored in written:
            if stored.id in self._entries:
                self._log("write", stored, txn.id)
        for stored in taken:
            self._log("take", stored, txn.id)
        for stored in written:
            if stored.id in self._entries:  # not expired or cancelled meanwhile
                self._publish(stored)
        self._settle(txn, [*written, *read])
        outcome = TransactionOutcome(txn, [s for s in written if s.id in self._entries], taken)
        if self.on_transaction_end is not None:
            self.on_transaction_end(outcome)
        return outcome

    def abort(self, txn: Transaction) -> TransactionOutcome:
        """Discard the transaction's writes, put back what it took, release its read locks, and end
        its notify registrations; then offer what became usable again to waiters."""
        if not txn.active or self._transactions.get(txn.id) is not txn:
            raise TransactionNotFoundError(f"transaction {txn.id} in space {self.name!r} has ended")
        written = list(txn.written.values())
        ending = self._unfile(txn, written, taken=False)  # its writes leave the space
        taken = list(txn.taken.values())
        read = self._close(txn, TransactionState.ABORTED, ending)
        for stored in taken:
            self._release(stored, taker=txn)
        self._settle(txn, [*taken, *read])
        outcome = TransactionOutcome(txn, [], [s for s in taken if s.id in self._entries])
        if self.on_transaction_end is not None:
            self.on_transaction_end(outcome)
        return outcome

    def _unfile(
        self, txn: Transaction, leaving: list[StoredEntry], *, taken: bool
    ) -> tuple[list[Registration], list[Waiter]]:
        """Before `txn` ends, all or nothing: unfile the entries that leave the space with it (a
        commit's takes, an abort's writes), its registrations, its parked calls and its lease.
        Returns the registrations and waiters, to be told in `_close`."""
        registrations = [r for r in map(self._registration_by_id.get, txn.registrations) if r is not None]
        waiters = [self._by_seq[seq] for seq in txn.waiters]
        undos: list[Callable[[], None]] = []
        try:
            for stored in leaving:
                self._remove(stored)
                undos.append(functools.partial(self._relock, stored, txn, taken))
            for registration in registrations:
                self.unregister(registration)
                undos.append(functools.partial(self._file_registration, registration))
            for waiter in waiters:
                self.unpark(waiter)
                undos.append(functools.partial(self._file_waiter, waiter))
            self._move_expiry(txn.id, txn.expires_at, None)
        except BaseException:
            for undo in reversed(undos):
                undo()
            raise
        return registrations, waiters

    def _relock(self, stored: StoredEntry, txn: Transaction, taken: bool) -> None:
        """Undo `_unfile` of an entry: back in the space, locked as it was (a take-locked entry has
        no other lock, and a write-locked one none either: both are invisible to others)."""
        self._put_back(stored)
        lock = self._lock(stored)
        if taken:
            lock.taker = txn
            txn.taken[stored.id] = stored
        else:
            lock.writer = txn
            txn.written[stored.id] = stored

    def _close(
        self, txn: Transaction, state: TransactionState, ending: tuple[list[Registration], list[Waiter]]
    ) -> list[StoredEntry]:
        """End `txn`, once `_unfile` has: tell its registrations and parked calls, and release its
        read locks. Returns what it had read."""
        txn.state = state
        del self._transactions[txn.id]
        registrations, waiters = ending
        for registration in registrations:
            registration.on_end()
        for waiter in waiters:  # its blocked reads and takes end, empty-handed
            waiter.deliver([])
        read = list(txn.read_locked.values())
        for stored in read:
            self._release(stored, reader=txn)
        return read

    def _settle(self, txn: Transaction, usable: list[StoredEntry]) -> None:
        """After `txn` ended: offer the entries it unlocked to waiters, then end the if_exists
        waiters that have nothing locked left to wait for."""
        now = self._clock.time()
        for stored in usable:
            if stored.id in self._entries and stored.lock is None and not self._expired(stored, now):
                self._offer(stored)
        for waiter in list(self._if_exists.values()):
            try:
                if not self._select(waiter.templates, 1 << 62, waiter.txn, waiter.take)[1]:
                    self.unpark(waiter)
                    waiter.deliver([])
            except Exception:  # past the commit point: it waits on, until its deadline
                log.exception("space %r: ending an if_exists wait failed", self.name)

    def restore_transaction(self, transaction_id: int, expires_at: float | None) -> Transaction:
        """Open again a transaction recovered from the store (a new owner rebuilding a space),
        holding nothing yet: `restore_lock` gives it back what it held. Call after the entries
        are loaded, before anyone is served."""
        txn = Transaction(transaction_id, expires_at)
        self._move_expiry(txn.id, None, expires_at)
        self._transactions[txn.id] = txn
        self._next_id = self._ids.at_least(max(self._next_id, transaction_id + 1))
        return txn

    def restore_lock(self, txn: Transaction, entry_id: int, mode: str) -> bool:
        """Give a recovered transaction back its hold on a loaded entry: "write" (its own write,
        visible to it only), "take" or "read". False if the entry is not in the space (it expired
        meanwhile) or another transaction's hold excludes this one (never, from a consistent
        store: the entry is left as it was)."""
        stored = self._entries.get(entry_id)
        if stored is None:
            return False
        lock = stored.lock
        if mode == "write":
            if lock is not None:
                return False
            self._lock(stored).writer = txn
            txn.written[stored.id] = stored
        elif lock is not None and (lock.writer is not None or lock.taker is not None):
            return False
        elif mode == "take":
            if lock is not None and (lock.readers - {txn}):
                return False
            self._lock_take(txn, stored)
        else:
            self._lock_read(txn, stored)
        return True

    def held_by(self, txn: Transaction, stored: StoredEntry) -> str | None:
        """How `txn` holds an entry it was just handed: "write" (its own write, read), "take",
        "read"; None if the entry left the space (its own write, taken back) or it holds none."""
        if stored.id not in self._entries:
            return None
        lock = stored.lock
        if lock is None:
            return None
        if lock.writer is txn:
            return "write"
        if lock.taker is txn:
            return "take"
        return "read" if txn in lock.readers else None

    def rewrite(self, txn: Transaction, entries: Iterable[StoredEntry]) -> None:
        """Give back to `txn` its own writes it took back for a call that could not answer (its
        caller went away): in the space again, visible to it only."""
        now = self._clock.time()
        for stored in entries:
            if txn.active and stored.id not in self._entries and not self._expired(stored, now):
                self._relock(stored, txn, taken=False)

    def is_transaction(self, lease_id: int) -> bool:
        """Whether a lease id is an active transaction's."""
        return lease_id in self._transactions

    def read_lock(self, txn: Transaction, stored: StoredEntry) -> None:
        """Read-lock an entry for `txn` (what contents under a transaction returns)."""
        self._check_active(txn)
        self._lock_read(txn, stored)

    def untake(self, txn: Transaction, entries: Iterable[StoredEntry]) -> None:
        """Give back entries `txn` took for a call that could not answer (its caller went away)."""
        for stored in entries:
            lock = stored.lock
            if lock is not None and lock.taker is txn:
                self._release(stored, taker=txn)
                if stored.lock is None and stored.id in self._entries:
                    self._offer(stored)

    def _lock(self, stored: StoredEntry) -> EntryLock:
        lock = stored.lock
        if lock is None:
            lock = stored.lock = EntryLock()
            self._locked += 1
        return lock

    def _unlock_if_free(self, stored: StoredEntry) -> None:
        lock = stored.lock
        if lock is not None and lock.empty():
            stored.lock = None
            self._locked -= 1

    def _lock_read(self, txn: Transaction, stored: StoredEntry) -> None:
        lock = stored.lock
        if lock is not None and lock.writer is txn:
            return  # its own write: nobody else can see it anyway
        self._lock(stored).readers.add(txn)
        txn.read_locked[stored.id] = stored

    def _lock_take(self, txn: Transaction, stored: StoredEntry) -> None:
        """Take-lock an entry of the space for `txn` (not its own write: see `_claim`)."""
        lock = self._lock(stored)
        lock.taker = txn
        if txn in lock.readers:
            lock.readers.discard(txn)
            txn.read_locked.pop(stored.id, None)
        txn.taken[stored.id] = stored

    def _release(
        self,
        stored: StoredEntry,
        *,
        writer: Transaction | None = None,
        taker: Transaction | None = None,
        reader: Transaction | None = None,
    ) -> None:
        lock = stored.lock
        if lock is None:
            return
        if writer is not None and lock.writer is writer:
            lock.writer = None
            writer.written.pop(stored.id, None)
        if taker is not None and lock.taker is taker:
            lock.taker = None
            taker.taken.pop(stored.id, None)
        if reader is not None:
            lock.readers.discard(reader)
            reader.read_locked.pop(stored.id, None)
        self._unlock_if_free(stored)

    def _detach(self, stored: StoredEntry) -> None:
        """An entry leaves the space (expired, cancelled, taken for good): drop its locks."""
        lock = stored.lock
        assert lock is not None
        if lock.writer is not None:
            lock.writer.written.pop(stored.id, None)
        if lock.taker is not None:
            lock.taker.taken.pop(stored.id, None)
        for reader in lock.readers:
            reader.read_locked.pop(stored.id, None)
        stored.lock = None
        self._locked -= 1
