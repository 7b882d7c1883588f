"""Everything a space client does that is not I/O, shared by `Space` and `AsyncSpace`.

`BaseSpace` builds every request message, the functions below decode every reply, and
`rpc_errors` is the one place where gRPC errors become `OutrigError` subclasses. The sync and
asyncio clients only add the calls themselves, so each of their methods is: build, call, decode.
How a call is retried (`outrig._retry`) is decided here too; the clients only sleep.
"""

from __future__ import annotations

import copy
import enum
import functools
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Final, Generic, Self, TypeAlias, TypeVar

import grpc
from google.protobuf.message import Message

from outrig._codec import (
    AnyEntry,
    decode_entry,
    encode_entry_into,
    encode_template_into,
    encode_value,
    iter_templates,
)
from outrig._delivery import Settle, check_ack, fill_ack, fill_settle, fill_visibility, settle_list
from outrig._entry import Entry
from outrig._exceptions import (
    InternalError,
    NotOwnerError,
    OutrigError,
    PermissionDeniedError,
    UnauthenticatedError,
    error_from_code,
    error_from_rpc,
)
from outrig._matchers import OrderBy, fill_order
from outrig._mux_wire import OP_FIELDS, closed
from outrig._protocol import DIRECT_KEY, METHODS
from outrig._retry import DEFAULT_RETRY_DEADLINE, Attempts, RetryCounter, RetryPolicy, new_request_id
from outrig._routing import request_partition
from outrig.v1 import space_pb2 as pb
from outrig.v1.space_pb2_grpc import SpaceStub

__all__ = [
    "ANY",
    "DEFAULT_MAX_MESSAGE_BYTES",
    "DEFAULT_RETRY_DEADLINE",
    "FOREVER",
    "LOCATE_TIMEOUT",
    "RELOCATE_AFTER",
    "BaseLease",
    "BaseSpace",
    "Event",
    "LeaseArg",
    "LeaseResult",
    "LeaseTerm",
    "Location",
    "Placement",
    "Templates",
    "channel_options",
    "check_connect_args",
    "event_of",
    "first_entry",
    "lease_results",
    "location_of",
    "owner_of",
    "placements_of",
    "registration_of",
    "rpc_errors",
]

#: gRPC's own default (4 MiB) is too small for entries that carry arrays.
DEFAULT_MAX_MESSAGE_BYTES: Final = 64 * 1024 * 1024


class LeaseTerm(enum.Enum):
    """The two lease durations that are not a number of seconds: `FOREVER` and `ANY`."""

    FOREVER = "forever"
    ANY = "any"

    def __repr__(self) -> str:
        return f"outrig.{self.name}"


#: A lease that never expires (the server may still grant less).
FOREVER: Final = LeaseTerm.FOREVER
#: Let the space choose the lease duration (its configured default).
ANY: Final = LeaseTerm.ANY

#: A requested lease duration: seconds, `FOREVER` or `ANY`.
LeaseArg: TypeAlias = float | LeaseTerm
#: One template, or several of which any may match (JavaSpace05 multi-template).
Templates: TypeAlias = AnyEntry | Iterable[AnyEntry]


@dataclass(frozen=True, slots=True)
class Event:
    """One notification: a matching entry was written.

    Attributes:
        sequence: strictly increasing per registration, from 1; a gap means the server dropped
            events because this consumer was too slow.
        entry: the entry that was written.
    """

    sequence: int
    entry: AnyEntry


@dataclass(frozen=True, slots=True)
class Location:
    """Where a space is served (`Space.locate`).

    Attributes:
        address: the advertised ``"host:port"`` of the server that serves it: its owner, or, when
            ``here``, the server this connection reached. ``""`` when the server knows none.
        here: whether the server this connection reached serves the space itself (a lone server
            serves every space; in a tier, a call reaching another server is forwarded to it).
        routing_field: a partitioned space's routing field (docs/scaling.md); ``""``: the space
            is not partitioned.
        partitions: how many partitions it has (1: unpartitioned).
    """

    address: str
    here: bool
    routing_field: str = ""
    partitions: int = 1


@dataclass(frozen=True, slots=True)
class Placement:
    """One space of a server's tier and its owner (`Space.list_spaces`).

    Attributes:
        space: the space's name.
        owner: the owner's server id (``""``: no owner, or a lone server).
        address: the owner's advertised ``"host:port"`` (``""``: none known).
        epoch: the ownership's epoch, which grows each time the space changes owner.
        expires_in: seconds left on the owner's lease of the space; None when it has no owner or
            the ownership does not expire (a lone server).
        here: whether the owner is the server this connection reached.
        entries: the entries the space holds, as its owner counts them; None when its owner
            (another server of the tier) could not be asked.
        bytes: their encoded bytes, likewise.
    """

    space: str
    owner: str
    address: str
    epoch: int
    expires_in: float | None
    here: bool
    entries: int | None = None
    bytes: int | None = None


class BaseLease:
    """The state of a granted lease, shared by `Lease` and `AsyncLease` (which add the I/O)."""

    __slots__ = ("_duration", "_expires_at", "_id", "_space_name")

    def __init__(self, space_name: str, message: pb.Lease) -> None:
        self._space_name = space_name
        self._id: int = message.id
        # _update, inline: a lease is made for every write, renewed far more seldom.
        self._expires_at = message.expires_at or None  # 0 on the wire means never
        self._duration = message.granted_seconds if message.HasField("granted_seconds") else None

    @property
    def id(self) -> int:
        """The lease's id, unique within its space."""
        return self._id

    @property
    def expires_at(self) -> float | None:
        """When the lease ends, in seconds since the Unix epoch (server clock); None if never."""
        return self._expires_at

    @property
    def duration(self) -> float | None:
        """The duration the space granted at the last write or renewal, in seconds; None if forever.

        Unlike `expires_at` it does not depend on the server's clock agreeing with this one.
        """
        return self._duration

    def _update(self, message: pb.Lease) -> None:
        self._expires_at = message.expires_at or None  # 0 on the wire means never
        self._duration = message.granted_seconds if message.HasField("granted_seconds") else None

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(id={self._id}, space={self._space_name!r}, "
            f"expires_at={self._expires_at!r})"
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, BaseLease):
            return NotImplemented
        return (self._space_name, self._id) == (other._space_name, other._id)

    def __hash__(self) -> int:
        return hash((self._space_name, self._id))


L = TypeVar("L", bound=BaseLease)
M = TypeVar("M", bound=Message)


@dataclass(frozen=True, slots=True)
class LeaseResult(Generic[L]):
    """The outcome for one lease of `renew_many` or `cancel_many`.

    Attributes:
        lease: the lease, as passed in; after a successful renewal its `expires_at` is updated.
        error: None on success, else the error for this lease alone (such as `NotFoundError`
            for an unknown or expired lease); it is returned, not raised.
    """

    lease: L
    error: OutrigError | None = None

    @property
    def ok(self) -> bool:
        """Whether this lease was renewed or cancelled."""
        return self.error is None


class _RpcErrors:
    """The gRPC boundary: ``with rpc_errors: reply = stub.Call(request)`` (or ``await ...``).

    A context manager rather than a wrapper function so that the sync and asyncio clients share
    it: the exception surfaces in the ``with`` block either way.
    """

    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None
    ) -> None:
        if isinstance(err, grpc.RpcError):
            raise error_from_rpc(err) from err


#: The one place where gRPC errors become `OutrigError` subclasses.
rpc_errors: Final = _RpcErrors()


#: gRPC waits 1 s, then up to 120 s, between attempts to reconnect a channel whose server went
#: away; a retried call would find the channel still waiting long after a restart.
_RECONNECT_OPTIONS: Final = (
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
)


def channel_options(
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES, options: Iterable[tuple[str, Any]] = ()
) -> list[tuple[str, Any]]:
    """The gRPC channel options `outrig.connect` gives its channel, for a channel you make yourself.

    ``grpc.insecure_channel(target, options=outrig.channel_options())`` (or ``grpc.aio``'s, or a
    secure channel with ``TLS(...).options()`` among ``options``) behaves as `connect`'s channel
    does: messages up to ``max_message_bytes`` (64 MiB) each way, and reconnection every 0.1 s to
    1 s after the server went away, rather than gRPC's 1 s to 120 s, so that a call the SDK
    retries after a restart finds the channel connected. ``options`` come last and win over these.
    Pass the channel to `outrig.Space` (or `outrig.aio.AsyncSpace`); owning the channel lets a
    program use gRPC's own calls on it, such as ``grpc.channel_ready_future``.
    """
    if isinstance(max_message_bytes, bool) or not isinstance(max_message_bytes, int):
        raise TypeError(f"max_message_bytes must be an int, got {type(max_message_bytes).__name__}")
    options = list(options)
    named = {name for name, _ in options}
    defaults = [
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
        *_RECONNECT_OPTIONS,
    ]
    return [(name, value) for name, value in defaults if name not in named] + options


def check_connect_args(space: object, retry_deadline: object) -> None:
    """Check `connect`'s arguments before it makes a channel, which a failed check would leak."""
    _check_name(space)
    RetryPolicy.with_deadline(retry_deadline)


def _check_seconds(value: object, what: str) -> float:
    # Only the type: the server validates ranges, and a second copy of its rules would drift.
    if type(value) is float:  # the usual case, without the two isinstance checks
        return value
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{what} must be a number of seconds, got {type(value).__name__}")
    return float(value)


def _check_count(value: object, what: str) -> int:
    if type(value) is int and value >= 0:  # the usual case (bool is not int's type, only its subclass)
        return value
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} must be an int, got {type(value).__name__}")
    if value < 0:  # the wire type is unsigned, so this could not even be sent
        raise ValueError(f"{what} must be >= 0, got {value}")
    return value


def _fill_lease(target: pb.LeaseDuration, lease: LeaseArg, what: str = "lease") -> None:
    """Set a LeaseDuration field; for `ANY` leave it untouched, so that it stays absent."""
    if lease is ANY:
        return
    if lease is FOREVER:
        target.forever = True
    else:
        target.seconds = _check_seconds(lease, what)


class _StubWithMetadata:
    """A SpaceStub whose every call sends `metadata` (the bearer token). Binding it to each method
    costs a dict lookup per call; gRPC's call credentials run a Python plugin on another thread per
    call, which measured 27% of a small read's throughput on a 2-core machine (bench/security.py)."""

    def __init__(self, stub: SpaceStub, metadata: Sequence[tuple[str, str]]) -> None:
        bound = tuple(metadata)
        for name in METHODS:
            setattr(self, name, functools.partial(getattr(stub, name), metadata=bound))


#: Seconds a space's calls go to the address given to `connect` after its owner could not be
#: reached, before the SDK asks that server again where the space lives (doubling, up to
#: `RELOCATE_MAX`, while the same owner keeps failing).
RELOCATE_AFTER: Final = 1.0
RELOCATE_MAX: Final = 30.0
#: The longest the SDK waits for a Locate before it sends the call to the given address anyway.
LOCATE_TIMEOUT: Final = 5.0

#: The refusals a call sent straight to an owner is sent again for, to the given address: the
#: owner checked the caller's credentials before doing anything, and the given server, which
#: forwards the call, may accept what the owner does not (its own policy, or issuers).
_REFUSALS: Final = (PermissionDeniedError, UnauthenticatedError)


class _Link:
    """One channel of a connection: its stub, its Mux stream (if any) and the ops over them."""

    __slots__ = ("address", "channel", "mux", "ops", "stub")

    def __init__(self, address: str, channel: Any, metadata: Sequence[tuple[str, str]], new_mux: Any) -> None:
        self.address = address
        self.channel = channel
        stub = SpaceStub(channel)
        self.stub: Any = _StubWithMetadata(stub, metadata) if metadata else stub
        self.mux: Any = new_mux(channel, metadata) if new_mux is not None else None
        # The unary operations: over the channel's Mux stream, or as unary calls.
        self.ops: dict[str, Any] = {
            name: getattr(self.stub, name) if self.mux is None else functools.partial(self.mux.call, name)
            for name in OP_FIELDS
        }


class _Route:
    """Where one space's calls go: `address` (None: the home link, the address given)."""

    __slots__ = ("address", "due", "failed", "locating", "strikes")

    def __init__(self) -> None:
        self.address: str | None = None
        self.due: float | None = 0.0  # when to ask Locate next (monotonic); None: settled
        self.locating = False  # a thread or task is asking
        self.failed: str | None = None  # the owner that last failed, and how many times in a row
        self.strikes = 0


class _Connection:
    """What the spaces on one connection share: whether it has been closed, its channels, and
    where each space's calls go (direct routing).

    The home link is the channel the space was made with. With direct routing on (`route_via`,
    which `connect` calls unless ``direct=False``), each space name has a `_Route`: the first call
    of a space asks the home server where it lives (Locate, `locate_due`/`located`); a space served
    elsewhere gets its calls sent over a link of its owner's address, opened by `dial` with the
    connection's credentials and options. A call that fails there moves the route (`reroute`):
    NOT_OWNER naming an owner moves it to that owner; any other UNAVAILABLE moves it back home
    (which forwards) and asks again after `RELOCATE_AFTER`; a refusal (`refused`) moves it home for
    good. Routes and links change under a lock: the sync client's calls come from any thread.
    """

    __slots__ = (
        "_dial",
        "_last_key",
        "_links",
        "_lock",
        "_metadata",
        "_new_mux",
        "_partitioning",
        "_routes",
        "closed",
        "everything_home",
        "home",
    )

    def __init__(self, home: _Link, metadata: Sequence[tuple[str, str]], new_mux: Any) -> None:
        self.closed = False
        self.home = home
        self._metadata = tuple(metadata)
        self._new_mux = new_mux
        self._dial: Callable[[str], Any] | None = None
        self._links: dict[str, _Link] = {}
        self._routes: dict[str, _Route] = {}
        # A partitioned space's routing field and partitions (its Locate said): a call of one
        # partition is routed by the key "space~k" (`route_key`), located on its own.
        self._partitioning: dict[str, tuple[str, int]] = {}
        self._last_key: tuple[object, str] = (None, "")
        self._lock = threading.Lock()
        # No route has left the home link and no space is partitioned (so far: never set back),
        # the case of a lone server: `op` then skips routing a call a second time.
        self.everything_home = True

    def route_via(self, dial: Callable[[str], Any]) -> None:
        """Turn direct routing on: `dial` opens a channel to an owner's address."""
        self._dial = dial

    def op(self, name: str, request: Message) -> Any:
        """Run the op `name` on the link of the request's space, or of its partition (ListSpaces:
        the home link)."""
        if self.everything_home:
            return self.home.ops[name](request)
        space = getattr(request, "space", None)
        return self.link(None if space is None else self.route_key(space, request)).ops[name](request)

    def route_key(self, space: str, request: Message) -> str:
        """What a call of `space` is routed by: the space, or "space~k" for a call that concerns
        partition k of a partitioned space alone (outrig._routing)."""
        found = self._partitioning.get(space)
        if found is None:
            return space
        memo = self._last_key  # a call asks twice (its route, then its link): once is enough
        if memo[0] is request:
            return memo[1]
        k = request_partition(request, *found)
        key = space if k is None else f"{space}~{k}"
        self._last_key = (request, key)
        return key

    def settled_home(self, space: str) -> bool:
        """Whether `space`'s calls go over the home link with nothing to work out first: no
        Locate due, no partition to route by, no owner elsewhere (what `route_key`, `locate_due`
        and `route_of` would each find, for a lone server's space once its first call asked)."""
        if self._dial is None:
            return True  # never routed: no route and no partitioning is ever recorded
        if not self.everything_home:
            return False
        route = self._routes.get(space)
        return route is not None and route.due is None

    def route_of(self, space: str) -> str | None:
        """The address the space's calls go to now; None: the home link."""
        route = self._routes.get(space)
        return None if route is None else route.address

    def address_of(self, space: str) -> str:
        address = self.route_of(space)
        return self.home.address if address is None else address

    def link(self, space: str | None) -> _Link:
        """The link the space's calls go over now, opened on first use."""
        address = None if space is None or self._dial is None else self.route_of(space)
        if address is None:
            return self.home
        link = self._links.get(address)
        if link is not None:
            return link
        with self._lock:
            if self.closed:
                raise closed()
            link = self._links.get(address)
            if link is None:
                assert self._dial is not None
                # Calls routed to an owner say so: a server that no longer serves the space
                # redirects them (NOT_OWNER naming the owner) rather than forwarding them.
                link = _Link(
                    address, self._dial(address), (*self._metadata, (DIRECT_KEY, "1")), self._new_mux
                )
                self._links[address] = link
            return link

    def locate_due(self, space: str) -> bool:
        """Whether the caller should ask where `space` lives now (then it must call `located`)."""
        if self._dial is None:
            return False
        route = self._routes.get(space)
        if route is not None and (route.due is None or route.locating):
            return False  # the usual case, without the lock
        with self._lock:
            route = self._routes.setdefault(space, _Route())
            if route.due is None or route.locating or time.monotonic() < route.due:
                return False
            route.locating = True
            return True

    def located(
        self, space: str, owner: str | None, *, again: bool, partitioning: tuple[str, int] | None = None
    ) -> None:
        """What Locate said: the owner's address if not the home server (None: home, or no
        answer); with `again`, no answer came, so ask again after a while. `partitioning`: the
        space is partitioned (its routing field and partitions)."""
        with self._lock:
            if partitioning is not None and "~" not in space:  # a space's, not a partition's
                self._partitioning[space] = partitioning
                self.everything_home = False
            route = self._routes[space]
            route.locating = False
            route.address = None if owner is None or owner == self.home.address else owner
            if route.address is not None:
                self.everything_home = False
            route.due = time.monotonic() + self._pause(route) if again else None

    def reroute(self, space: str, used: str | None, err: OutrigError) -> None:
        """A call of `space` sent to `used` (None: home) failed with UNAVAILABLE `err`: go to the
        owner it names, or back home, before the retry. A route another call moved meanwhile is
        left alone."""
        if self._dial is None:
            return
        with self._lock:
            route = self._routes.get(space)
            if route is None or route.address != used:
                return
            owner = err.owner if isinstance(err, NotOwnerError) else ""
            here = self.home.address if used is None else used
            if owner and owner != here:
                route.address = None if owner == self.home.address else owner
                route.due = None
                if route.address is not None:
                    self.everything_home = False
            elif used is not None:
                route.strikes = route.strikes + 1 if route.failed == used else 1
                route.failed = used
                route.address = None
                route.due = time.monotonic() + self._pause(route)

    def refused(self, space: str, used: str | None, err: OutrigError) -> bool:
        """A call sent to the owner `used` was refused (`_REFUSALS`): whether to send it again,
        home, where its space's calls go from now on. A refusal at home stands."""
        if used is None or not isinstance(err, _REFUSALS):
            return False
        with self._lock:
            route = self._routes.get(space)
            if route is not None and route.address == used:
                route.address = None
                route.due = None
        return True

    @staticmethod
    def _pause(route: _Route) -> float:
        return min(RELOCATE_MAX, RELOCATE_AFTER * 2.0 ** max(0, route.strikes - 1))

    def close(self) -> list[_Link]:
        """Mark the connection closed; every link it has, the home link first, to close."""
        with self._lock:
            self.closed = True
            links, self._links = list(self._links.values()), {}
        return [self.home, *links]


class BaseSpace:
    """The request-building half of a space client; see `Space` and `AsyncSpace`."""

    def __init__(
        self,
        channel: Any,
        name: str = "default",
        *,
        owns_channel: bool = False,
        retry_deadline: float = DEFAULT_RETRY_DEADLINE,
        metadata: Sequence[tuple[str, str]] = (),
        mux: bool = True,
    ) -> None:
        new_mux = self._new_mux if mux else None
        home = _Link("", channel, metadata, new_mux)
        # Shared by every space made from this one (`with_space`, transactions): once the
        # connection is closed, their calls fail alike, over the Mux stream or unary.
        self._connection = _Connection(home, metadata, new_mux)
        # The unary operations, by method name: the home link's, until `_route_directly`.
        self._ops: dict[str, Any] = home.ops
        self._name = _check_name(name)
        self._owns_channel = owns_channel
        self._retry_policy = RetryPolicy.with_deadline(retry_deadline)
        self._retry_counter = RetryCounter()
        self._transaction = 0  # the transaction a view made by `_under` acts under; 0: none

    def _check_open(self) -> None:
        """CallCancelledError if the connection has been closed (rather than gRPC's own
        ValueError or UsageError for a closed channel)."""
        if self._connection.closed:
            raise closed()

    @staticmethod
    def _new_mux(channel: Any, metadata: Sequence[tuple[str, str]]) -> Any:
        """A channel's Mux stream (`outrig._mux.Mux` or its asyncio twin)."""
        raise NotImplementedError

    def _route_directly(self, target: str, dial: Callable[[str], Any] | None) -> None:
        """Say that the home channel reaches `target`; with `dial` (which opens a channel to an
        address), send each space's calls to its owner (see `_Connection`)."""
        connection = self._connection
        connection.home.address = target
        if dial is not None:
            connection.route_via(dial)
            self._ops = {name: functools.partial(connection.op, name) for name in OP_FIELDS}

    @property
    def _stub(self) -> Any:
        """The stub of the link this space's calls go over now (for its streams)."""
        return self._connection.link(self._name).stub

    @property
    def target(self) -> str | None:
        """The address this space's calls go to now: the address given to `connect`, or, once the
        SDK found the space is served by another server of a tier, its owner's (None for a space
        on a channel of your own making, which is never routed)."""
        return self._connection.address_of(self._name) or None

    @property
    def name(self) -> str:
        """The name of the space this object talks to."""
        return self._name

    @property
    def retries(self) -> int:
        """How many times calls on this connection were retried after UNAVAILABLE.

        One per retried attempt (a call that succeeded at its third attempt counts 2; a notify
        stream that reattached at once counts 1), summed over every space made from this one with
        ``with_space``; 0 when the server never went away. A load test can read it to tell how
        much of its traffic a server restart cost.
        """
        return self._retry_counter.value

    def _on_same_connection(self, name: str) -> Self:
        """The space ``name`` on this space's channel, retry policy and retry counter (not owning them)."""
        space = copy.copy(self)
        space._name = _check_name(name)
        space._owns_channel = False
        return space

    def _under(self, transaction: int) -> Self:
        """A view of this space whose calls act under `transaction` (sharing everything else)."""
        view = copy.copy(self)
        view._owns_channel = False
        view._transaction = transaction
        return view

    def _begin_request(self, lease: LeaseArg, route: object = None) -> pb.BeginRequest:
        request = pb.BeginRequest(space=self._name)
        _fill_lease(request.lease, lease)
        if route is not None:
            request.route.CopyFrom(encode_value(route, "route"))
        return request

    def _end_request(self, transaction: int) -> pb.EndRequest:
        return pb.EndRequest(space=self._name, transaction=transaction)

    def _may_reattach(self) -> bool:
        """Whether a broken notify stream may be reattached; if so, that counts as a retry."""
        if self._retry_policy.deadline <= 0:
            return False
        self._retry_counter.add()
        return True

    def _attempts(self, request: M, started: float | None = None) -> Attempts[M]:
        """The retry schedule of one logical call that sends ``request`` (begun at `started`, on
        time.monotonic's clock; None: now)."""
        return Attempts(request, self._retry_policy, self._retry_counter, started=started)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self._name!r})"

    def _request_id(self) -> str:
        """A fresh idempotency key for a call that changes the space, if it may be retried (with
        retries off nobody could repeat it, and the server would keep its result for nothing)."""
        return new_request_id() if self._retry_policy.deadline > 0 else ""

    def _write_request(
        self, entry: AnyEntry, lease: LeaseArg, delay: float | None = None, visible_at: float | None = None
    ) -> pb.WriteRequest:
        request = pb.WriteRequest(
            space=self._name, request_id=self._request_id(), transaction=self._transaction
        )
        encode_entry_into(request.entry, entry)
        _fill_lease(request.lease, lease)
        if delay is not None or visible_at is not None:
            fill_visibility(request, delay, visible_at)
        return request

    def _write_many_request(
        self,
        entries: Iterable[AnyEntry],
        lease: LeaseArg,
        delay: float | None = None,
        visible_at: float | None = None,
    ) -> pb.WriteManyRequest:
        request = pb.WriteManyRequest(
            space=self._name, request_id=self._request_id(), transaction=self._transaction
        )
        for entry in entries:
            encode_entry_into(request.entries.add(), entry)
        _fill_lease(request.lease, lease)
        fill_visibility(request, delay, visible_at)
        return request

    def _match_request(
        self,
        templates: Templates,
        timeout: float | None,
        *,
        if_exists: bool = False,
        max_entries: int = 0,
        order_by: OrderBy = None,
        request_id: str = "",
    ) -> pb.MatchRequest:
        request = pb.MatchRequest(
            space=self._name,
            timeout=None if timeout is None else _check_seconds(timeout, "timeout"),
            if_exists=if_exists,
            max_entries=_check_count(max_entries, "max_entries"),
            transaction=self._transaction,
            request_id=request_id,
        )
        _fill_templates(request.templates, templates)
        if order_by is not None:  # reading request.order_by makes a wrapper object: not for nothing
            fill_order(request.order_by, order_by)
        return request

    def _take_request(
        self,
        templates: Templates,
        timeout: float | None,
        *,
        if_exists: bool = False,
        max_entries: int = 0,
        order_by: OrderBy = None,
        ack: float | None = None,
        max_deliveries: int = 0,
        settle: Settle = None,
    ) -> pb.MatchRequest:
        # A take changes the space, so a retry must not take a second entry: the id lets the
        # server answer it with the entry the first attempt took.
        if ack is None and settle is None and type(max_deliveries) is int and not max_deliveries:
            # A plain take, which check_ack and settle_list would pass as it is.
            return self._match_request(
                templates,
                timeout,
                if_exists=if_exists,
                max_entries=max_entries,
                order_by=order_by,
                request_id=self._request_id(),
            )
        checked = check_ack(ack, max_deliveries)
        settled = settle_list(self._name, settle)
        request = self._match_request(
            templates, timeout, if_exists=if_exists, max_entries=max_entries, order_by=order_by
        )
        request.request_id = self._request_id()
        if checked is not None:  # a take with an acknowledgement deadline (outrig._delivery)
            fill_ack(request, checked, max_deliveries)
            fill_settle(request, settled)
        elif settled:
            raise TypeError("settle needs ack: a take with ack= settles earlier deliveries")
        return request

    def _contents_request(
        self, templates: Templates, max_entries: int, order_by: OrderBy = None
    ) -> pb.ContentsRequest:
        request = pb.ContentsRequest(
            space=self._name,
            max_entries=_check_count(max_entries, "max_entries"),
            transaction=self._transaction,
        )
        _fill_templates(request.templates, templates)
        fill_order(request.order_by, order_by)
        return request

    def _count_request(self, templates: Templates) -> pb.CountRequest:
        request = pb.CountRequest(space=self._name, transaction=self._transaction)
        _fill_templates(request.templates, templates)
        return request

    def _notify_request(self, templates: Templates, lease: LeaseArg) -> pb.NotifyRequest:
        request = pb.NotifyRequest(space=self._name, transaction=self._transaction)
        _fill_templates(request.templates, templates)
        _fill_lease(request.lease, lease)
        return request

    def _resume_request(self, registration: BaseLease) -> pb.NotifyRequest:
        return pb.NotifyRequest(space=self._name, resume=self._own_lease_id(registration))

    def _renew_request(self, leases: Sequence[BaseLease], duration: LeaseArg) -> pb.RenewLeasesRequest:
        request = pb.RenewLeasesRequest(space=self._name)
        for lease in leases:
            renewal = request.renewals.add(id=self._own_lease_id(lease))
            _fill_lease(renewal.duration, duration, "duration")
        return request

    def _cancel_request(self, leases: Sequence[BaseLease]) -> pb.CancelLeasesRequest:
        return pb.CancelLeasesRequest(space=self._name, ids=[self._own_lease_id(lease) for lease in leases])

    def _locate_request(self, key: str = "") -> pb.LocateRequest:
        """Where this space (or, for a route key "space~k", its partition k) is served."""
        request = pb.LocateRequest(space=self._name)
        _, sep, k = key.rpartition("~")
        if sep and k.isdigit():
            request.partition = int(k)
        return request

    def _browse_request(self, templates: Templates | None, after: int, max_entries: int) -> pb.BrowseRequest:
        request = pb.BrowseRequest(
            space=self._name,
            after=_check_count(after, "after"),
            max_entries=_check_count(max_entries, "max_entries"),
        )
        if templates is not None:
            _fill_templates(request.templates, templates)
        return request

    def _purge_request(self, templates: Templates, dry_run: bool, max_entries: int) -> pb.PurgeRequest:
        request = pb.PurgeRequest(
            space=self._name, dry_run=bool(dry_run), max_entries=_check_count(max_entries, "max_entries")
        )
        _fill_templates(request.templates, templates)
        return request

    def _lease_id_request(self, lease_id: int) -> pb.LeaseIdRequest:
        return pb.LeaseIdRequest(space=self._name, id=_check_count(lease_id, "id"))

    def _own_lease_id(self, lease: BaseLease) -> int:
        # Lease ids are only unique within a space, so a lease must go back to its own space.
        if not isinstance(lease, BaseLease):
            raise TypeError(f"expected a lease, got {type(lease).__name__}")
        if lease._space_name != self._name:
            raise ValueError(f"{lease!r} belongs to space {lease._space_name!r}, not {self._name!r}")
        return lease.id


def _check_name(name: object) -> str:
    if not isinstance(name, str):
        raise TypeError(f"the space name must be a str, got {type(name).__name__}")
    return name


def _fill_templates(target: Any, templates: Templates) -> None:
    if isinstance(templates, Entry):  # one template, the usual case: no tuple around it
        encode_template_into(target.add(), templates)
        return
    for template in iter_templates(templates):
        encode_template_into(target.add(), template)


# ---------------------------------------------------------------- replies


def first_entry(reply: pb.MatchReply) -> AnyEntry | None:
    """The entry of a read/take reply, or None when nothing matched in time."""
    entries = reply.entries  # read once: each read of a repeated field makes a wrapper object
    return decode_entry(entries[0]) if entries else None


def registration_of(reply: pb.NotifyReply | None) -> pb.Lease:
    """The registration lease that must open a notify stream (``reply`` is None if it ended)."""
    if reply is None or not reply.HasField("registration"):
        raise InternalError("the notify stream did not start with its registration lease")
    return reply.registration


def event_of(reply: pb.NotifyReply) -> Event:
    """The event carried by a notify message after the first."""
    return Event(reply.sequence, decode_entry(reply.entry))


def location_of(reply: pb.LocateReply) -> Location:
    return Location(reply.address, reply.here, reply.routing_field, max(1, reply.partitions))


def partitioning_of(reply: pb.LocateReply) -> tuple[str, int] | None:
    """A partitioned space's routing field and partitions, from its Locate reply."""
    return (reply.routing_field, reply.partitions) if reply.partitions > 1 else None


def owner_of(reply: pb.LocateReply) -> str | None:
    """Where to send a space's calls, from a Locate reply: its owner's address, or None when the
    server asked serves it (or knows no owner). A server that shares the address it was asked at
    (a worker) is sent them at its own address, which a later connection cannot miss."""
    if not reply.address or (reply.here and not reply.shared_address):
        return None
    return reply.address


def placements_of(reply: pb.ListSpacesReply) -> list[Placement]:
    return [
        Placement(
            item.space,
            item.owner,
            item.address,
            item.epoch,
            item.expires_in if item.HasField("expires_in") else None,
            item.here,
            item.entries if item.HasField("entries") else None,
            item.bytes if item.HasField("bytes") else None,
        )
        for item in reply.spaces
    ]


def lease_results(
    leases: Sequence[L], results: Sequence[pb.LeaseResult], *, renewed: bool
) -> list[LeaseResult[L]]:
    """Pair a batch reply's results with the leases asked about; update renewed leases in place."""
    if len(results) != len(leases) or any(r.id != lease.id for r, lease in zip(results, leases, strict=True)):
        raise InternalError(f"the server answered for {len(results)} leases, in the wrong order or number")
    paired: list[LeaseResult[L]] = []
    for lease, result in zip(leases, results, strict=True):
        if result.error_code:
            error = error_from_code(result.error_code, result.error_message, result.error_reason)
            paired.append(LeaseResult(lease, error))
            continue
        if renewed:
            lease._update(result.lease)
        paired.append(LeaseResult(lease))
    return paired
