"""The one narrow interface between the gRPC servicer and where a space lives.

The embedded backend (in-memory indexes, recorded in SQLite: backends/embedded) and the
PostgreSQL backend (backends/postgres) implement it; tests/conformance runs the same suite against
every implementation. Arguments are already validated engine objects (outrig.service.protocol.codec);
results carry the entries' opaque payloads back. `SpaceFigures` is what a backend reports of each
space for the metrics.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from outrig.service.engine.changes import Change
from outrig.service.engine.inspection import SpaceDescription
from outrig.service.engine.model import Delivery, LeaseGrant, NewEntry, Returned, StoredEntry, Template
from outrig.service.exceptions import DeliveryExpiredError, SpaceError


@dataclass(frozen=True, slots=True)
class Event:
    """One notify event: the registration's sequence number and the written entry."""

    sequence: int
    entry: StoredEntry


@dataclass
class SpaceFigures:
    """What one space holds, as a backend reports it at scrape time."""

    entries: int = 0
    bytes: int = 0
    waiters: int = 0
    registrations: int = 0
    transactions: int = 0
    expired: int = 0  # leases expired since the server started
    types: Mapping[str, int] = field(default_factory=dict)  # type -> entries of it or a subtype
    max_entries: int = 0  # the space's quotas (0: not reported)
    max_bytes: int = 0
    in_flight: int = 0  # pending deliveries (takes with an acknowledgement deadline)
    delayed: int = 0  # entries hidden until a time
    redelivered: int = 0  # deliveries that ended unacknowledged, since the server started
    dead_lettered: int = 0  # entries moved to the dead-letter space, since the server started


@dataclass(frozen=True, slots=True)
class TierFigures:
    """A tier server's ownership so far, for the metrics: the spaces it owns now, whether it can
    serve, the spaces it claimed and the seconds their loads took, and the spaces it dropped by
    why: "fenced" (a commit refused by the database: another server had claimed the space),
    "renewal" (a renewal found it claimed elsewhere), "unreachable" (the database did not confirm a
    commit: every space is dropped until it is back) or "moved" (handed to another server)."""

    owned: int
    serving: bool
    claims: int
    load_seconds: float
    dropped: Mapping[str, int]


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a space lives: its owner's server id and address, the ownership's epoch, the seconds
    left on it (None: no owner), and whether the owner is this server."""

    space: str
    owner: str
    address: str
    epoch: int
    expires_in: float | None
    here: bool


class Subscription(Protocol):
    """An open notify registration: iterate its events; they end when its lease does."""

    @property
    def lease(self) -> LeaseGrant: ...

    def __aiter__(self) -> AsyncIterator[Event]: ...

    def close(self) -> None:
        """End the registration (its listener went away)."""


@dataclass(frozen=True, slots=True)
class ChangeBatch:
    """What a change feed read: the matching changes, in order (may be empty), and the position
    (seq) it read through (>= the last change's seq: it may have read past changes that did not
    match, so that a resume skips them)."""

    changes: list[Change]
    position: int


class ChangeFeed(Protocol):
    """An open reader of a space's change log (`SpaceBackend.changes`): iterate its batches; it
    waits at the log's head for the next change, and ends when the backend closes or stops
    serving the space (with the error that says why)."""

    @property
    def epoch(self) -> int:
        """The epoch of the log it reads."""

    @property
    def start(self) -> int:
        """The position it starts after."""

    @property
    def oldest(self) -> int:
        """The oldest position readable now (the oldest held change's seq - 1)."""

    def __aiter__(self) -> AsyncIterator[ChangeBatch]: ...

    def close(self) -> None:
        """Stop reading (the stream went away); a durable subscription is free again."""


class SpaceBackend(Protocol):
    def serving_at(self, address: str) -> None:
        """The address other servers and clients reach this server at (told before `start`)."""

    async def start(self) -> None:
        """Begin background work (lease reaping)."""

    async def close(self) -> None:
        """Stop background work, end blocked calls and every registration's stream."""

    async def shutdown(self) -> None:
        """The server has stopped (in-flight calls are done): flush and release the store."""

    async def write(
        self,
        space: str,
        entries: Sequence[NewEntry],
        lease: float | None,
        *,
        request_id: str = "",
        transaction: int = 0,
        visible_at: float | None = None,
    ) -> list[LeaseGrant]:
        """Store all entries or none; lease in seconds, math.inf = FOREVER, None = the default.
        A request id seen before (in the window) returns the first call's grants. Under a
        `transaction` (its id; 0: none) the entries are seen by it alone until it commits.
        `visible_at` (epoch seconds; never with a transaction): the entries stay invisible to
        every read, take, count, contents and notify until then, and are then offered to waiters
        and published, in their place in arrival order."""

    async def match(
        self,
        space: str,
        templates: Sequence[Template],
        *,
        take: bool,
        max_entries: int,
        timeout: float | None,
        if_exists: bool,
        request_id: str = "",
        transaction: int = 0,
    ) -> list[StoredEntry]:
        """Read or take up to max_entries matches, waiting up to timeout (None: forever) for one.
        A take's request id seen before (in the window) returns the first call's entries.
        `if_exists` waits only while the matches it could use are locked by other transactions.
        Under a `transaction`, what it reads is read-locked and what it takes take-locked."""

    async def deliver(
        self,
        space: str,
        templates: Sequence[Template],
        *,
        max_entries: int,
        timeout: float | None,
        ack: float,
        max_deliveries: int = 0,
        request_id: str = "",
        settle: Sequence[int] = (),
    ) -> list[Delivery]:
        """Take up to max_entries matches (waiting as `match` does) with an acknowledgement
        deadline of `ack` seconds: each is delivered, not removed, invisible to every other read
        and take until `ack`, `nack` or the deadline (then visible again in its place in arrival
        order; an entry whose count has reached `max_deliveries`, 0: the space's setting, goes to
        the dead-letter space instead). A request id seen before answers the first call's
        deliveries that are still pending, and takes nothing. `settle`: receipts acknowledged
        first, as `ack` does, all or none (DeliveryExpiredError naming the one not pending, and
        nothing taken), recorded with the deliveries, or before the take waits."""

    async def ack(self, space: str, receipt: int, *, request_id: str = "") -> None:
        """Remove a delivered entry for good. DeliveryExpiredError unless `receipt` is pending."""

    async def ack_many(
        self, space: str, receipts: Sequence[int], *, request_id: str = ""
    ) -> list[DeliveryExpiredError | None]:
        """Acknowledge each of several deliveries in one change: per receipt, None or the
        DeliveryExpiredError that left it alone (the others are acknowledged all the same)."""

    async def nack(self, space: str, receipt: int, delay: float | None, *, request_id: str = "") -> Returned:
        """End a delivery unacknowledged: the entry is visible again after `delay` seconds (0: now;
        None: the space's backoff for its delivery count), or goes to the dead-letter space."""

    async def extend(self, space: str, receipt: int, seconds: float, *, request_id: str = "") -> float:
        """Move a pending delivery's deadline to `seconds` from now; the new deadline."""

    async def replay(self, space: str, request_id: str) -> list[StoredEntry]:
        """The entries a take with `request_id` took (in the window), or []; takes nothing. A
        partitioned space's fan-out take asks each partition this before it takes anything."""

    def contents(
        self, space: str, templates: Sequence[Template], max_entries: int, transaction: int = 0
    ) -> AsyncIterator[list[StoredEntry]]:
        """The visible matches, in chunks, in arrival order; 0 = no limit."""

    async def count(self, space: str, templates: Sequence[Template], transaction: int = 0) -> int: ...

    async def subscribe(
        self,
        space: str,
        templates: Sequence[Template],
        lease: float | None,
        *,
        resume: int | None = None,
        transaction: int = 0,
    ) -> Subscription:
        """Register for an event per matching write, or attach to registration `resume`."""

    async def changes(
        self,
        space: str,
        templates: Sequence[Template],
        kinds: frozenset[str],
        *,
        since: tuple[int, int] | None,
        durable: str = "",
    ) -> ChangeFeed:
        """Read the space's change log after `since`, (epoch, position), or from its head (None),
        the changes of `kinds` (engine/changes.py's CHANGE_KINDS) whose entry matches one of
        `templates` (none: every entry). With `durable`, the named durable subscription's
        position if it exists (`since` then ignored), else it is made at `since` and recorded.
        CompactedError for a position of another epoch or older than retention keeps,
        InvalidCursorError for one ahead of the head, SubscriptionBusyError while another stream
        reads `durable`, ChangesOffError when the space's log is off."""

    async def ack_changes(self, space: str, durable: str, position: int) -> None:
        """Move a durable subscription forward to `position` (an older one: nothing), durably.
        SubscriptionNotFoundError, InvalidCursorError beyond the head."""

    async def delete_subscription(self, space: str, durable: str) -> None:
        """Delete a durable subscription, durably; SubscriptionNotFoundError if it is unknown."""

    async def renew(
        self, space: str, renewals: Sequence[tuple[int, float | None]]
    ) -> list[LeaseGrant | SpaceError]:
        """Renew each lease, reporting each one's grant or error."""

    async def cancel(self, space: str, lease_ids: Sequence[int]) -> list[SpaceError | None]:
        """Cancel each lease, reporting each one's error (None when it was cancelled)."""

    async def begin(self, space: str, lease: float | None) -> LeaseGrant:
        """Open a transaction of the space under a lease; its id is the lease's."""

    async def commit(self, space: str, transaction: int) -> None:
        """Commit: its writes become visible and its takes final, durably all together. A retry
        of a commit that happened is OK; TransactionAbortedError if it aborted."""

    async def abort(self, space: str, transaction: int) -> None:
        """Abort: its writes vanish and what it took is back."""

    async def space_figures(self) -> dict[str, SpaceFigures]:
        """What each space holds, for the metrics (called on the event loop, at a scrape)."""

    @property
    def serving(self) -> bool:
        """Whether this server can serve calls now (a tier's server: its link to the database
        works). The health of outrig.v1.Space follows it."""

    async def locate(self, space: str) -> str | None:
        """Where a call on `space` is served: None here, else the address of the server to forward
        it to (the owner, or the server that will claim it). May claim the space for this one."""

    async def placements(self) -> list[Placement]:
        """Every space of the tier and its owner (a lone server: its spaces, all here)."""

    def tier_figures(self) -> TierFigures | None:
        """This server's ownership so far (None: a lone server, which owns every space)."""

    async def move(self, space: str, to: str) -> str:
        """Hand `space` (served here) to the server `to` names (id or address; "": the least loaded
        other one): the address it moved to."""

    async def drain(self) -> list[tuple[str, str]]:
        """Take no new spaces and hand every one served here to others: (space, address) each."""

    @property
    def peer_secret(self) -> str:
        """What this server presents on a call it forwards to another ("" : it forwards none)."""

    def accepts_peer(self, secret: str) -> bool:
        """Whether a call presenting `secret` was forwarded by a server of this tier, which checked
        its caller's credentials and grants already."""

    def observe_commits(self, observe: Callable[[float, int], None]) -> None:
        """Have `observe(seconds, records)` called after each group commit of the backend's own
        store (a backend whose durability is another server's calls it never)."""

    # ------------------------------------------------------------------ inspection (admin)

    async def describe(self, space: str) -> SpaceDescription:
        """What the space holds: its types, indexes, parked waiters, registrations, transactions,
        the age of its oldest entry and its settings (engine/inspection.py)."""

    async def browse(
        self, space: str, templates: Sequence[Template], after: int, max_entries: int
    ) -> tuple[list[StoredEntry], int]:
        """A page of at most `max_entries` entries matching one of `templates` (none: any), in
        arrival order after the cursor `after` (0: from the start), without taking them; and the
        next page's cursor (0: none)."""

    async def purge(
        self, space: str, templates: Sequence[Template], *, dry_run: bool, max_entries: int
    ) -> int:
        """Remove the entries matching one of `templates` (at most `max_entries`; 0: all), a batch
        at a time, letting other calls run between batches: how many were removed (`dry_run`:
        how many would be)."""

    async def cancel_registration(self, space: str, registration_id: int) -> None:
        """End a notify registration; LeaseNotFoundError if the space has no such registration."""
