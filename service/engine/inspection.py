"""What an operator sees of a space (the admin API's DescribeSpace): its types with their entries,
bytes and index slots, its parked waiters grouped by template, its registrations and transactions.

Pure: the backend feeds a `Tally` the space's entries and index slots in slices (a large space
must not hold the event loop), then `describe` puts the figures together.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field

from outrig.service.engine.changes import ChangeLog
from outrig.service.engine.model import Registration, StoredEntry, Template, Transaction, Waiter
from outrig.service.engine.space import SpaceEngine, SpaceSettings

__all__ = [
    "MAX_LISTED",
    "ChangeLogView",
    "RegistrationView",
    "SpaceDescription",
    "Tally",
    "TransactionView",
    "TypeView",
    "WaiterGroup",
    "change_log_view",
    "describe",
    "waiter_groups",
]

#: Waiter groups, registrations and transactions a description lists at most (each also counted).
MAX_LISTED = 1000


@dataclass
class TypeView:
    """One type: its supertypes, its own entries and their bytes, entries of it or a subtype,
    and the distinct values (index buckets) of each field indexed under it."""

    type_name: str
    supertypes: tuple[str, ...]
    entries: int = 0
    bytes: int = 0
    with_subtypes: int = 0
    indexes: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class WaiterGroup:
    """Parked reads or takes with the same templates: how many, and how many under a transaction."""

    templates: tuple[Template, ...]
    take: bool
    count: int
    transactional: int


@dataclass(frozen=True, slots=True)
class RegistrationView:
    id: int
    templates: tuple[Template, ...]
    expires_at: float | None
    sequence: int
    transaction: int


@dataclass(frozen=True, slots=True)
class TransactionView:
    id: int
    expires_at: float | None
    written: int
    taken: int
    read_locked: int
    waiters: int


@dataclass(frozen=True, slots=True)
class ChangeLogView:
    """A space's change log (engine/changes.py): its epoch, head and oldest held seq, the changes
    and bytes it holds, and its durable subscriptions with their positions (by name)."""

    epoch: int
    head: int
    oldest: int
    count: int
    bytes: int
    subscriptions: dict[str, int]


@dataclass(frozen=True, slots=True)
class SpaceDescription:
    """A space as DescribeSpace reports it (lists cut to MAX_LISTED; the counts are whole)."""

    space: str
    entries: int
    bytes: int
    types: list[TypeView]
    waiting: list[WaiterGroup]
    waiters: int
    registration_list: list[RegistrationView]
    registrations: int
    transaction_list: list[TransactionView]
    transactions: int
    locked: int
    oldest_entry_age: float | None
    expired: int
    settings: SpaceSettings
    max_registrations: int
    in_flight: int = 0  # pending deliveries (takes with an acknowledgement deadline)
    delayed: int = 0  # entries hidden until a time
    redelivered: int = 0  # deliveries that ended unacknowledged, since the space was made
    dead_lettered: int = 0  # entries moved to the dead-letter space, since the space was made
    dead_letter: str = ""  # the space's dead-letter space
    changes: ChangeLogView | None = None  # its change log (None: `changes = false`)


class Tally:
    """Entries and index slots of a space, added a slice at a time, by type."""

    def __init__(self, declared: dict[str, tuple[str, ...]]) -> None:
        self.types = {name: TypeView(name, supertypes) for name, supertypes in declared.items()}

    def view(self, type_name: str) -> TypeView:
        view = self.types.get(type_name)
        if view is None:
            view = self.types[type_name] = TypeView(type_name, ())
        return view

    def add_entries(self, entries: Iterable[StoredEntry]) -> None:
        for stored in entries:
            view = self.view(stored.lineage[0])
            view.entries += 1
            view.bytes += stored.size

    def add_slots(self, slots: Iterable[tuple[str, str, Hashable]]) -> None:
        """Index slots, as `EntryIndex.field_slots` lists them: (type, field, value key)."""
        for type_name, field_name, _ in slots:
            indexes = self.view(type_name).indexes
            indexes[field_name] = indexes.get(field_name, 0) + 1


def _templates_key(templates: Sequence[Template]) -> tuple[object, ...]:
    return tuple(
        (t.type_name, tuple((name, value.kind, value.key) for name, value in t.fields)) for t in templates
    )


def waiter_groups(waiters: Iterable[Waiter]) -> list[WaiterGroup]:
    """Parked waiters grouped by (templates, take), the largest group first."""
    groups: dict[tuple[object, ...], list[Waiter]] = {}
    for waiter in waiters:
        groups.setdefault((waiter.take, _templates_key(waiter.templates)), []).append(waiter)
    found = [
        WaiterGroup(
            members[0].templates, members[0].take, len(members), sum(w.txn is not None for w in members)
        )
        for members in groups.values()
    ]
    found.sort(key=lambda group: -group.count)
    return found


def _registration(registration: Registration) -> RegistrationView:
    txn = registration.txn
    return RegistrationView(
        registration.seq,
        registration.templates,
        registration.expires_at,
        registration.sequence,
        0 if txn is None else txn.id,
    )


def _transaction(txn: Transaction) -> TransactionView:
    return TransactionView(
        txn.id, txn.expires_at, len(txn.written), len(txn.taken), len(txn.read_locked), len(txn.waiters)
    )


def change_log_view(log: ChangeLog | None) -> ChangeLogView | None:
    """What DescribeSpace shows of a change log (durable subscriptions in name order)."""
    if log is None:
        return None
    return ChangeLogView(
        log.epoch, log.head, log.oldest, log.count, log.bytes, dict(sorted(log.subscriptions.items()))
    )


def describe(engine: SpaceEngine, tally: Tally, now: float, max_registrations: int) -> SpaceDescription:
    """The description of `engine`'s space, with the types `tally` was given."""
    counts = engine.type_counts()
    for type_name, number in counts.items():
        tally.view(type_name).with_subtypes = number
    stats = engine.statistics()
    registrations = engine.registration_list()
    transactions = engine.transaction_list()
    oldest = engine.oldest_written()
    return SpaceDescription(
        space=engine.name,
        entries=stats.entries,
        bytes=stats.bytes,
        types=sorted(tally.types.values(), key=lambda view: view.type_name),
        waiting=waiter_groups(engine.parked())[:MAX_LISTED],
        waiters=stats.waiters,
        registration_list=[_registration(r) for r in sorted(registrations, key=lambda r: r.seq)[:MAX_LISTED]],
        registrations=stats.registrations,
        transaction_list=[_transaction(t) for t in sorted(transactions, key=lambda t: t.id)[:MAX_LISTED]],
        transactions=stats.transactions,
        locked=stats.locked,
        oldest_entry_age=None if oldest is None else max(0.0, now - oldest),
        expired=engine.expired,
        settings=engine.settings,
        max_registrations=max_registrations,
        in_flight=stats.in_flight,
        delayed=stats.delayed,
        redelivered=stats.redelivered,
        dead_lettered=stats.dead_lettered,
        dead_letter=engine.dead_letter_space,
        changes=change_log_view(engine.changes),
    )
