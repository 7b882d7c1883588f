"""One named space: stored entries, parked waiters, notify registrations and leases.

The engine composes its parts: an `EntryIndex` (index.py) files the entries by type and by
(type, field, value), so that nothing scans the space; a `LeaseQueue` (leases.py) holds every
lease; two `WatcherIndex`es (watchers.py) hold the parked reads and takes and the registrations.

All methods are synchronous and run on one thread (the server's event loop); each call is
atomic with respect to the others, which is what makes take exclusive. Transactions (begin, commit,
abort and the locks) come from `TransactionsMixin` in transacting.py; takes with an
acknowledgement deadline, delayed entries and dead letters from `DeliveriesMixin` in
deliveries.py (a hidden entry is in the space but not in the index).

Each call also either fails having changed nothing, or happens: an exception midway must never
leave an entry filed in one index and gone from another (a take would then return it forever).
So a call first checks its arguments (lease durations included), then does the steps that can
fail (filing or unfiling leases, entries and watchers), undoing those done if one fails; that
is its commit point. After it, the call only hands entries to waiters and events to
registrations. Each hand-off is all or nothing itself (an entry is unfiled for a take before the
take is given it), and one that fails is logged and skipped, not raised: the call has happened
and must not report otherwise; the entry stays in the space, the waiter waits on.
"""

from __future__ import annotations

import bisect
import itertools
import logging
import math
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass

from outrig.service.engine.ages import PRUNE_AT, WriteTimes
from outrig.service.engine.changes import Change, ChangeLog
from outrig.service.engine.clock import Clock
from outrig.service.engine.deliveries import DeliveriesMixin
from outrig.service.engine.index import EntryIndex
from outrig.service.engine.leases import MAX_LEASE_SECONDS, LeaseQueue, check_lease_duration
from outrig.service.engine.locks import CONFLICT, OK, read_access, take_access
from outrig.service.engine.model import (
    LeaseGrant,
    NewEntry,
    OrderKey,
    Registration,
    StoredEntry,
    Template,
    Templates,
    Transaction,
    TransactionOutcome,
    Waiter,
    order_of,
)
from outrig.service.engine.partitions import ids_of
from outrig.service.engine.transacting import TransactionsMixin
from outrig.service.engine.values import FULL_KEY_LIMIT
from outrig.service.engine.watchers import WatcherIndex
from outrig.service.exceptions import (
    InvalidArgumentError,
    LeaseNotFoundError,
    QuotaExceededError,
    TypeConflictError,
)

log = logging.getLogger("outrig.service.engine")

FOREVER = math.inf
"""A requested lease of FOREVER; None requests the space's default (Lease.ANY)."""


@dataclass(frozen=True, slots=True)
class SpaceSettings:
    """Per-space behaviour and quotas."""

    fifo: bool = True  # oldest match first, waiters served first come first served
    max_entries: int = 1_000_000
    max_bytes: int = 1 << 30
    default_lease: float = 3600.0  # granted for Lease.ANY; math.inf = FOREVER
    max_lease: float = FOREVER  # longer requests are cut to this
    # Ordered indexes to keep from the start, as (type, field); others are made on first need.
    indexes: tuple[tuple[str, str], ...] = ()
    # Partitions (docs/scaling.md): the routing field and how many; 1: the space is one partition.
    # The engine of a partition ignores them: the transport routes calls to partitions.
    partition_by: str = ""
    partitions: int = 1
    # Takes with an acknowledgement deadline (docs/work-queues.md): deliveries of an entry before
    # it goes to the dead-letter space (0: no limit), that space's name ("": "<space>.dead"; a
    # partition's is "<dead>~k"), and the backoff of a Nack without a delay: nack_backoff seconds
    # after the first delivery, doubling with each further one, at most nack_backoff_max.
    max_deliveries: int = 0
    dead_letter: str = ""
    nack_backoff: float = 1.0
    nack_backoff_max: float = 600.0
    # The change log (engine/changes.py, docs/notifications.md): on or off, and its retention: at
    # most changes_max_count changes, none older than changes_max_age seconds, at most
    # changes_max_bytes (each change counting len(payload) + 64).
    changes: bool = True
    changes_max_count: int = 100_000
    changes_max_age: float = 86_400.0
    changes_max_bytes: int = 64 << 20


@dataclass(frozen=True, slots=True)
class SpaceStatistics:
    """An immutable snapshot of a space's size."""

    entries: int
    bytes: int
    waiters: int
    registrations: int
    types: int
    transactions: int = 0
    locked: int = 0  # entries some transaction holds a lock on
    in_flight: int = 0  # pending deliveries (takes with an acknowledgement deadline)
    delayed: int = 0  # entries hidden until a time
    redelivered: int = 0  # deliveries that ended unacknowledged, since the space was made
    dead_lettered: int = 0  # entries moved to the dead-letter space, since the space was made


_COUNT_REAP_BATCH = 1000
# Expired entries a single find removes as it meets them. After a mass expiry it skips the rest
# (about 20x cheaper than removing) and leaves them to the reaper's bounded batches, so one request
# never does a lease storm's work.
_LAZY_REMOVALS = 256


def _one_expiry(found: list[StoredEntry], expires_at: float) -> bool:
    """Whether every entry of `found` expires at `expires_at` (a plain loop: `all` of a generator
    resumes it once per entry)."""
    for stored in found:  # noqa: SIM110 - a plain loop, as said
        if stored.expires_at != expires_at:
            return False
    return True


def _size_of(entries: Sequence[NewEntry]) -> int:
    """The entries' sizes summed (a plain loop, not `sum` of a generator)."""
    size = 0
    for entry in entries:
        size += entry.size
    return size


def _nothing() -> None:
    """The undo of a claim that changed nothing (a plain read)."""


class SpaceEngine(TransactionsMixin, DeliveriesMixin):
    """The matching engine of one space."""

    def __init__(self, name: str, settings: SpaceSettings, clock: Clock) -> None:
        self.name = name
        self.settings = settings
        self._clock = clock
        self._ids = ids_of(name)  # a partition's ids are its own (engine/partitions.py)
        self._next_id = self._ids.first()
        self._types: dict[str, tuple[str, ...]] = {}
        # (type, supertypes) of one-entry writes that declared or matched their lineage: a later
        # write of the same shape declares nothing and conflicts with nothing (until `declare`).
        self._shapes: set[tuple[str, tuple[str, ...]]] = set()
        self._entries: dict[int, StoredEntry] = {}  # what is in the space, by id
        self._index = EntryIndex(settings.fifo, settings.indexes)  # the same entries, by type and field
        self._bytes = 0
        self._waiters: WatcherIndex[Waiter] = WatcherIndex()
        self._registrations: WatcherIndex[Registration] = WatcherIndex()
        self._registration_by_id: dict[int, Registration] = {}
        self._leases = LeaseQueue()
        # Told the id of every entry dropped because its lease ran out (a store forgets it).
        self.on_expired: Callable[[int], None] | None = None
        # The types the last write declared for the first time, with their supertypes.
        self.declared: dict[str, tuple[str, ...]] = {}
        self._transactions: dict[int, Transaction] = {}
        self.expired = 0  # entries whose lease ran out, since the space was made (for metrics)
        self._locked = 0  # entries with a lock: while 0, nothing needs the lock table
        self._if_exists: dict[int, Waiter] = {}  # parked if_exists waiters, by seq
        self._by_seq: dict[int, Waiter] = {}  # parked waiters under a transaction, by seq
        # Told of every commit and abort, including aborts by lease expiry (the reaper's).
        self.on_transaction_end: Callable[[TransactionOutcome], None] | None = None
        self._written_at = WriteTimes()  # when entries were written, to about a second
        self._init_deliveries()
        # The change log (engine/changes.py; None: `changes = false`), and the backend's hook told
        # of each change as it is logged, at its commit point (to record it and wake its readers).
        self.changes: ChangeLog | None = (
            ChangeLog(
                settings.changes_max_count, settings.changes_max_age, settings.changes_max_bytes, space=name
            )
            if settings.changes
            else None
        )
        self.on_change: Callable[[Change], None] | None = None
        # ... and the hook told once per call that logged changes, after `on_change` of each.
        self.on_logged: Callable[[], None] | None = None

    # ------------------------------------------------------------------ recovery

    def declare(self, type_name: str, supertypes: tuple[str, ...]) -> None:
        """Know a type and its supertypes (a restart restores the declarations it had)."""
        self._types[type_name] = supertypes
        self._shapes.clear()  # a type's supertypes may have changed

    def load(
        self,
        entry_id: int,
        arrival: int,
        new: NewEntry,
        expires_at: float | None,
        *,
        hidden_until: float | None = None,
        receipt: int | None = None,
        deliveries: int = 0,
        dead_letter_reason: str | None = "",
        max_deliveries: int = 0,
    ) -> None:
        """Put back a recovered entry as it was: its id, its place in arrival order, its lease,
        its delivery state (hidden until a time still to come, with its pending delivery's
        receipt if any; a delay whose time has passed is over). A pending delivery stays pending
        even past its deadline: the reaper's first pass ends it as it ends any, counting it and
        dead-lettering an entry that reached max_deliveries, which a restart or takeover must
        not skip; its take's own `max_deliveries` (0: the space's) still applies. Call in arrival
        order; nobody is waiting yet, so nothing is offered or published."""
        stored = StoredEntry(entry_id, new, expires_at)
        stored.arrival = arrival
        stored.deliveries = deliveries
        stored.dead_letter_reason = dead_letter_reason or ""
        if hidden_until is not None and (receipt is not None or hidden_until > self._clock.time()):
            stored.hidden_until, stored.receipt = hidden_until, receipt
            if receipt is not None:
                self._next_id = self._ids.at_least(max(self._next_id, receipt + 1))
                if max_deliveries:
                    self._take_limits[receipt] = max_deliveries
        if not self._written_at:
            self._written_at.note(entry_id, self._clock.time())  # recovered: counted from now
        lineage = stored.lineage
        for depth, type_name in enumerate(lineage):
            self._types.setdefault(type_name, lineage[depth + 1 :])
        self._insert(stored)
        self._next_id = self._ids.at_least(max(self._next_id, entry_id + 1, arrival + 1))

    def resume_ids(self, next_id: int) -> None:
        """Continue numbering at `next_id` or later, so no lease id is ever handed out twice."""
        self._next_id = self._ids.at_least(max(self._next_id, next_id))

    @property
    def next_id(self) -> int:
        """The next id this space will hand out."""
        return self._next_id

    # ------------------------------------------------------------------ ids and leases

    @property
    def id_stride(self) -> int:
        """How far apart the ids this space hands out are (1, or a partition's stride)."""
        return self._ids.stride

    def _new_id(self) -> int:
        new = self._next_id
        self._next_id = new + self._ids.stride
        return new

    def new_waiter_seq(self) -> int:
        """A fresh sequence number for a `Waiter` (ids and waiters share one counter)."""
        return self._new_id()

    def _grant(
        self, requested: float | None, now: float, field: str = "lease"
    ) -> tuple[float | None, float | None]:
        """(expires_at, granted seconds) for a requested duration; None means forever.
        InvalidArgumentError, naming `field`, for a duration nobody may ask for: every call that
        grants a lease calls this before it changes anything."""
        if requested is not None and not requested <= MAX_LEASE_SECONDS:  # the rare case: NaN too
            check_lease_duration(requested, field)
        duration = self.settings.default_lease if requested is None else requested
        duration = min(duration, self.settings.max_lease)
        if math.isinf(duration):
            return None, None
        return now + duration, duration

    def _move_expiry(self, lease_id: int, old: float | None, new: float | None) -> None:
        """Refile a lease from `old` to `new` (None: not filed, forever), all or nothing."""
        if old == new:
            return
        if old is not None:
            self._leases.discard(lease_id, old)
        if new is not None:
            try:
                self._leases.add(lease_id, new)
            except BaseException:
                if old is not None:
                    self._leases.add(lease_id, old)
                raise

    def next_expiry(self) -> float | None:
        """A time at or before the soonest lease's end, or None."""
        return self._leases.next_expiry()

    # ------------------------------------------------------------------ writing

    def write(
        self, entries: Sequence[NewEntry], lease: float | None, visible_at: float | None = None
    ) -> list[LeaseGrant]:
        """Store `entries`, all or nothing, each under a lease of `lease` seconds.

        Raises TypeConflictError or QuotaExceededError before storing anything.
        """
        stored, granted = self.write_entries(entries, lease, visible_at=visible_at)
        return [LeaseGrant(each.id, each.expires_at, granted) for each in stored]

    def write_entries(
        self,
        entries: Sequence[NewEntry],
        lease: float | None,
        txn: Transaction | None = None,
        visible_at: float | None = None,
        *,
        carried: tuple[int, str] = (0, ""),
    ) -> tuple[list[StoredEntry], float | None]:
        """`write`, returning the stored entries (some perhaps handed straight to a parked take)
        and the granted lease duration (None: forever).

        Under `txn` the entries are write-locked: only that transaction sees them, and hears of
        them through its own notify registrations, until it commits.

        With `visible_at` (epoch seconds; never under a transaction) still to come, the entries
        are stored hidden (deliveries.py) and offered and published only then. `carried`: the
        delivery count and dead-letter reason they come with (an entry moved to a dead-letter
        space).

        Every entry is filed before any is published or offered: a write that fails has handed
        nothing to anyone, and one that has handed something out has stored all of it."""
        now = self._clock.time()
        expires_at, granted = self._grant(lease, now)
        if visible_at is not None:
            if txn is not None:
                raise InvalidArgumentError(
                    "visible_at: a delayed write cannot run under a transaction (its entries would be "
                    "visible at commit)"
                )
            if not math.isfinite(visible_at):
                raise InvalidArgumentError(f"visible_at: must be a time in epoch seconds, got {visible_at!r}")
            if visible_at <= now:
                visible_at = None
        if txn is not None:
            self._check_active(txn)
        count = len(entries)
        shape = (entries[0].type_name, entries[0].supertypes) if count == 1 else None
        declared = {} if shape in self._shapes else self._declare_types(entries)
        # a pair's write has one entry: its size without a generator; `_check_quota` only when
        # the write does not fit as the space is (its first test, inline)
        size = entries[0].size if count == 1 else _size_of(entries)
        settings = self.settings
        if len(self._entries) + count > settings.max_entries or self._bytes + size > settings.max_bytes:
            self._check_quota(count, size)
        first_id, stride = self._next_id, self._ids.stride
        self._next_id = first_id + len(entries) * stride  # `_new_id` of each entry, at once
        written = (
            [StoredEntry(first_id, entries[0], expires_at)]  # a pair's write: no comprehension's frame
            if count == 1
            else [
                StoredEntry(entry_id, new, expires_at)
                for entry_id, new in zip(range(first_id, self._next_id, stride), entries, strict=True)
            ]
        )
        if visible_at is not None or carried[0]:
            for stored in written:
                stored.hidden_until = visible_at
                stored.deliveries, stored.dead_letter_reason = carried
        if count == 1:  # `_insert_each` of one entry, inline
            try:
                self._insert(written[0])
            except BaseException:
                self._next_id = first_id
                raise
        elif visible_at is not None or carried[0]:
            self._insert_each(written, first_id)
        else:
            self._insert_many(written, first_id)
        # Only now, so that a refused write leaves no type declared behind it.
        if declared:
            self._types.update(declared)
        if shape is not None:
            self._shapes.add(shape)
        times = self._written_at  # `_note_written`'s, inline
        times.note(first_id, now)
        if len(times) >= PRUNE_AT and self._entries:
            times.prune(next(iter(self._entries)))  # the oldest filed, but for one put back
        self.declared = declared
        if txn is not None:
            for stored in written:
                self._lock(stored).writer = txn
                txn.written[stored.id] = stored
        elif self.changes is not None:
            self._log_many("write", written, visible_at, 0, now)
        # The commit point is passed: these never raise. With no registration and no parked call
        # in the space, nobody is told or handed anything: a batch skips asking for each entry.
        if visible_at is None and (self._registrations or self._waiters):
            for stored in written:
                self._publish(stored, txn)
                self._offer(stored)
        return written, granted

    def _insert_each(self, written: list[StoredEntry], first_id: int) -> None:
        """`_insert` each entry of a write, all or nothing (ids from `first_id` given back)."""
        filed = 0
        try:
            for stored in written:
                self._insert(stored)
                filed += 1
        except BaseException:
            for stored in reversed(written[:filed]):  # the newest last in every bucket: order kept
                self._remove(stored)
            self._next_id = first_id
            raise

    def _insert_many(self, written: list[StoredEntry], first_id: int) -> None:
        """`_insert_each` for a batch of visible entries under one lease: their leases filed in
        one step, then the index's batch filing (`EntryIndex.insert_many`), all or nothing."""
        expires_at = written[0].expires_at
        leases = self._leases
        try:
            if expires_at is not None:
                leases.add_many([stored.id for stored in written], expires_at)
        except BaseException:
            self._next_id = first_id
            raise
        try:
            self._index.insert_many(written)
        except BaseException:
            if expires_at is not None:
                leases.discard_many([stored.id for stored in written], expires_at)
            self._next_id = first_id
            raise
        entries, size = self._entries, 0
        for stored in written:  # by id, and their sizes summed, in one loop (no generator)
            entries[stored.id] = stored
            size += stored.size
        self._bytes += size

    def _declare_types(self, entries: Sequence[NewEntry]) -> dict[str, tuple[str, ...]]:
        """The types `entries` declare that the space does not know yet; raises on a conflict."""
        declared: dict[str, tuple[str, ...]] = {}
        seen: set[tuple[str, tuple[str, ...]]] = set()  # a batch's entries share a few lineages
        for entry in entries:
            shape = (entry.type_name, entry.supertypes)
            if shape in seen:
                continue
            seen.add(shape)
            lineage = (entry.type_name, *entry.supertypes)
            for depth, type_name in enumerate(lineage):
                parents = lineage[depth + 1 :]
                known = declared.get(type_name, self._types.get(type_name))
                if known is None:
                    declared[type_name] = parents
                elif known != parents:
                    raise TypeConflictError(
                        f"type {type_name!r} has supertypes {list(known)} in space {self.name!r}; "
                        f"an entry of type {entry.type_name!r} declares {list(parents)}"
                    )
        return declared

    def _check_quota(self, count: int, size: int) -> None:
        settings = self.settings
        if len(self._entries) + count <= settings.max_entries and self._bytes + size <= settings.max_bytes:
            return  # fits: the common case, without the closure below made and called

        def over() -> bool:
            return (
                len(self._entries) + count > settings.max_entries or self._bytes + size > settings.max_bytes
            )

        # Expired entries no longer count. Reap in bounded batches until the write fits or nothing
        # due is left: one batch can free too few bytes when the expired entries are small.
        while over() and self.reap(limit=count + 1024):
            pass
        if len(self._entries) + count > settings.max_entries:
            raise QuotaExceededError(
                f"space {self.name!r} holds {len(self._entries)} entries; "
                f"writing {count} more exceeds its quota max_entries={settings.max_entries}"
            )
        if self._bytes + size > settings.max_bytes:
            raise QuotaExceededError(
                f"space {self.name!r} holds {self._bytes} bytes; "
                f"writing {size} more exceeds its quota max_bytes={settings.max_bytes}"
            )

    def _insert(self, stored: StoredEntry) -> None:
        """File an entry in the space, all or nothing: its lease, then the index (a hidden entry:
        its timer), the steps that can fail (if the index does, the lease is unfiled again); then
        by id."""
        entry_id, expires_at = stored.id, stored.expires_at
        if expires_at is not None:
            self._leases.add(entry_id, expires_at)
        try:
            if stored.hidden_until is None:
                self._index.insert(stored)
            else:
                self._file_hidden(stored)
        except BaseException:
            if expires_at is not None:
                self._leases.discard(entry_id, expires_at)
            raise
        self._entries[entry_id] = stored
        self._bytes += stored.size

    def _remove(self, stored: StoredEntry) -> None:
        """Unfile an entry (doing nothing if it is not in the space), all or nothing: its lease,
        then the index (if it fails, the lease is filed again); then by id, and its locks go."""
        entry_id, expires_at = stored.id, stored.expires_at
        if entry_id not in self._entries:
            return
        if expires_at is not None:
            self._leases.discard(entry_id, expires_at)
        if stored.hidden_until is None:
            try:
                self._index.remove(stored)
            except BaseException:
                if expires_at is not None:
                    self._leases.add(entry_id, expires_at)
                raise
        else:  # hidden: not in the index; its delivery, if any, ends
            self._end_hidden(stored)
        del self._entries[entry_id]
        self._bytes -= stored.size
        if stored.lock is not None:
            self._detach(stored)

    def _remove_many(self, found: list[StoredEntry]) -> None:
        """`_remove` of a batch's entries found for a take (each in the space, visible, unlocked):
        their leases, then the index's batch unfiling (`EntryIndex.remove_many`), then by id.
        If the index fails, the leases are filed again and nothing else changed."""
        leases, expires_at = self._leases, found[0].expires_at
        unleased: list[StoredEntry] = []  # those whose lease is unfiled, to file again on a failure
        try:
            if expires_at is not None and _one_expiry(found, expires_at):
                leases.discard_many([stored.id for stored in found], expires_at)  # written together
                unleased = found
            else:
                for stored in found:
                    if stored.expires_at is not None:
                        leases.discard(stored.id, stored.expires_at)
                        unleased.append(stored)
            self._index.remove_many(found)
        except BaseException:
            for stored in unleased:
                leases.add(stored.id, stored.expires_at)  # type: ignore[arg-type]  # leased
            raise
        entries, size = self._entries, 0
        for stored in found:  # by id, and their sizes summed, in one loop (no generator)
            del entries[stored.id]
            size += stored.size
        self._bytes -= size

    def _put_back(self, stored: StoredEntry) -> None:
        """File again an entry just unfiled (undoing a step that failed), at its place in arrival
        order (or hidden as it was). Its `frozen` copy, if its take made one, is of a take that
        no longer holds: a later take freezes it afresh (the request window reuses `frozen`)."""
        stored.frozen = None
        self._insert(stored)
        if stored.hidden_until is None:
            self._index.reorder(stored)

    def _claim(self, stored: StoredEntry, take: bool, txn: Transaction | None) -> Callable[[], None]:
        """Claim an entry of the space found for a take or a read, and return what undoes it: a
        plain take unfiles it; under `txn`, a take take-locks it (unfiles it, if it is the
        transaction's own write) and a read read-locks it. If it raises, nothing changed."""
        if txn is None:
            if not take:
                return _nothing
            self._remove(stored)
            return lambda: self._put_back(stored)
        lock = stored.lock
        if lock is not None and lock.writer is txn:  # its own write: nobody else can see it
            if not take:
                return _nothing
            self._remove(stored)  # taken back: as if never written

            def unwrite() -> None:
                self._put_back(stored)
                self._lock(stored).writer = txn
                txn.written[stored.id] = stored

            return unwrite
        if take:
            was_reader = lock is not None and txn in lock.readers
            self._lock_take(txn, stored)

            def untake() -> None:
                self._release(stored, taker=txn)
                if was_reader:
                    self._lock_read(txn, stored)

            return untake
        if lock is not None and txn in lock.readers:
            return _nothing
        self._lock_read(txn, stored)
        return lambda: self._release(stored, reader=txn)

    def _offer(self, stored: StoredEntry) -> bool:
        """Hand an entry of the space that has just become usable (written, put back, or
        unlocked) to parked waiters in arrival order; True if a take claimed it.

        Only ever called past a call's commit point, so it never raises: a hand-off that fails is
        logged, and changed nothing (the entry stays, the waiter waits on)."""
        try:
            for waiter in self._waiters.candidates(stored):
                if not any(template.matches(stored) for template in waiter.templates):
                    continue
                txn = waiter.txn
                if txn is not None and (not txn.active or self._expired_transaction(txn, self._clock.time())):
                    continue  # its transaction has ended, or is about to abort: so has its call
                lock = stored.lock
                if lock is not None and (take_access if waiter.take else read_access)(lock, txn) != OK:
                    continue
                if self._hand(waiter, stored) and waiter.take:
                    return True
        except Exception:
            log.exception("space %r: offering entry %d to waiters failed; it stays", self.name, stored.id)
        return False

    def _hand(self, waiter: Waiter, stored: StoredEntry) -> bool:
        """Give `stored` to a parked waiter, all or nothing; False if it no longer wanted it."""
        if waiter.wants is not None and not waiter.wants():
            self.unpark(waiter)  # its call is over, and only waits to unpark it
            return False
        self.unpark(waiter)
        try:
            if waiter.ack is None:
                undo = self._claim(stored, waiter.take, waiter.txn)
            else:  # a take with an acknowledgement deadline: delivered
                undo = self._claim_delivery(stored, waiter)
        except BaseException:
            self._file_waiter(waiter)
            raise
        try:
            accepted = waiter.deliver([stored])
        except BaseException:
            undo()
            raise
        if not accepted:
            undo()  # it gave up meanwhile, and could not say so beforehand (no `wants`)
        # A plain take handed an entry is logged by its call (`log_taken`), when it records it.
        return accepted

    def _publish(self, stored: StoredEntry, writer: Transaction | None = None) -> None:
        """Tell the registrations that match of a write: all of them, or under `writer` (a write
        not yet committed) only the writer's own. Past the write's commit point: never raises."""
        now = self._clock.time()
        try:
            for registration in self._registrations.candidates(stored):
                if registration.expires_at is not None and registration.expires_at <= now:
                    self._end(registration)  # its lease ran out before the reaper got to it: no event
                    continue
                if writer is not None and registration.txn is not writer:
                    continue
                if any(template.matches(stored) for template in registration.templates):
                    registration.sequence += 1
                    registration.on_event(registration.sequence, stored)
        except Exception:
            log.exception("space %r: telling registrations of entry %d failed", self.name, stored.id)

    def log_taken(self, entries: Iterable[StoredEntry]) -> None:
        """Log the plain take of entries a parked take was handed (`_hand` does not): its call
        logs it as it records it, so that the change is recorded in the batch of the take's own
        records, not of the write that handed the entries over (a crash between the two must
        not leave the log saying taken what the store still holds). Nobody else sees the
        entries meanwhile, so no order a reader can tell is changed."""
        for stored in entries:
            self._log("take", stored)

    def restore(self, entries: Iterable[StoredEntry], *, logged: bool = True) -> None:
        """Put back entries taken for a reply that could not be delivered (a cancelled call), all
        or nothing, at the back of the space's order; then offer them to waiters. `logged`:
        their take was logged, so their return is logged as a write (a parked take's, not yet:
        see `log_taken`)."""
        now = self._clock.time()
        back = [s for s in entries if s.id not in self._entries and not self._expired(s, now)]
        first_id, arrivals = self._next_id, [stored.arrival for stored in back]
        filed = 0
        try:
            for stored in back:
                stored.arrival = self._new_id()  # buckets append it at the back: say so
                self._insert(stored)
                filed += 1
        except BaseException:
            for stored in reversed(back[:filed]):
                self._remove(stored)
            for stored, arrival in zip(back, arrivals, strict=True):
                stored.arrival = arrival
            self._next_id = first_id
            raise
        for stored in back if logged else ():  # a write again (a failed batch's undo rewinds it)
            self._log("write", stored)
        for stored in back:
            self._offer(stored)

    # ------------------------------------------------------------------ matching

    @staticmethod
    def _expired(stored: StoredEntry, now: float) -> bool:
        return stored.expires_at is not None and stored.expires_at <= now

    def _matches(
        self,
        template: Template,
        limit: int,
        now: float,
        txn: Transaction | None,
        take: bool,
        order_by: Sequence[OrderKey] | None = None,
    ) -> tuple[list[StoredEntry], bool]:
        """Up to `limit` entries `txn` may use that match `template` (the first in `order_by`'s
        order, or the space's), and whether some other match was skipped for another
        transaction's lock (a CONFLICT: it may yet become usable). With `order_by` None (not
        a `Templates` request) its candidates come from equality buckets alone."""
        index = self._index
        candidates: Iterable[StoredEntry]
        if order_by is not None:  # matchers or an order: planned (index.plan)
            candidates = index.plan(template, order_by, limit)
            unfiled = None
        else:  # equality: the fast path, each candidate checked for what its bucket does not say
            filed = index.bucket_of(template)
            if filed is None:
                return [], False
            candidates = index.members(filed[0])
            unfiled = template.unfiled(filed[1])
        matches, matches_filed = template.matches, template.matches_filed
        # A plain template's bucket that says all it asks (a pair's take: its one field's):
        # nothing is left to compare, and no `matches_filed` call is made per candidate.
        said = unfiled == () and template.__class__ is Template
        # One small field left of a plain template (a batch take's, of two fields): compared by
        # its key here (a small value's key is the value), not by a `matches_filed` call each.
        one_name, one_key = "", None
        if unfiled and len(unfiled) == 1 and template.__class__ is Template:
            name, value = unfiled[0]
            if value.size <= FULL_KEY_LIMIT:
                one_name, one_key = name, value.key
        general = not said and not one_name  # `matches_filed` or `matches` of each
        found: list[StoredEntry] = []
        expired: list[StoredEntry] = []
        conflicted = False
        access = take_access if take else read_access
        for stored in candidates:
            expires_at = stored.expires_at  # `_expired`, inline: a call per candidate otherwise
            if expires_at is not None and expires_at <= now:
                if len(expired) < _LAZY_REMOVALS:
                    expired.append(stored)
            elif (
                said
                or (one_name and (field := stored.fields.get(one_name)) is not None and field.key == one_key)
                or (general and (matches_filed(stored, unfiled) if unfiled is not None else matches(stored)))
            ):
                lock = stored.lock
                if lock is not None:
                    verdict = access(lock, txn)
                    if verdict != OK:
                        conflicted = conflicted or verdict == CONFLICT
                        continue
                found.append(stored)
                if len(found) >= limit:
                    break
        for stored in expired:  # lazily, on access
            self._expire(stored)
        return found, conflicted

    def _expire(self, stored: StoredEntry) -> None:
        logged = self._logged(stored)
        self._remove(stored)
        self.expired += 1
        if logged:
            self._log("expire", stored)
        if self.on_expired is not None:
            self.on_expired(stored.id)

    # ------------------------------------------------------------------ the change log

    def _logged(self, stored: StoredEntry) -> bool:
        """Whether an entry's leaving the space is a change: the log is on and its write was
        one (not a transaction's write before the commit, which nobody else ever saw)."""
        lock = stored.lock
        return self.changes is not None and (lock is None or lock.writer is None)

    def _log_many(
        self,
        kind: str,
        entries: Sequence[StoredEntry],
        visible_at: float | None = None,
        transaction: int = 0,
        now: float | None = None,
    ) -> None:
        """Log a change for each of a call's entries, in order, at one time (their commit point:
        `now`, the call's own reading of the clock, or the clock's now), and tell the backend's
        hooks: `on_change` of each change, then `on_logged` once. Past the commit point: never
        raises (a hook that fails is logged; the change has happened)."""
        changes = self.changes
        if changes is None:
            return
        at = self._clock.time() if now is None else now
        hook = self.on_change
        # A `Change` per entry only for a hook that reads it (a store's recorder): an in-memory
        # server's hook only wakes the space's feeds, once per call (docs/performance.md, "The
        # in-memory path, fourth pass").
        if hook is None:
            if len(entries) == 1:  # a pair's write and take: no batch's dict updates
                changes.log_one(kind, entries[0], at, transaction, visible_at)
            else:
                changes.append_many(kind, entries, at, transaction, visible_at, made=False)
        else:
            # One entry (a durable pair's write and take) without the batch's zips and dict
            # updates, which cost a durable pair 25,000 instructions (the fourth session's close).
            made = (
                [changes.append(kind, entries[0], at, transaction, visible_at)]
                if len(entries) == 1
                else changes.append_many(kind, entries, at, transaction, visible_at)
            )
            for change in made:
                try:
                    hook(change)
                except Exception:
                    log.exception("space %r: recording change %d failed", self.name, change.seq)
        woken = self.on_logged  # `_logged_now`'s, inline
        if woken is not None:
            try:
                woken()
            except Exception:
                log.exception("space %r: telling of new changes failed", self.name)

    def _log(
        self, kind: str, stored: StoredEntry, transaction: int = 0, visible_at: float | None = None
    ) -> None:
        """`_log_many` of one entry."""
        changes = self.changes
        if changes is None:
            return
        hook = self.on_change
        if hook is None:
            changes.log_one(kind, stored, self._clock.time(), transaction, visible_at)
        else:
            change = changes.append(kind, stored, self._clock.time(), transaction, visible_at)
            try:
                hook(change)
            except Exception:
                log.exception("space %r: recording change %d failed", self.name, change.seq)
        self._logged_now()

    def _logged_now(self) -> None:
        """Tell `on_logged` that changes were logged (it wakes the feeds); never raises."""
        woken = self.on_logged
        if woken is not None:
            try:
                woken()
            except Exception:
                log.exception("space %r: telling of new changes failed", self.name)

    def _select(
        self,
        templates: Sequence[Template],
        limit: int,
        txn: Transaction | None = None,
        take: bool = False,
        now: float | None = None,
    ) -> tuple[list[StoredEntry], bool]:
        if now is None:
            now = self._clock.time()
        # Only `Templates` (a request with matchers or an order) is planned; a plain sequence of
        # templates, the equality fast path, pays this one comparison and no other.
        order_by = templates.order_by if templates.__class__ is Templates else None
        if len(templates) == 1:
            return self._matches(templates[0], limit, now, txn, take, order_by)
        conflicted = False
        matches: list[StoredEntry] = []
        for template in templates:
            found, skipped = self._matches(template, limit, now, txn, take, order_by)
            matches.extend(found)
            conflicted = conflicted or skipped
        if order_by:
            return self._index.in_request_order(matches, order_by)[:limit], conflicted
        return self._index.in_order(matches)[:limit], conflicted

    def find_or_conflict(
        self,
        templates: Sequence[Template],
        *,
        take: bool,
        max_entries: int = 1,
        txn: Transaction | None = None,
    ) -> tuple[list[StoredEntry], bool]:
        """Up to `max_entries` entries matching any template, now, removed from the space if `take`
        (under `txn`: take-locked, or read-locked if not `take`); and whether some match was
        skipped for another transaction's lock: a blocked call parks then, and an if_exists call
        waits for that transaction (see `Waiter`)."""
        if txn is not None:
            self._check_active(txn)
        now = self._clock.time()  # the matching's and the take's log's
        if len(templates) == 1:  # `_select`'s one template, inline: a pair's take
            order_by = templates.order_by if templates.__class__ is Templates else None
            found, conflicted = self._matches(templates[0], max_entries, now, txn, take, order_by)
        else:
            found, conflicted = self._select(templates, max_entries, txn, take, now)
        if txn is None:
            # an entry found in the index is visible (not hidden); with no lock in the space,
            # none of them is locked, and the generator is not run
            if (
                take
                and len(found) > 1
                and (not self._locked or all(s.lock is None and s.hidden_until is None for s in found))
            ):
                self._remove_many(found)
                self._log_many("take", found, None, 0, now)
            elif take:  # the common take, without closures: unfiled one by one, or none of them
                removed = 0
                try:
                    for stored in found:
                        self._remove(stored)
                        removed += 1
                except BaseException:
                    for stored in found[:removed]:
                        self._put_back(stored)
                    raise
                if found:
                    self._log_many("take", found, None, 0, now)
            return found, conflicted
        undos: list[Callable[[], None]] = []
        try:
            for stored in found:
                undos.append(self._claim(stored, take, txn))
        except BaseException:
            for undo in reversed(undos):
                undo()
            raise
        return found, conflicted

    def park(self, waiter: Waiter) -> None:
        """Park a read or take that found nothing; a matching write will `deliver` to it."""
        if waiter.txn is not None:
            self._check_active(waiter.txn)
        self._file_waiter(waiter)

    def _file_waiter(self, waiter: Waiter) -> None:
        self._waiters.add(waiter)  # first: the step that can fail
        if waiter.txn is not None:
            waiter.txn.waiters.add(waiter.seq)
            self._by_seq[waiter.seq] = waiter
        if waiter.if_exists:
            self._if_exists[waiter.seq] = waiter

    def unpark(self, waiter: Waiter) -> None:
        """Forget a waiter (its deadline passed or its call was cancelled)."""
        self._waiters.remove(waiter)  # first: the step that can fail
        self._if_exists.pop(waiter.seq, None)
        if waiter.txn is not None:
            waiter.txn.waiters.discard(waiter.seq)
            self._by_seq.pop(waiter.seq, None)

    def candidates(self, templates: Sequence[Template]) -> list[StoredEntry]:
        """Every entry that may match one of `templates`, in the space's order, without checking
        them: a copy of the buckets made at C speed, for callers that filter in slices with
        `visible` and yield between them (contents of a large space must not hold the loop)."""
        return self._index.candidates(templates, order_of(templates))

    def first_candidates(
        self, templates: Sequence[Template], max_entries: int
    ) -> tuple[list[StoredEntry], bool]:
        """`candidates`, for a caller that wants at most `max_entries` (0: all) of them: with an
        order or matchers, only the first `max_entries` that match the templates (an ordered index
        is read no further), and whether more may follow; else every candidate, and False."""
        order = order_of(templates)
        if max_entries and (order or any(template.matchers for template in templates)):
            return self._index.first_candidates(templates, order, max_entries)
        return self._index.candidates(templates, order), False

    def visible(
        self, templates: Sequence[Template], stored: StoredEntry, txn: Transaction | None = None
    ) -> bool:
        """Whether a candidate is still in the space, unexpired, matches a template, and may be
        read by `txn` (None: no transaction)."""
        lock = stored.lock
        return (
            self.is_live(stored)
            and stored.hidden_until is None
            and any(template.matches(stored) for template in templates)
            and (lock is None or read_access(lock, txn) == OK)
        )

    def is_live(self, stored: StoredEntry) -> bool:
        """Whether an entry (one of `candidates`, say) is still in the space (not taken, cancelled
        or expired)."""
        return stored.id in self._entries and not self._expired(stored, self._clock.time())

    def count(self, templates: Sequence[Template], txn: Transaction | None = None) -> int:
        """How many entries match any template now, that `txn` (None: no transaction) may read."""
        # A bucket's size is the answer only while it holds nothing expired. Reap a bounded batch
        # (never all of a mass expiry in one request); if leases are still due, count by walking
        # the candidates, which skips and drops the expired ones it meets.
        settled = self.reap(_COUNT_REAP_BATCH) < _COUNT_REAP_BATCH  # fewer than asked: none left due
        if settled and not self._locked and len(templates) == 1:
            exact = self._index.exact_count(templates[0])
            if exact is not None:
                return exact
        return len(self._select(templates, len(self._entries) or 1, txn)[0])

    # ------------------------------------------------------------------ notify

    def register(
        self,
        templates: tuple[Template, ...],
        lease: float | None,
        on_event: Callable[[int, StoredEntry], None],
        on_end: Callable[[], None],
        txn: Transaction | None = None,
    ) -> tuple[Registration, LeaseGrant]:
        """Register for an event per matching write until the lease ends or is cancelled. Under
        `txn` it also hears of that transaction's own writes, and ends when the transaction does."""
        expires_at, granted = self._grant(lease, self._clock.time())
        if txn is not None:
            self._check_active(txn)
        registration = Registration(self._new_id(), templates, on_event, on_end, expires_at)
        try:
            self._file_registration(registration)
        except BaseException:
            self._next_id = registration.seq
            raise
        if txn is not None:
            registration.txn = txn
            txn.registrations.add(registration.seq)
        return registration, LeaseGrant(registration.seq, expires_at, granted)

    def _file_registration(self, registration: Registration) -> None:
        """File a registration by its templates and its lease, all or nothing."""
        self._registrations.add(registration)
        try:
            self._move_expiry(registration.seq, None, registration.expires_at)
        except BaseException:
            self._registrations.remove(registration)
            raise
        self._registration_by_id[registration.seq] = registration

    def restore_registration(
        self,
        registration_id: int,
        templates: tuple[Template, ...],
        expires_at: float | None,
        sequence: int,
        on_event: Callable[[int, StoredEntry], None],
        on_end: Callable[[], None],
    ) -> Registration:
        """Put back a registration recovered after a restart, numbering events from `sequence`."""
        registration = Registration(registration_id, templates, on_event, on_end, expires_at)
        registration.sequence = sequence
        self._file_registration(registration)
        self._next_id = self._ids.at_least(max(self._next_id, registration_id + 1))
        return registration

    def registration(self, registration_id: int) -> Registration | None:
        """The live registration with this lease id, if any."""
        registration = self._registration_by_id.get(registration_id)
        if registration is None or self._expired_registration(registration, self._clock.time()):
            return None
        return registration

    @staticmethod
    def _expired_registration(registration: Registration, now: float) -> bool:
        return registration.expires_at is not None and registration.expires_at <= now

    def unregister(self, registration: Registration) -> None:
        """End a registration whose listener went away; no end callback. All or nothing."""
        if registration.seq not in self._registration_by_id:
            return
        self._registrations.remove(registration)
        try:
            self._move_expiry(registration.seq, registration.expires_at, None)
        except BaseException:
            self._registrations.add(registration)
            raise
        del self._registration_by_id[registration.seq]

    def _end(self, registration: Registration) -> None:
        self.unregister(registration)
        registration.on_end()

    # ------------------------------------------------------------------ leases

    def renew(self, lease_id: int, lease: float | None) -> LeaseGrant:
        """Set a lease to end `lease` seconds from now (cut to the space's max_lease)."""
        now = self._clock.time()
        expires_at, granted = self._grant(lease, now, "duration")
        stored = self._entries.get(lease_id)
        txn = self._transactions.get(lease_id)
        if stored is not None and not self._expired(stored, now):
            self._move_expiry(lease_id, stored.expires_at, expires_at)
            stored.expires_at = expires_at
        elif txn is not None and not self._expired_transaction(txn, now):
            self._move_expiry(lease_id, txn.expires_at, expires_at)
            txn.expires_at = expires_at
        else:
            registration = self._registration_by_id.get(lease_id)
            if registration is None or (
                registration.expires_at is not None and registration.expires_at <= now
            ):
                raise LeaseNotFoundError(f"lease {lease_id} in space {self.name!r} is unknown or has ended")
            self._move_expiry(lease_id, registration.expires_at, expires_at)
            registration.expires_at = expires_at
        return LeaseGrant(lease_id, expires_at, granted)

    def cancel(self, lease_id: int, kind: str = "cancel") -> StoredEntry | None:
        """End a lease now: its entry leaves the space (and is returned; logged as a change of
        `kind`, "cancel" or an admin's "purge"), its registration ends, or its transaction
        aborts."""
        now = self._clock.time()
        stored = self._entries.get(lease_id)
        if stored is not None and not self._expired(stored, now):
            logged = self._logged(stored)
            self._remove(stored)
            if logged:
                self._log(kind, stored)
            return stored
        txn = self._transactions.get(lease_id)
        if txn is not None and not self._expired_transaction(txn, now):
            self.abort(txn)
            return None
        registration = self._registration_by_id.get(lease_id)
        if registration is None or (registration.expires_at is not None and registration.expires_at <= now):
            raise LeaseNotFoundError(f"lease {lease_id} in space {self.name!r} is unknown or has ended")
        self._end(registration)
        return None

    def lease_expiry(self, lease_id: int) -> float | None:
        """When a live entry's or registration's lease ends (None: forever); LeaseNotFoundError if
        there is no such lease."""
        stored = self._entries.get(lease_id)
        if stored is not None:
            return stored.expires_at
        txn = self._transactions.get(lease_id)
        if txn is not None:
            return txn.expires_at
        registration = self._registration_by_id.get(lease_id)
        if registration is None:
            raise LeaseNotFoundError(f"lease {lease_id} in space {self.name!r} is unknown or has ended")
        return registration.expires_at

    def set_expiry(self, lease_id: int, expires_at: float | None) -> None:
        """Put a lease's end back where it was (undoing a renewal that could not be stored)."""
        holder: StoredEntry | Transaction | Registration | None = self._entries.get(lease_id)
        if holder is None:
            holder = self._transactions.get(lease_id) or self._registration_by_id.get(lease_id)
        if holder is not None:
            self._move_expiry(lease_id, holder.expires_at, expires_at)
            holder.expires_at = expires_at

    def revoke(self, entries: Iterable[StoredEntry]) -> None:
        """Undo a write that could not be stored: its entries leave the space and count as expired
        from the start, so a take that held one cannot put it back. Never raises (it is itself
        an undo): an entry that cannot be unfiled is still expired, so nobody sees it and the next
        find that meets it unfiles it."""
        for stored in entries:
            try:
                self._remove(stored)
            except Exception:
                log.exception("space %r: revoking entry %d failed; it is expired", self.name, stored.id)
            stored.expires_at = 0.0

    def reap(self, limit: int = 1 << 62) -> int:
        """Drop up to `limit` expired entries and registrations, and abort the transactions whose
        lease ran out; returns how many were due. If one of them fails, it and the rest are filed
        again (a later reap, or a lazy expiry, gets them) and the error is raised."""
        due = self._leases.pop_due(self._clock.time(), limit)
        for done, lease_id in enumerate(due):
            try:
                self._lapse(lease_id)
            except BaseException:
                self._refile(due[done:])
                raise
        return len(due)

    def _lapse(self, lease_id: int) -> None:
        """A lease ran out: its entry expires, its transaction aborts, or its registration ends."""
        stored = self._entries.get(lease_id)
        if stored is not None:
            self._expire(stored)
            return
        txn = self._transactions.get(lease_id)
        if txn is not None:
            self.abort(txn)
            return
        registration = self._registration_by_id.get(lease_id)
        if registration is not None:
            self._end(registration)
            return
        self._lapse_timer(lease_id)  # a hidden entry's delay or delivery deadline

    def _refile(self, lease_ids: Iterable[int]) -> None:
        for lease_id in lease_ids:
            holder: StoredEntry | Transaction | Registration | None = self._entries.get(lease_id)
            if holder is None:
                holder = self._transactions.get(lease_id) or self._registration_by_id.get(lease_id)
            if holder is not None and holder.expires_at is not None:
                self._leases.add(lease_id, holder.expires_at)
            elif holder is None and (hidden := self._hidden_by_timer(lease_id)) is not None:
                assert hidden.hidden_until is not None
                self._leases.add(lease_id, hidden.hidden_until)

    def close(self) -> None:
        """End every registration (the server is stopping)."""
        for registration in list(self._registration_by_id.values()):
            try:
                self._end(registration)
            except Exception:
                log.exception("space %r: ending registration %d failed", self.name, registration.seq)

    @property
    def waiting(self) -> int:
        """How many reads and takes are parked."""
        return len(self._waiters)

    @property
    def registered(self) -> int:
        """How many notify registrations are open."""
        return len(self._registration_by_id)

    def type_counts(self) -> dict[str, int]:
        """Entries of each type or a subtype (the size of its bucket)."""
        return self._index.type_counts()

    def statistics(self) -> SpaceStatistics:
        return SpaceStatistics(
            entries=len(self._entries),
            bytes=self._bytes,
            waiters=len(self._waiters),
            registrations=len(self._registration_by_id),
            types=len(self._types),
            transactions=len(self._transactions),
            locked=self._locked,
            in_flight=self.in_flight,
            delayed=self.delayed,
            redelivered=self.redelivered,
            dead_lettered=self.dead_lettered,
        )

    # ------------------------------------------------------------------ inspection (admin)

    def _note_written(self, first_id: int, now: float) -> None:
        times = self._written_at
        times.note(first_id, now)
        if len(times) >= PRUNE_AT and self._entries:
            times.prune(next(iter(self._entries)))  # the oldest filed, but for one put back

    def oldest_written(self) -> float | None:
        """About when (to a second, at or before) the oldest entry still in the space was written;
        None when the space is empty."""
        if not self._entries:
            return None
        oldest = min(self._entries)  # ids grow with each write; at C speed
        self._written_at.prune(oldest)
        return self._written_at.written_at(oldest)

    def stored(self, entry_id: int) -> StoredEntry | None:
        """The entry with this id if it is in the space (expired or not)."""
        return self._entries.get(entry_id)

    def snapshot(self) -> list[StoredEntry]:
        """Every entry in the space, a copy (made at C speed) for callers that walk it in slices."""
        return list(self._entries.values())

    def index_slots(self) -> list[tuple[str, str, Hashable]]:
        """Every (type, field, value key) index slot, a copy."""
        return self._index.field_slots()

    def declared_types(self) -> dict[str, tuple[str, ...]]:
        """Every type the space knows, with its supertypes."""
        return dict(self._types)

    def parked(self) -> list[Waiter]:
        """The parked reads and takes."""
        return list(self._waiters.all())

    def registration_list(self) -> list[Registration]:
        return list(self._registration_by_id.values())

    def transaction_list(self) -> list[Transaction]:
        return list(self._transactions.values())

    def browse(
        self, templates: Sequence[Template], after: int, limit: int, scan: int
    ) -> tuple[list[StoredEntry], int]:
        """Up to `limit` entries readable outside a transaction that match one of `templates`
        (none: every entry), in arrival order, from the one after arrival number `after` on,
        looking at `scan` candidates at most; and the cursor of the next page (the arrival of the
        last candidate looked at), 0 when there is no next page."""
        ordered: Iterable[StoredEntry]  # the candidates in arrival order (as filed)
        if not templates:
            ordered = self._entries.values()
        elif len(templates) == 1:
            bucket = self._index.bucket(templates[0])
            ordered = (
                () if bucket is None else (bucket,) if isinstance(bucket, StoredEntry) else bucket.values()
            )
        else:
            ordered = self._index.candidates(templates)
            if not self.settings.fifo:
                ordered.reverse()
        if templates and (self._pending or self._delayed):
            ordered = self.browse_hidden(templates, ordered)  # hidden entries are not in the index
        if after:
            candidates = list(ordered)  # at C speed, to find the cursor by bisection
            start = bisect.bisect_right(candidates, after, key=lambda stored: stored.arrival)
        else:  # the first page: from the front, without a copy
            candidates, start = list(itertools.islice(ordered, scan + 1)), 0
        found: list[StoredEntry] = []
        looked = start
        for stored in candidates[start : start + scan]:
            looked += 1
            lock = stored.lock
            if (
                self.is_live(stored)
                and (not templates or any(template.matches(stored) for template in templates))
                and (lock is None or read_access(lock, None) == OK)
            ):
                found.append(stored)
                if len(found) >= limit:
                    break
        more = looked < len(candidates)
        return found, candidates[looked - 1].arrival if more and looked > start else 0
