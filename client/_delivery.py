"""Takes with an acknowledgement deadline (docs/work-queues.md): `Delivery`, what a take with
``ack=`` returns, and the context manager `Space.taking` returns.

A delivery's entry stays in the space, invisible to every other read and take, until the delivery
is acknowledged (`Delivery.ack`: removed for good), returned (`Delivery.nack`: visible again, now
or later) or its deadline passes (visible again, in its place in arrival order). Its receipt
settles this delivery and no other: once the delivery has ended, an ack, nack or extend with it
raises `DeliveryExpiredError` and changes nothing.

`BaseDelivery` holds a delivery's state and builds its requests, shared by `Delivery` and
`outrig.aio.AsyncDelivery`, which only add the calls. Ack, Nack and Extend each carry a fresh
request id, so a retry after a broken connection gets the first answer (never
`DeliveryExpiredError` for its own ack). In a partitioned space a receipt is an id of its
partition, so these calls go to that partition's server (outrig._routing).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Generic, TypeVar

from outrig._codec import AnyEntry, decode_entry
from outrig._exceptions import DeliveryExpiredError, InternalError, OutrigError, error_from_code
from outrig.v1 import space_pb2 as pb

if TYPE_CHECKING:
    from outrig._sync import Space

__all__ = [
    "BaseDeliveries",
    "BaseDelivery",
    "Deliveries",
    "Delivery",
    "Returned",
    "Settle",
    "Taking",
    "ack_many_request",
    "acked_many",
    "check_ack",
    "deliveries_of",
    "fill_ack",
    "fill_settle",
    "fill_visibility",
    "mark_settled",
    "returned_of",
    "settle_list",
    "settlement",
]


@dataclass(frozen=True, slots=True)
class Returned:
    """What `Delivery.nack` did with the entry.

    Attributes:
        visible_at: when it is visible again, in seconds since the Unix epoch (server clock);
            None: at once (or it went to a dead-letter space).
        dead_letter: the dead-letter space it went to instead, its ``max_deliveries`` reached
            (``""``: it went back to its own space).
    """

    visible_at: float | None
    dead_letter: str = ""


def _seconds(value: object, what: str) -> float:
    # Only the type: the server checks the range (0 < ack <= its max_ack, say) and names the limit.
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{what} must be a number of seconds, got {type(value).__name__}")
    return float(value)


def check_ack(ack: object, max_deliveries: object) -> float | None:
    """A take's ``ack`` (None: a plain take), with ``max_deliveries`` only beside an ``ack``."""
    if isinstance(max_deliveries, bool) or not isinstance(max_deliveries, int):
        raise TypeError(f"max_deliveries must be an int, got {type(max_deliveries).__name__}")
    if max_deliveries < 0:  # the wire type is unsigned, so this could not even be sent
        raise ValueError(f"max_deliveries must be >= 0, got {max_deliveries}")
    if ack is None:
        if max_deliveries:
            raise TypeError("max_deliveries needs ack: it limits the deliveries of a take with ack=")
        return None
    return _seconds(ack, "ack")


def fill_ack(request: pb.MatchRequest, ack: float, max_deliveries: int) -> pb.MatchRequest:
    """Make a take request a take with an acknowledgement deadline of `ack` seconds."""
    request.ack = ack
    request.max_deliveries = max_deliveries
    return request


def fill_visibility(
    request: pb.WriteRequest | pb.WriteManyRequest, delay: float | None, visible_at: float | None
) -> None:
    """A write's ``delay`` (seconds from now) or ``visible_at`` (epoch seconds); neither: visible."""
    if delay is not None and visible_at is not None:
        raise ValueError("give a write's delay or its visible_at, not both")
    if delay is not None:
        request.delay = _seconds(delay, "delay")
    elif visible_at is not None:
        request.visible_at = _seconds(visible_at, "visible_at")


class BaseDelivery:
    """The state of one delivery, shared by `Delivery` and `AsyncDelivery` (which add the I/O)."""

    __slots__ = (
        "_dead_letter_reason",
        "_deadline",
        "_deliveries",
        "_entry",
        "_receipt",
        "_settled",
        "_space_name",
    )

    def __init__(self, space_name: str, entry: AnyEntry, message: pb.Delivery) -> None:
        self._space_name = space_name
        self._entry = entry
        self._receipt: int = message.receipt
        self._deliveries: int = message.deliveries
        self._deadline: float = message.deadline
        self._dead_letter_reason: str = message.dead_letter_reason
        self._settled = False

    @property
    def entry(self) -> AnyEntry:
        """The entry delivered (decoded as a take's entry is)."""
        return self._entry

    @property
    def receipt(self) -> int:
        """The receipt that settles this delivery, and only this one (an id of the space)."""
        return self._receipt

    @property
    def deliveries(self) -> int:
        """How many times the entry has been delivered, this delivery included (durable)."""
        return self._deliveries

    @property
    def deadline(self) -> float:
        """When the delivery ends unless acknowledged or extended, in seconds since the Unix
        epoch (server clock); `extend` moves it."""
        return self._deadline

    @property
    def dead_letter_reason(self) -> str:
        """For an entry of a dead-letter space, why it is there (such as ``"max_deliveries=5
        reached in space 'jobs'"``); ``""`` otherwise."""
        return self._dead_letter_reason

    @property
    def settled(self) -> bool:
        """Whether this client acknowledged or returned the delivery (`ack`, `nack`)."""
        return self._settled

    def _ack_request(self, space: str, request_id: str) -> pb.AckRequest:
        return pb.AckRequest(space=self._own(space), receipt=self._receipt, request_id=request_id)

    def _nack_request(self, space: str, delay: float | None, request_id: str) -> pb.NackRequest:
        request = pb.NackRequest(space=self._own(space), receipt=self._receipt, request_id=request_id)
        if delay is not None:
            request.delay = _seconds(delay, "delay")
        return request

    def _extend_request(self, space: str, seconds: float, request_id: str) -> pb.ExtendRequest:
        return pb.ExtendRequest(
            space=self._own(space),
            receipt=self._receipt,
            seconds=_seconds(seconds, "seconds"),
            request_id=request_id,
        )

    def _own(self, space: str) -> str:
        # Receipts are ids of their space: one only means something to the space that gave it.
        if space != self._space_name:
            raise ValueError(f"{self!r} belongs to space {self._space_name!r}, not {space!r}")
        return space

    def _returned(self, reply: pb.NackReply) -> Returned:
        self._settled = True
        return returned_of(reply)

    def _extended(self, reply: pb.ExtendReply) -> float:
        self._deadline = reply.deadline
        return self._deadline

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(receipt={self._receipt}, space={self._space_name!r}, "
            f"deliveries={self._deliveries}, deadline={self._deadline!r})"
        )


#: What a take's ``settle=`` takes: one delivery, several, or None (none).
Settle = BaseDelivery | Sequence[BaseDelivery] | None


def settle_list(space_name: str, settle: object) -> list[BaseDelivery]:
    """A take's ``settle=`` as a list: deliveries of this space, none settled by this client."""
    if settle is None:
        return []
    given = [settle] if isinstance(settle, BaseDelivery) else settle
    if not isinstance(given, Sequence) or isinstance(given, str | bytes):
        raise TypeError(f"settle must be a Delivery or a list of them, got {type(settle).__name__}")
    found: list[BaseDelivery] = []
    for delivery in given:
        if not isinstance(delivery, BaseDelivery):
            raise TypeError(f"settle must hold deliveries, got {type(delivery).__name__}")
        delivery._own(space_name)
        if delivery.settled:
            raise ValueError(f"{delivery!r} is settled already (acknowledged or returned)")
        found.append(delivery)
    return found


def fill_settle(request: pb.MatchRequest, deliveries: Sequence[BaseDelivery]) -> None:
    """Have a take with ack acknowledge these deliveries before it takes."""
    request.settle.extend(delivery.receipt for delivery in deliveries)


def mark_settled(request: pb.MatchRequest, settle: Settle) -> None:
    """A take that settled deliveries answered (so it acknowledged them all)."""
    if not request.settle or settle is None:
        return
    for delivery in [settle] if isinstance(settle, BaseDelivery) else settle:
        delivery._settled = True


def ack_many_request(space_name: str, deliveries: Sequence[BaseDelivery], request_id: str) -> pb.AckRequest:
    """One Ack of a batch of deliveries of this space."""
    for delivery in deliveries:
        if not isinstance(delivery, BaseDelivery):
            raise TypeError(f"ack_many takes deliveries, got {type(delivery).__name__}")
        delivery._own(space_name)
    return pb.AckRequest(
        space=space_name, receipts=[delivery.receipt for delivery in deliveries], request_id=request_id
    )


def acked_many(deliveries: Sequence[BaseDelivery], reply: pb.AckReply) -> list[OutrigError | None]:
    """Per delivery, None (acknowledged: marked settled) or the error that left it alone."""
    if len(reply.results) != len(deliveries):
        raise InternalError(
            f"the server answered an ack of {len(deliveries)} deliveries with {len(reply.results)} results"
        )
    outcomes: list[OutrigError | None] = []
    for delivery, result in zip(deliveries, reply.results, strict=True):
        if result.error_code:
            outcomes.append(error_from_code(result.error_code, result.error_message, result.error_reason))
        else:
            delivery._settled = True
            outcomes.append(None)
    return outcomes


def returned_of(reply: pb.NackReply) -> Returned:
    return Returned(reply.visible_at or None, reply.dead_letter)


D = TypeVar("D", bound=BaseDelivery)


def deliveries_of(reply: pb.MatchReply, make: Callable[[AnyEntry, pb.Delivery], D]) -> list[D]:
    """The deliveries of a take-with-ack reply, each entry paired with its delivery."""
    entries: Sequence[pb.Entry] = reply.entries
    if len(entries) != len(reply.deliveries):
        raise InternalError(
            f"the server answered a take with ack with {len(entries)} entries and "
            f"{len(reply.deliveries)} deliveries"
        )
    return [
        make(decode_entry(entry), delivery) for entry, delivery in zip(entries, reply.deliveries, strict=True)
    ]


class Delivery(BaseDelivery):
    """One delivery of an entry, from a take with ``ack=`` (see `Space.take`).

    ``entry``, ``receipt``, ``deliveries`` (this one included), ``deadline`` (epoch seconds) and
    ``dead_letter_reason`` are read-only; `extend` moves ``deadline``. Settle it with `ack` (the
    entry is removed for good) or `nack` (it is visible again), before the deadline: after it, the
    entry is visible again anyway and each of these raises `DeliveryExpiredError`.
    """

    __slots__ = ("_space",)

    def __init__(self, space: Space, entry: AnyEntry, message: pb.Delivery) -> None:
        super().__init__(space.name, entry, message)
        self._space = space

    def ack(self) -> None:
        """Acknowledge the delivery: its entry is removed for good. `DeliveryExpiredError` if the
        delivery has ended (acknowledged or returned already, or past its deadline)."""
        space = self._space
        space._call(space._ops["Ack"], self._ack_request(space.name, space._request_id()))
        self._settled = True

    def nack(self, delay: float | None = None) -> Returned:
        """Return the entry to the space: visible again after ``delay`` seconds (0: now; None: the
        space's backoff, which doubles with each delivery of the entry, so a failing entry cannot
        spin). An entry that has reached its ``max_deliveries`` goes to the dead-letter space
        instead (`Returned.dead_letter` names it). `DeliveryExpiredError` as `ack`."""
        space = self._space
        reply: pb.NackReply = space._call(
            space._ops["Nack"], self._nack_request(space.name, delay, space._request_id())
        )
        return self._returned(reply)

    def extend(self, seconds: float) -> float:
        """Move the deadline to ``seconds`` from now (a long job); return the new deadline.
        `DeliveryExpiredError` as `ack`."""
        space = self._space
        reply: pb.ExtendReply = space._call(
            space._ops["Extend"], self._extend_request(space.name, seconds, space._request_id())
        )
        return self._extended(reply)


class Taking:
    """``with space.taking(template, ack=30.0, timeout=5.0) as delivery:`` (see `Space.taking`)."""

    __slots__ = ("_delivery", "_take")

    def __init__(self, take: Callable[[], Delivery | None]) -> None:
        self._take = take
        self._delivery: Delivery | None = None

    def __enter__(self) -> Delivery | None:
        self._delivery = self._take()
        return self._delivery

    def __exit__(
        self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None
    ) -> None:
        delivery = self._delivery
        settle = settlement(delivery, kind)
        if delivery is not None and settle == "ack":
            delivery.ack()
        elif delivery is not None and settle == "nack":
            # The block's own error matters more; if the nack fails, the deadline returns the entry.
            with contextlib.suppress(OutrigError):
                delivery.nack()


class BaseDeliveries(Generic[D]):
    """The state of a worker loop (`Space.deliveries`), shared by `Deliveries` and
    `AsyncDeliveries`: the current delivery, what the next take settles, and the count of
    deliveries whose deadline passed before the loop could settle them."""

    __slots__ = ("_current", "_done", "late")

    def __init__(self) -> None:
        self._current: D | None = None
        self._done = False
        #: Deliveries the loop found past their deadline when it settled them (each was, or will
        #: be, delivered again: a job that outran its ``ack``); the loop went on without them.
        self.late = 0

    @property
    def current(self) -> D | None:
        """The delivery the loop body is working on (None before the first, after the last)."""
        return self._current

    def _to_settle(self) -> D | None:
        """The current delivery, if the body left it unsettled (the next take acknowledges it)."""
        current = self._current
        return current if current is not None and not current.settled else None

    def _passed(self, previous: D | None, err: DeliveryExpiredError) -> None:
        """The next take's settle of `previous` failed (its deadline had passed): go on without."""
        if previous is None:
            raise err
        self.late += 1
        self._current = None

    def _advanced(self, delivery: D | None) -> bool:
        """The next take answered: whether the loop goes on (a delivery) or ends (its timeout)."""
        self._current = delivery
        self._done = delivery is None
        return not self._done

    def _ending(self, kind: type[BaseException] | None) -> tuple[D | None, str | None]:
        """The loop ends: its unsettled delivery, if any, and what to do with it (`settlement`)."""
        delivery, self._current, self._done = self._to_settle(), None, True
        return delivery, settlement(delivery, kind)


class Deliveries(BaseDeliveries[Delivery]):
    """``with space.deliveries(template, ack=30.0, timeout=5.0) as jobs:`` ``for delivery in jobs:``
    (see `Space.deliveries`)."""

    __slots__ = ("_take",)

    def __init__(self, take: Callable[[Delivery | None], Delivery | None]) -> None:
        super().__init__()
        self._take = take

    def __enter__(self) -> Deliveries:
        return self

    def __iter__(self) -> Deliveries:
        return self

    def __next__(self) -> Delivery:
        if self._done:
            raise StopIteration
        previous = self._to_settle()
        try:
            delivery = self._take(previous)
        except DeliveryExpiredError as err:
            self._passed(previous, err)
            delivery = self._take(None)
        if not self._advanced(delivery):
            raise StopIteration
        assert delivery is not None
        return delivery

    def __exit__(
        self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None
    ) -> None:
        delivery, settle = self._ending(kind)
        if delivery is not None and settle == "ack":
            delivery.ack()
        elif delivery is not None and settle == "nack":
            with contextlib.suppress(OutrigError):  # the body's error matters more
                delivery.nack()


def settlement(delivery: BaseDelivery | None, kind: type[BaseException] | None) -> str | None:
    """What `taking`'s block leaves to do at its end: "ack" after a normal exit, "nack" after an
    exception (with the space's backoff), None when there was no delivery or the block settled it."""
    if delivery is None or delivery.settled:
        return None
    return "ack" if kind is None else "nack"
