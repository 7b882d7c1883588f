"""The admin API's results in the SDK (`Space.describe`, `Space.browse`, `Space.purge`): plain
dataclasses made from the replies, and the requests, shared by `Space` and `AsyncSpace`.

Templates a description shows (a parked call's, a registration's) come back as
`outrig.GenericEntry` objects, usable as templates again.
"""

from __future__ import annotations

from dataclasses import dataclass

from outrig._codec import AnyEntry, decode_entry, decode_value
from outrig._entry import GenericEntry
from outrig.v1 import space_pb2 as pb

__all__ = [
    "BrowsePage",
    "BrowsedEntry",
    "ChangeLogFigures",
    "RegistrationInfo",
    "SpaceConfiguration",
    "SpaceDescription",
    "SubscriptionInfo",
    "TransactionInfo",
    "TypeFigures",
    "WaiterGroup",
    "browse_page_of",
    "description_of",
]


@dataclass(frozen=True, slots=True)
class TypeFigures:
    """One type of a space (`SpaceDescription.types`).

    Attributes:
        type_name: the type's name; ``supertypes`` its supertypes, most derived first.
        entries: entries of exactly this type; ``bytes`` their encoded size.
        with_subtypes: entries of this type or a subtype (what a template of the type matches).
        indexes: each field the type's entries are indexed under, and its distinct values.
    """

    type_name: str
    supertypes: tuple[str, ...]
    entries: int
    bytes: int
    with_subtypes: int
    indexes: dict[str, int]


@dataclass(frozen=True, slots=True)
class WaiterGroup:
    """Parked reads (``take`` False) or takes with the same templates: how many, and how many of
    them under a transaction."""

    templates: tuple[GenericEntry, ...]
    take: bool
    count: int
    transactional: int


@dataclass(frozen=True, slots=True)
class RegistrationInfo:
    """A notify registration: its id (`Space.cancel_registration` ends it), templates, lease end
    (seconds since the epoch; None: never), last sequence number, and transaction (0: none)."""

    id: int
    templates: tuple[GenericEntry, ...]
    expires_at: float | None
    sequence: int
    transaction: int


@dataclass(frozen=True, slots=True)
class TransactionInfo:
    """An open transaction: its id (`Space.abort_transaction` ends it), lease end (None: never),
    and the entries it wrote, took and read-locked, and its parked calls."""

    id: int
    expires_at: float | None
    written: int
    taken: int
    read_locked: int
    waiters: int


@dataclass(frozen=True, slots=True)
class SpaceConfiguration:
    """The settings and quotas a space runs under (leases in seconds; None: forever)."""

    fifo: bool
    max_entries: int
    max_bytes: int
    default_lease: float | None
    max_lease: float | None
    max_registrations: int
    #: Deliveries of an entry (takes with ``ack=``) before it goes to ``dead_letter``; 0: no limit.
    max_deliveries: int = 0
    dead_letter: str = ""


@dataclass(frozen=True, slots=True)
class SubscriptionInfo:
    """A durable subscription of the change log: its name, its position (the sequence number
    acknowledged; a partitioned space's: its partitions' added up) and that position's cursor."""

    name: str
    position: int
    cursor: str


@dataclass(frozen=True, slots=True)
class ChangeLogFigures:
    """What a space's change log holds (`SpaceDescription.change_log`; docs/notifications.md).

    Attributes:
        epoch: the log's epoch (0 for a partitioned space: each partition has its own).
        head: the sequence number of the newest change (0: none yet); ``oldest`` of the oldest
            held (head + 1 when empty). A partitioned space's are its partitions' added up.
        count: changes held; ``bytes`` their size as retention counts it.
        head_cursor: a stream from it gets what comes next; ``oldest_cursor``: everything held.
        subscriptions: the durable subscriptions, by name.
    """

    epoch: int
    head: int
    oldest: int
    count: int
    bytes: int
    head_cursor: str
    oldest_cursor: str
    subscriptions: list[SubscriptionInfo]


@dataclass(frozen=True, slots=True)
class SpaceDescription:
    """What a space holds (`Space.describe`). The lists hold at most 1,000 items each; the counts
    beside them (``waiters``, ``registrations``, ``transactions``) are whole.

    Attributes:
        oldest_entry_age: seconds since the oldest entry was written, to about a second (an
            entry recovered at the server's start counts from then); None when empty.
        locked: entries some transaction holds a lock on.
        expired: leases expired since the server started.
        in_flight: entries delivered (taken with ``ack=``) and not yet acknowledged.
        delayed: entries written with a delay, or returned with one, not yet visible.
        redelivered: deliveries that ended unacknowledged (returned, or past their deadline)
            since the server started.
        dead_lettered: entries moved to the dead-letter space since the server started.
        change_log: the space's change log, None when its ``changes`` setting is off.
    """

    space: str
    entries: int
    bytes: int
    types: list[TypeFigures]
    waiting: list[WaiterGroup]
    waiters: int
    registration_list: list[RegistrationInfo]
    registrations: int
    transaction_list: list[TransactionInfo]
    transactions: int
    locked: int
    oldest_entry_age: float | None
    expired: int
    configuration: SpaceConfiguration
    in_flight: int = 0
    delayed: int = 0
    redelivered: int = 0
    dead_lettered: int = 0
    change_log: ChangeLogFigures | None = None


@dataclass(frozen=True, slots=True)
class BrowsedEntry:
    """An entry seen by `Space.browse`, not taken: its lease id, the entry, its lease end
    (seconds since the epoch; None: never), and whether a transaction holds a read lock on it.

    Browse shows hidden entries too: ``receipt`` and ``deadline`` are its pending delivery's (a
    take with ``ack=`` not yet acknowledged; None: none), ``visible_at`` when a delayed or
    returned entry becomes visible (None: visible), ``deliveries`` how often it was delivered.
    """

    id: int
    entry: AnyEntry
    expires_at: float | None
    locked: bool
    receipt: int | None = None
    deadline: float | None = None
    visible_at: float | None = None
    deliveries: int = 0


@dataclass(frozen=True, slots=True)
class BrowsePage:
    """A page of `Space.browse`: its entries, and ``next``, the ``after`` of the next page (0:
    there is none)."""

    entries: list[BrowsedEntry]
    next: int


def _expiry(seconds: float) -> float | None:
    return seconds or None


def _templates(messages: object) -> tuple[GenericEntry, ...]:
    return tuple(
        GenericEntry(t.type_name, (), {name: decode_value(t.fields[name]) for name in sorted(t.fields)})
        for t in messages  # type: ignore[attr-defined]  # repeated pb.Template
    )


def description_of(reply: pb.DescribeSpaceReply) -> SpaceDescription:
    c = reply.configuration
    return SpaceDescription(
        space=reply.space,
        entries=reply.entries,
        bytes=reply.bytes,
        types=[
            TypeFigures(
                t.type_name,
                tuple(t.supertypes),
                t.entries,
                t.bytes,
                t.with_subtypes,
                {index.field: index.buckets for index in t.indexes},
            )
            for t in reply.types
        ],
        waiting=[
            WaiterGroup(_templates(w.templates), w.take, w.count, w.transactional) for w in reply.waiting
        ],
        waiters=reply.waiters,
        registration_list=[
            RegistrationInfo(r.id, _templates(r.templates), _expiry(r.expires_at), r.sequence, r.transaction)
            for r in reply.registration_list
        ],
        registrations=reply.registrations,
        transaction_list=[
            TransactionInfo(t.id, _expiry(t.expires_at), t.written, t.taken, t.read_locked, t.waiters)
            for t in reply.transaction_list
        ],
        transactions=reply.transactions,
        locked=reply.locked,
        oldest_entry_age=reply.oldest_entry_age if reply.HasField("oldest_entry_age") else None,
        expired=reply.expired,
        configuration=SpaceConfiguration(
            c.fifo,
            c.max_entries,
            c.max_bytes,
            c.default_lease if c.HasField("default_lease") else None,
            c.max_lease if c.HasField("max_lease") else None,
            c.max_registrations,
            c.max_deliveries,
            c.dead_letter,
        ),
        in_flight=reply.in_flight,
        delayed=reply.delayed,
        redelivered=reply.redelivered,
        dead_lettered=reply.dead_lettered,
        change_log=_change_log(reply.change_log) if reply.HasField("change_log") else None,
    )


def _change_log(log: pb.ChangeLogFigures) -> ChangeLogFigures:
    return ChangeLogFigures(
        log.epoch,
        log.head,
        log.oldest,
        log.count,
        log.bytes,
        log.head_cursor,
        log.oldest_cursor,
        [SubscriptionInfo(s.name, s.position, s.cursor) for s in log.subscriptions],
    )


def browse_page_of(reply: pb.BrowseReply) -> BrowsePage:
    return BrowsePage([_browsed(e) for e in reply.entries], reply.next)


def _browsed(e: pb.BrowsedEntry) -> BrowsedEntry:
    pending = e.delivery if e.HasField("delivery") else None
    return BrowsedEntry(
        e.id,
        decode_entry(e.entry),
        _expiry(e.expires_at),
        e.locked,
        None if pending is None else pending.receipt,
        None if pending is None else pending.deadline,
        e.visible_at or None,
        e.deliveries,
    )
