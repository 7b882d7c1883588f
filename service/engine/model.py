"""The engine's records: entries to write, stored entries, templates, granted leases, parked
waiters, notify registrations, transactions, what a transaction's end changed, and deliveries
(takes with an acknowledgement deadline)."""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from outrig.service.engine.locks import EntryLock
from outrig.service.engine.matchers import Matcher
from outrig.service.engine.values import FULL_KEY_LIMIT, FieldValue


class Record:
    """A record compared, hashed and shown by its attributes (`_fields`, in order), as a frozen
    dataclass is, but made at a plain slotted class's cost: a frozen dataclass's `__init__` sets
    each field through `object.__setattr__`, about 0.9 us for five fields against 0.2 here, and a
    batch of 100 entries makes three such records per entry (NewEntry, LeaseGrant, Change).

    Its attributes are read-only by type (`Final`: mypy refuses an assignment); nothing in the
    server assigns to them after `__init__`."""

    __slots__ = ()
    _fields: tuple[str, ...] = ()

    def _values(self) -> tuple[object, ...]:
        return tuple([getattr(self, name) for name in self._fields])

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return self._values() == other._values()

    def __hash__(self) -> int:
        return hash(self._values())

    def __repr__(self) -> str:
        shown = ", ".join(f"{name}={getattr(self, name)!r}" for name in self._fields)
        return f"{type(self).__name__}({shown})"


class NewEntry(Record):
    """An entry to write, already validated by the adapter.

    `payload` is whatever the adapter wants back when the entry is returned (the servicer keeps
    the entry's encoded bytes, framed as a reply's field, so replies need no re-encoding); `size`
    is its encoded size in bytes, charged against the space's byte quota.

    `lineage` is the type followed by its supertypes, the stored entry's: a batch's reading
    passes one tuple for the entries of one lineage (their `StoredEntry`s share it, and the
    index's batch filing tells a run of one lineage by identity), else it is made here. Not one
    of the attributes it is compared by: it follows from the type and supertypes.
    """

    __slots__ = ("fields", "lineage", "payload", "size", "supertypes", "type_name")
    _fields = ("type_name", "supertypes", "fields", "payload", "size")

    def __init__(
        self,
        type_name: str,
        supertypes: tuple[str, ...],
        fields: Mapping[str, FieldValue],
        payload: object,
        size: int,
        lineage: tuple[str, ...] | None = None,
    ) -> None:
        self.type_name: Final = type_name
        self.supertypes: Final = supertypes
        self.fields: Final = fields
        self.payload: Final = payload
        self.size: Final = size
        self.lineage: Final = (type_name, *supertypes) if lineage is None else lineage


class StoredEntry:
    """An entry in a space. `lineage` is its type followed by its supertypes."""

    __slots__ = (
        "arrival",
        "dead_letter_reason",
        "deliveries",
        "expires_at",
        "fields",
        "frozen",
        "hidden_until",
        "id",
        "lineage",
        "lock",
        "logged",
        "payload",
        "receipt",
        "size",
    )

    def __init__(self, entry_id: int, new: NewEntry, expires_at: float | None) -> None:
        self.id = entry_id
        # Position in the space's arrival order: the id, until the entry is put back after a
        # cancelled take, when it joins the back of the queue like a new write.
        self.arrival = entry_id
        self.lineage = new.lineage
        self.fields = new.fields
        self.payload = new.payload
        self.size = new.size
        self.expires_at = expires_at
        # The transactions' locks on it (engine/locks.py); None, the common case, is none.
        self.lock: EntryLock | None = None
        # Takes with an acknowledgement deadline (engine/deliveries.py): how many times it has been
        # delivered, until when it is hidden (out of the index: a pending delivery's deadline, or a
        # delayed write's or returned delivery's visible_at; None: visible), its pending delivery's
        # receipt (None: none), and why it is in a dead-letter space ("": it is not).
        self.deliveries = 0
        self.hidden_until: float | None = None
        self.receipt: int | None = None
        self.dead_letter_reason = ""
        # The seq of its write in its space's change log (engine/changes.py; 0: none), so that
        # its take can put the entry's `frozen_entry` in that change's place too.
        self.logged = 0
        # Its `frozen_entry` once it is gone (made by the change log, and kept here so that the
        # request window's record of its take shares it).
        self.frozen: FrozenEntry | None = None

    @property
    def type_name(self) -> str:
        return self.lineage[0]

    def __repr__(self) -> str:
        return f"StoredEntry(id={self.id}, type={self.type_name!r})"


FrozenEntry = tuple[Any, ...]
"""A `StoredEntry` that has left its space, as one plain tuple of its attributes (`frozen_entry`):
what the change log and the request window keep of a taken entry. CPython's collector untracks an
exact tuple whose members are untracked (its first collection after theirs), so a taken entry
kept for feeds and retries is no longer walked by every full collection as its `StoredEntry`, its
fields dict and its `FieldValue`s were (docs/performance.md, "A taken entry after its take").
`thawed_entry` makes a `StoredEntry` of it again, equal attribute by attribute."""

# A FrozenEntry's members: these attributes, in this order, then (name, kind, data) of each field,
# then the lineage's names ("lineage" is their count): flat, as a tuple in the tuple would be
# untracked only at the collection after its own.
_FROZEN = (
    "id",
    "arrival",
    "lineage",
    "payload",
    "size",
    "expires_at",
    "deliveries",
    "hidden_until",
    "receipt",
    "dead_letter_reason",
    "logged",
)
_FIELDS_AT = len(_FROZEN)
FROZEN_SIZE = _FROZEN.index("size")
"""Where a FrozenEntry holds its entry's `size`."""


def frozen_entry(stored: StoredEntry) -> FrozenEntry:
    """`stored` as a `FrozenEntry`, made now and kept as its `frozen` (its lock is not kept: a
    gone entry's is None)."""
    lineage = stored.lineage
    # a list extended field by field, then made a tuple: 0.40 us for four fields against 0.59 for
    # one tuple display with a comprehension unpacked into it (timeit)
    parts = [
        stored.id,
        stored.arrival,
        len(lineage),
        stored.payload,
        stored.size,
        stored.expires_at,
        stored.deliveries,
        stored.hidden_until,
        stored.receipt,
        stored.dead_letter_reason,
        stored.logged,
    ]
    for name, value in stored.fields.items():
        parts += (name, value.kind, value.data)
    parts += lineage
    stored.frozen = frozen = tuple(parts)
    return frozen


def thawed_entry(frozen: FrozenEntry) -> StoredEntry:
    """The `StoredEntry` a `FrozenEntry` was made of, again: a new one, of equal attributes (its
    fields' `FieldValue`s made anew from their kinds and data, so of equal keys)."""
    stored = StoredEntry.__new__(StoredEntry)
    (
        stored.id,
        stored.arrival,
        types,
        stored.payload,
        stored.size,
        stored.expires_at,
        stored.deliveries,
        stored.hidden_until,
        stored.receipt,
        stored.dead_letter_reason,
        stored.logged,
    ) = frozen[:_FIELDS_AT]
    end = len(frozen) - types
    stored.lineage = frozen[end:]
    stored.fields = {
        frozen[at]: FieldValue(frozen[at + 1], frozen[at + 2]) for at in range(_FIELDS_AT, end, 3)
    }
    stored.lock = None
    stored.frozen = frozen
    return stored


class Template:
    """A type name and the fields an entry must equal; absent fields are wildcards.

    Null-valued fields are dropped here: a null template field is a wildcard (JavaSpaces).
    Fields are kept sorted by name so that two equal templates index identically. A template
    with matchers too is a `MatcherTemplate`: this class, the equality fast path, stays as it was.
    """

    __slots__ = ("_unfiled", "fields", "type_name")

    matchers: tuple[tuple[str, Matcher], ...] = ()  # none: see MatcherTemplate

    def __init__(self, type_name: str, fields: Mapping[str, FieldValue]) -> None:
        self.type_name = type_name
        self.fields: tuple[tuple[str, FieldValue], ...] = tuple(
            sorted((name, value) for name, value in fields.items() if value.kind != "null")
        )
        # `unfiled`'s answers by the bucket's field (a template is matched again and again).
        self._unfiled: dict[str | None, tuple[tuple[str, FieldValue], ...]] = {}

    def matches(self, entry: StoredEntry) -> bool:
        """True when `entry` is of this type (or a subtype) and equals every set field."""
        if self.type_name not in entry.lineage:
            return False
        fields = entry.fields
        for name, value in self.fields:  # noqa: SIM110 - a plain loop: this is the hottest path
            if fields.get(name) != value:
                return False
        return True

    def unfiled(self, filed: str | None) -> tuple[tuple[str, FieldValue], ...]:
        """The fields an entry filed in this template's bucket of the field `filed` (None: of its
        type, `EntryIndex.bucket_of`) may still differ in: every other one, and `filed` itself
        when its bucket is keyed by a sample of a large value (values.py). Such an entry is of
        the type (or a subtype) already: a bucket is filed under each type of a lineage."""
        rest = self._unfiled.get(filed)
        if rest is None:
            rest = self._unfiled[filed] = tuple(
                (name, value) for name, value in self.fields if name != filed or value.size > FULL_KEY_LIMIT
            )
        return rest

    def matches_filed(self, entry: StoredEntry, unfiled: tuple[tuple[str, FieldValue], ...]) -> bool:
        """`matches` of an entry from the bucket `unfiled` was asked for (`unfiled`'s answer):
        only those fields are compared, each by its key (a small value's key is the value)
        before its data: no `FieldValue.__eq__` call per field."""
        fields = entry.fields
        for name, value in unfiled:
            found = fields.get(name)
            if (
                found is None
                or found.key != value.key
                or (value.size > FULL_KEY_LIMIT and found.data != value.data)
            ):
                return False
        return True

    @property
    def empty(self) -> bool:
        """True when no entry can match (a matcher that holds for nothing, as an empty range)."""
        return False

    def __repr__(self) -> str:
        return f"Template({self.type_name!r}, {dict(self.fields)!r})"


class MatcherTemplate(Template):
    """A template with matchers (matchers.py) beside its equality fields, sorted by name too."""

    __slots__ = ("matchers",)

    def __init__(
        self, type_name: str, fields: Mapping[str, FieldValue], matchers: Mapping[str, Matcher]
    ) -> None:
        super().__init__(type_name, fields)
        self.matchers = tuple(sorted(matchers.items(), key=_name_of))

    def matches(self, entry: StoredEntry) -> bool:
        """True when `entry` is of this type (or a subtype), equals every set field and satisfies
        every matcher."""
        if not super().matches(entry):
            return False
        fields = entry.fields
        return all(matcher.test(fields.get(name)) for name, matcher in self.matchers)

    def matches_filed(self, entry: StoredEntry, unfiled: tuple[tuple[str, FieldValue], ...]) -> bool:
        if not super().matches_filed(entry, unfiled):
            return False
        fields = entry.fields
        return all(matcher.test(fields.get(name)) for name, matcher in self.matchers)

    @property
    def empty(self) -> bool:
        return any(matcher.empty for _, matcher in self.matchers)

    def __repr__(self) -> str:
        return f"MatcherTemplate({self.type_name!r}, {dict(self.fields)!r}, {dict(self.matchers)!r})"


def make_template(
    type_name: str, fields: Mapping[str, FieldValue], matchers: Mapping[str, Matcher] | None = None
) -> Template:
    """A `Template`, or a `MatcherTemplate` when there are matchers."""
    return MatcherTemplate(type_name, fields, matchers) if matchers else Template(type_name, fields)


def _name_of(item: tuple[str, Matcher]) -> str:
    return item[0]


OrderKey = tuple[str, bool]
"""One key of a request's order: (field name, descending)."""


class Templates(tuple[Template, ...]):
    """A request's templates (a match of any qualifies) and the order it asks for its matches in:
    `order_by`, empty for the space's order. It passes through the backends as the plain tuple of
    templates it is, so that only the engine, which sorts, needs to know of the order.

    The codec makes one for every request with matchers or an order, and only then does the engine
    plan (index.plan: ordered indexes, unions of buckets); a plain sequence of templates takes the
    equality fast path, which stays exactly as it was. A `MatcherTemplate` in a plain sequence is
    still matched correctly (every candidate is checked in full), from its equality buckets only."""

    order_by: tuple[OrderKey, ...]

    def __new__(cls, templates: Iterable[Template], order_by: Iterable[OrderKey] = ()) -> Templates:
        made = super().__new__(cls, templates)
        made.order_by = tuple(order_by)
        return made


def order_of(templates: Sequence[Template]) -> tuple[OrderKey, ...]:
    """The order a request's templates ask for (empty: the space's)."""
    return templates.order_by if isinstance(templates, Templates) else ()


class LeaseGrant(Record):
    """A granted lease: `expires_at` is epoch seconds, None for FOREVER."""

    __slots__ = ("expires_at", "granted", "id")
    _fields = ("id", "expires_at", "granted")

    def __init__(self, id: int, expires_at: float | None, granted: float | None) -> None:
        self.id: Final = id
        self.expires_at: Final = expires_at
        self.granted: Final = granted


class Waiter:
    """A parked read or take. `deliver` hands it entries and says whether it still wanted them.

    Under a transaction (`txn`), what it is handed is read- or take-locked for that transaction.
    An `if_exists` waiter (readIfExists, takeIfExists) waits only while the entries it could use
    are locked by other transactions: when none is left locked, it is handed nothing.

    `wants`, if given, says whether it still wants entries (its call has not ended). The engine
    asks before it claims an entry for the waiter, so that what it claims is never refused. A
    waiter without it should never refuse: a refusal by `deliver` is undone afterwards by filing
    the entry again, a step that could itself fail (the entry would then be lost).

    `ack` (seconds; a take only, never under a transaction): a take with an acknowledgement
    deadline. What it is handed is delivered (engine/deliveries.py), not removed: the entry's
    `receipt`, `deliveries` and `hidden_until` say which delivery; `max_deliveries` is the take's
    limit (0: the space's).
    """

    __slots__ = (
        "ack",
        "deliver",
        "if_exists",
        "max_deliveries",
        "max_entries",
        "seq",
        "take",
        "templates",
        "txn",
        "wants",
    )

    def __init__(
        self,
        seq: int,
        templates: tuple[Template, ...],
        take: bool,
        deliver: Callable[[list[StoredEntry]], bool],
        max_entries: int = 1,
        *,
        txn: Transaction | None = None,
        if_exists: bool = False,
        wants: Callable[[], bool] | None = None,
        ack: float | None = None,
        max_deliveries: int = 0,
    ) -> None:
        self.seq = seq
        self.templates = templates
        self.take = take
        self.deliver = deliver
        self.max_entries = max_entries
        self.txn = txn
        self.if_exists = if_exists
        self.wants = wants
        self.ack = ack
        self.max_deliveries = max_deliveries


class TransactionState(enum.Enum):
    ACTIVE = "active"
    COMMITTED = "committed"
    ABORTED = "aborted"


class Transaction:
    """An open transaction of one space and what it holds. Its id is a lease id of the space."""

    __slots__ = ("expires_at", "id", "read_locked", "registrations", "state", "taken", "waiters", "written")

    def __init__(self, transaction_id: int, expires_at: float | None) -> None:
        self.id = transaction_id
        self.expires_at = expires_at
        self.state = TransactionState.ACTIVE
        self.written: dict[int, StoredEntry] = {}  # write-locked: visible to this transaction only
        self.taken: dict[int, StoredEntry] = {}  # take-locked: gone for everyone until commit or abort
        self.read_locked: dict[int, StoredEntry] = {}
        self.registrations: set[int] = set()  # notify registrations made under it
        self.waiters: set[int] = set()  # seqs of its reads and takes parked in the space

    @property
    def active(self) -> bool:
        return self.state is TransactionState.ACTIVE

    def __repr__(self) -> str:
        return (
            f"Transaction({self.id}, {self.state.value}, written={len(self.written)}, "
            f"taken={len(self.taken)}, read={len(self.read_locked)})"
        )


@dataclass(frozen=True, slots=True)
class Delivery:
    """One delivery of an entry taken with an acknowledgement deadline (docs/work-queues.md): the
    entry, the receipt that settles this delivery and only this one (a fresh id of the space), how
    many times the entry has been delivered (this one included), the deadline (epoch seconds), and,
    for an entry of a dead-letter space, why it is there."""

    entry: StoredEntry
    receipt: int
    deliveries: int
    deadline: float
    dead_letter_reason: str = ""


@dataclass(frozen=True, slots=True)
class Returned:
    """What a Nack did: when the entry is visible again (None: now), or the dead-letter space it
    went to instead (its max_deliveries reached)."""

    visible_at: float | None
    dead_letter: str = ""


@dataclass(frozen=True, slots=True)
class TransactionOutcome:
    """What a commit or abort changed: the entries it made visible (committed writes) and removed
    for good (committed takes), or put back (aborted takes)."""

    transaction: Transaction
    written: list[StoredEntry]
    taken: list[StoredEntry]


class Registration:
    """A notify registration: each matching write calls `on_event(sequence, entry)`.

    One made under a transaction (`txn`) also hears that transaction's own writes, and ends
    with it."""

    __slots__ = ("expires_at", "on_end", "on_event", "seq", "sequence", "templates", "txn")

    def __init__(
        self,
        seq: int,
        templates: tuple[Template, ...],
        on_event: Callable[[int, StoredEntry], None],
        on_end: Callable[[], None],
        expires_at: float | None,
    ) -> None:
        self.seq = seq  # also the registration's lease id
        self.templates = templates
        self.on_event = on_event
        self.on_end = on_end
        self.expires_at = expires_at
        self.sequence = 0
        self.txn: Transaction | None = None
