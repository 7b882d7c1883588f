"""The gRPC servicer: protobuf in, engine objects to the backend, protobuf out.

It holds no logic of its own beyond translation. Every method is wrapped by `unary` or
`streaming`, which first refuses a request whose bytes could not be decoded (`refusal`), then
passes the call through the security `Guard` (the one check point: see
outrig.service.security.guard), then asks the backend where the call's space is served
(`SpaceBackend.locate`) and forwards it to that server when it is another
(service/transport/peers.py). A call that presents the tier's secret in `outrig-peer` was
forwarded by a peer, which checked it already: it skips the guard and is never forwarded again
(`SpaceServicer.admit`). Errors the service raises on purpose map to status codes through one
table; anything else is logged and answered INTERNAL, and the server keeps serving. What a client
can make the server log is throttled (`logs.Throttle`: a line per method every LOG_INTERVAL
seconds), and no status message exceeds MAX_STATUS_MESSAGE.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, NoReturn, TypeVar

import grpc

from outrig._protocol import DETAILS_KEY, DIRECT_KEY, METHODS, error_info, status_details
from outrig.service.backends.base import SpaceBackend
from outrig.service.config import Limits, ServerConfig
from outrig.service.engine.model import StoredEntry, Template
from outrig.service.engine.partitions import split_name
from outrig.service.exceptions import (
    ChangesOffError,
    CompactedError,
    ConfigError,
    CrossPartitionError,
    DeliveryExpiredError,
    InvalidArgumentError,
    LeaseNotFoundError,
    NoOtherServerError,
    NotOwnerError,
    PermissionDeniedError,
    QuotaExceededError,
    RegistrationBusyError,
    RequestConflictError,
    RoutingValueError,
    ShuttingDownError,
    SpaceError,
    StoreUnavailableError,
    SubscriptionBusyError,
    SubscriptionNotFoundError,
    TransactionAbortedError,
    TransactionNotFoundError,
    TypeConflictError,
    UnauthenticatedError,
    UnsupportedError,
)
from outrig.service.logs import Throttle
from outrig.service.protocol import admin, changes, codec, deliveries, wire
from outrig.service.security.access import ACCESS
from outrig.service.security.guard import Authenticator, Guard
from outrig.service.transport import handlers
from outrig.service.transport.fanout import Fan
from outrig.service.transport.metrics import Metrics
from outrig.service.transport.peers import PEER_KEY, PeerError, Peers
from outrig.service.transport.routing import FanOut, Router
from outrig.v1 import space_pb2 as pb
from outrig.v1 import space_pb2_grpc

log = logging.getLogger("outrig.service")

#: The one table from the service's errors to what a client is told: the gRPC status, and the
#: `outrig.v1.ErrorReason` that tells apart errors of one status (sent as a google.rpc.ErrorInfo,
#: a Mux error's or a lease result's reason; see outrig._protocol). A subclass maps as the nearest
#: class listed above it in its MRO (TransactionNotFoundError is listed: it has its own reason).
STATUS_BY_ERROR: dict[type[SpaceError], tuple[grpc.StatusCode, pb.ErrorReason]] = {
    InvalidArgumentError: (grpc.StatusCode.INVALID_ARGUMENT, pb.INVALID_REQUEST),
    RoutingValueError: (grpc.StatusCode.INVALID_ARGUMENT, pb.ROUTING_VALUE_MISSING),
    CrossPartitionError: (grpc.StatusCode.FAILED_PRECONDITION, pb.CROSS_PARTITION),
    DeliveryExpiredError: (grpc.StatusCode.FAILED_PRECONDITION, pb.DELIVERY_EXPIRED),
    LeaseNotFoundError: (grpc.StatusCode.NOT_FOUND, pb.LEASE_NOT_FOUND),
    TransactionNotFoundError: (grpc.StatusCode.NOT_FOUND, pb.TRANSACTION_NOT_FOUND),
    QuotaExceededError: (grpc.StatusCode.RESOURCE_EXHAUSTED, pb.QUOTA_EXCEEDED),
    TypeConflictError: (grpc.StatusCode.FAILED_PRECONDITION, pb.TYPE_CONFLICT),
    UnsupportedError: (grpc.StatusCode.UNIMPLEMENTED, pb.ERROR_REASON_UNSPECIFIED),
    TransactionAbortedError: (grpc.StatusCode.FAILED_PRECONDITION, pb.TRANSACTION_ABORTED),
    ShuttingDownError: (grpc.StatusCode.UNAVAILABLE, pb.SHUTTING_DOWN),
    StoreUnavailableError: (grpc.StatusCode.UNAVAILABLE, pb.STORE_UNAVAILABLE),
    NotOwnerError: (grpc.StatusCode.UNAVAILABLE, pb.NOT_OWNER),  # ErrorInfo metadata "owner"
    NoOtherServerError: (grpc.StatusCode.FAILED_PRECONDITION, pb.NO_OTHER_SERVER),
    RequestConflictError: (grpc.StatusCode.FAILED_PRECONDITION, pb.REQUEST_CONFLICT),
    RegistrationBusyError: (grpc.StatusCode.FAILED_PRECONDITION, pb.REGISTRATION_BUSY),
    UnauthenticatedError: (grpc.StatusCode.UNAUTHENTICATED, pb.UNAUTHENTICATED),
    PermissionDeniedError: (grpc.StatusCode.PERMISSION_DENIED, pb.PERMISSION_DENIED),
    ConfigError: (grpc.StatusCode.INTERNAL, pb.ERROR_REASON_UNSPECIFIED),
    CompactedError: (grpc.StatusCode.OUT_OF_RANGE, pb.CURSOR_COMPACTED),  # ErrorInfo metadata "oldest"
    SubscriptionBusyError: (grpc.StatusCode.FAILED_PRECONDITION, pb.SUBSCRIPTION_BUSY),
    SubscriptionNotFoundError: (grpc.StatusCode.NOT_FOUND, pb.SUBSCRIPTION_NOT_FOUND),
    ChangesOffError: (grpc.StatusCode.FAILED_PRECONDITION, pb.ERROR_REASON_UNSPECIFIED),
}


#: The methods the server called answers itself, whoever serves the space: never forwarded.
ANSWERED_HERE = frozenset({"Locate", "ListSpaces", "Drain"})

#: Seconds ListSpaces waits at most for another server of the tier to count its spaces.
FIGURES_TIMEOUT = 5.0

#: The most bytes (UTF-8) of any status message the service sends, whatever made it: gRPC carries
#: it in the call's trailing metadata, which a client refuses beyond its limit (8 KiB by
#: default, where a message percent-encoded can take 3 bytes a byte). Messages quote client
#: text through `exceptions.excerpt` and stay far below this; `bounded` is the safety net.
MAX_STATUS_MESSAGE = 1024

#: The most space names the servicer remembers as valid (`SpaceServicer._space_named`).
CHECKED_NAMES = 4096

#: The most templates the servicer remembers decoded (`SpaceServicer._templates`).
KNOWN_TEMPLATES = 1024

#: Seconds between two log lines of one kind that a client's requests can cause (`Throttle`).
LOG_INTERVAL = 60.0
_throttle = Throttle(LOG_INTERVAL)


def bounded(message: str) -> str:
    """`message`, cut to at most MAX_STATUS_MESSAGE bytes of UTF-8, saying so."""
    data = message.encode(errors="backslashreplace")
    if len(data) <= MAX_STATUS_MESSAGE:
        return message
    note = f"… (cut: {len(data)} bytes in all)"
    head = data[: MAX_STATUS_MESSAGE - len(note.encode())].decode(errors="ignore")
    return head + note


def refusal(request: handlers.Undecodable, method: str, limits: Limits) -> InvalidArgumentError:
    """The refusal of a request whose bytes could not be decoded, the same for a unary call and a
    Mux stream's operation; logged, a line per method every LOG_INTERVAL seconds at most. Nesting
    past protobuf's parse limit is told apart, and named by outrig's own limit on it."""
    if request.too_deep:
        why = (
            "lists and maps nested deeper than protobuf can parse "
            f"(the limit is max_depth={limits.max_depth})"
        )
    else:
        why = f"not a valid {request.message_type} ({request.reason})"
    _throttle.log(
        log, logging.WARNING, ("undecodable", method), "refused an undecodable request to %s: %s", method, why
    )
    return InvalidArgumentError(f"request: cannot decode {method}'s request: {why}")


def status_for(err: SpaceError) -> tuple[grpc.StatusCode, pb.ErrorReason]:
    """The status and `ErrorReason` a client is told for `err` (STATUS_BY_ERROR)."""
    for cls in type(err).__mro__:
        found = STATUS_BY_ERROR.get(cls)
        if found is not None:
            return found
    return grpc.StatusCode.INTERNAL, pb.ERROR_REASON_UNSPECIFIED


def _checked(method: str) -> str:
    """Every method goes through the guard: one without an entry in the access table, which has
    one for each method the proto declares (with its `(outrig.v1.access)` option), is a bug."""
    if method not in ACCESS:
        raise AssertionError(f"{method}: no entry in outrig.service.security.access.ACCESS")
    return method


R = TypeVar("R")
Unary = Callable[[Any, Any, handlers.Context], Awaitable[R]]
Streaming = Callable[[Any, Any, handlers.Context], AsyncIterator[R]]


def unary(method: Unary[R]) -> Unary[R]:
    name = _checked(method.__name__)

    @functools.wraps(method)
    async def handler(self: SpaceServicer, request: Any, context: handlers.Context) -> R:
        outcome = await self.perform(name, method, request, context)
        if isinstance(outcome, Failure):
            await outcome.abort(context)
        return outcome

    handler.operation = method  # type: ignore[attr-defined]  # what the Mux stream runs (service/transport/mux.py)
    return handler


class _Locate:
    """What `SpaceServicer._admitted` leaves to ask the backend: where `space` is served."""

    __slots__ = ("space",)

    def __init__(self, space: str) -> None:
        self.space = space


class Failure:
    """How an operation failed: the status, message (`bounded`) and `ErrorReason` its call ends
    with, and what its ErrorInfo's metadata says (NOT_OWNER: "owner", the owner's address)."""

    __slots__ = ("message", "metadata", "reason", "status")

    def __init__(
        self,
        status: grpc.StatusCode,
        message: str,
        reason: int = pb.ERROR_REASON_UNSPECIFIED,
        metadata: dict[str, str] | None = None,
    ) -> None:
        self.status = status
        self.message = bounded(message)
        self.reason = reason
        self.metadata = metadata

    async def abort(self, context: handlers.Context) -> NoReturn:
        """End the call with this failure: its status and message, and its reason as a
        google.rpc.ErrorInfo in the status details (the `grpc-status-details-bin` trailer)."""
        trailer: tuple[tuple[str, str | bytes], ...] = ()
        if self.reason:
            details = status_details(self.status.value[0], self.message, self.reason, self.metadata)
            trailer = ((DETAILS_KEY, details),)
        await context.abort(self.status, self.message, trailer)
        raise AssertionError("unreachable: abort raises")

    @classmethod
    def of(cls, err: Exception, method: str) -> Failure:
        """An error the service raises on purpose becomes its status; anything else is logged and
        answered INTERNAL (the server goes on serving). A client able to cause the unexpected
        could cause it at every call: its traceback is logged once per method and type of error
        every LOG_INTERVAL seconds."""
        if isinstance(err, SpaceError):
            status, reason = status_for(err)
            owner = err.owner if isinstance(err, NotOwnerError) else ""
            if isinstance(err, changes.CompactedCursorError):
                return cls(status, str(err), reason, {"oldest": err.cursor})
            return cls(status, str(err), reason, {"owner": owner} if owner else None)
        if isinstance(err, grpc.aio.AioRpcError):  # a forwarded call (peers.py): as the owner ended it
            return cls.forwarded(err)
        if isinstance(err, PeerError):  # an operation forwarded over a peer stream, likewise
            return cls(err.code, err.message, err.reason, err.metadata or None)
        _throttle.log(log, logging.ERROR, (method, type(err)), "unexpected error in %s", method, exc_info=err)
        return cls(grpc.StatusCode.INTERNAL, f"internal error in {method}")

    @classmethod
    def forwarded(cls, err: grpc.aio.AioRpcError) -> Failure:
        """How a call this server forwarded ended: the owner's status, message, reason and
        ErrorInfo metadata, passed on as they are."""
        trailing = err.trailing_metadata()
        reason, metadata = error_info(None if trailing is None else [(key, value) for key, value in trailing])
        return cls(err.code(), err.details() or "", reason, metadata or None)


def streaming(method: Streaming[R]) -> Streaming[R]:
    name = _checked(method.__name__)

    @functools.wraps(method)
    async def handler(self: SpaceServicer, request: Any, context: handlers.Context) -> AsyncIterator[R]:
        metrics = self._metrics
        started = time.perf_counter() if metrics is not None else 0.0
        code = "OK"
        try:
            if isinstance(request, handlers.Undecodable):
                raise refusal(request, name, self._limits)
            address = await self.admit(name, request, context)
            if address is None:
                async for reply in method(self, request, context):
                    yield reply
            elif isinstance(address, FanOut):
                fans: dict[str, Callable[..., AsyncIterator[bytes]]] = {
                    "Contents": self._fan.contents,
                    "Changes": self._fan.changes,
                    "Notify": self._fan.notify,
                }
                async for encoded in fans[name](request, address, context):
                    yield encoded  # type: ignore[misc]  # encoded replies, as the method's
            else:
                async for reply in self._forwarded_stream(name, address, request, context):
                    yield reply
        except (asyncio.CancelledError, GeneratorExit):
            code = "CANCELLED"
            raise
        except Exception as err:
            failure = Failure.of(err, name)
            code = failure.status.name
            await failure.abort(context)
        finally:
            if metrics is not None:
                metrics.call(name, code, time.perf_counter() - started)

    return handler


def _entries_reply(entries: list[StoredEntry]) -> bytes:
    return wire.entries_reply([entry.payload for entry in entries])  # type: ignore[misc]  # bytes here


class SpaceServicer(space_pb2_grpc.SpaceServicer):
    """outrig.v1.Space over a `SpaceBackend`. Methods that answer with entries return the reply
    already encoded (service/protocol/wire.py), and the writes receive their request's bytes too
    (`handlers.Received`); register with `handlers.add_to_server`. The generated base class (each
    method answering UNIMPLEMENTED) types every reply as its message, so the methods that return
    an encoded reply break with it there (`ignore[override]`)."""

    def __init__(
        self,
        backend: SpaceBackend,
        limits: Limits,
        guard: Guard | None = None,
        metrics: Metrics | None = None,
        peers: Peers | None = None,
        config: ServerConfig | None = None,
    ) -> None:
        self._backend = backend
        self._limits = limits
        self._checked_names: set[str] = set()  # space names that passed `codec.space_name`
        self._known_templates: dict[bytes, tuple[Template, ...]] = {}  # by their encoding
        self._metrics = metrics
        self._guard = guard or Guard(Authenticator(None, client_certificates=False), None, limits)
        config = config or ServerConfig(limits=limits)
        self._shared_address = config.worker is not None  # a worker: the listen port is shared
        # Whether the backend may serve a space elsewhere (`locate`): a lone server's does not.
        self._forwards: bool = getattr(backend, "forwards", True)
        self._peers = peers or Peers(config)
        self._router = Router(config)
        self._partitioned = self._router.partitioned  # else `route` answers None: not asked per call
        self._fan = Fan(config, self.served, self.served_stream)
        #: This server's advertised address (OutrigServer sets it once bound): what Locate and
        #: ListSpaces name for a space served here when the backend names no address.
        self.advertised = ""

    async def admit(self, name: str, request: Any, context: handlers.Context) -> str | FanOut | None:
        """Let a decoded call in, and say where it is served: None here, else the address to
        forward it to, or the partitions of a partitioned space it goes to (`routing.Router`,
        which first renames a call that concerns one partition to it). A call that presents
        `outrig-peer` (PEER_KEY) was forwarded by a server of the tier if the backend accepts its
        secret: it skips the guard (the forwarding server
        checked the caller's credentials and grants) and is served here, never forwarded again
        (a backend that does not own its space refuses it: NotOwnerError). A wrong secret is
        UnauthenticatedError. Any other call passes the guard, then asks the backend
        (`SpaceBackend.locate`) about its space, unless its method is ANSWERED_HERE, or the
        backend serves every space itself (`forwards` false: a lone server)."""
        place = self._admitted(name, request, context)
        if isinstance(place, _Locate):
            return await self._located(name, place.space, context)
        return place

    def _admitted(self, name: str, request: Any, context: handlers.Context) -> str | FanOut | _Locate | None:
        """`admit`'s steps that need not wait: None (served here), the partitions, or the space
        whose server `_located` asks the backend for."""
        secret = peer_secret(context)
        if secret is not None:
            if not self._backend.accepts_peer(secret):
                _throttle.log(
                    log,
                    logging.WARNING,
                    ("peer", name),
                    "unauthenticated: %s from %s: %s presents no secret of this tier",
                    name,
                    context.peer(),
                    PEER_KEY,
                )
                raise UnauthenticatedError(
                    f"{PEER_KEY}: not the secret of this server's tier (only a server of the tier "
                    "forwards calls to another)"
                )
            return self._router.route(name, request)  # a peer names the partition: served here
        self._guard.check(context, name, request)
        fan = self._router.route(name, request) if self._partitioned else None
        if name in ANSWERED_HERE:
            return None
        if fan is not None:
            return fan
        if not self._forwards:
            return None  # a lone server serves every space: its name is checked by the method
        message = request.message if isinstance(request, handlers.Received) else request
        return _Locate(self._space_named(message.space))

    async def _located(self, name: str, space: str, context: handlers.Context) -> str | None:
        """Where the backend serves `space`: None here, else the address to forward the call to
        (or NotOwnerError, for a call routed here as to the owner)."""
        address = await self._backend.locate(space)
        if address is None:
            return None
        metrics = self._metrics
        if _routed_directly(context):
            # The SDK sent it here believing this server the owner: redirect, do not forward.
            if metrics is not None:
                metrics.routed(name, "redirected")
            raise NotOwnerError(f"space {space!r} is served by {address}", address)
        if metrics is not None:
            metrics.routed(name, "forwarded")
        return address

    def admits_all(self, context: handlers.Context) -> bool:
        """Whether `admit` lets every call of `context` in, to be served here, with nothing to
        check per call: on a lone server (`forwards` false) with no partitioned space and an open
        guard (no authentication, no policy), a context that presents no peer secret. All of it
        is fixed when the server and the call start: a Mux stream asks once (`perform`'s
        `admitted`)."""
        return (
            not self._forwards and not self._partitioned and self._guard.open and peer_secret(context) is None
        )

    async def perform(
        self, name: str, method: Unary[R], request: Any, context: handlers.Context, admitted: bool = False
    ) -> R | Failure:
        """Run one operation, through the guard, as a unary call or a Mux stream's operation, here
        or forwarded to the server that serves its space (`admit`): its reply, or how it failed
        (`Failure.of`; a forwarded operation's as the owner ended it, over the owner's peer
        stream or as a unary call: peers.py). `admitted`: `admits_all(context)` is true, so
        `admit` would answer None (served here)."""
        metrics = self._metrics
        started = time.perf_counter() if metrics is not None else 0.0
        code = "OK"
        try:
            if isinstance(request, handlers.Undecodable):
                raise refusal(request, name, self._limits)
            # `admit`, without a coroutine of its own for the common case (served here).
            address = None if admitted else self._admitted(name, request, context)
            if isinstance(address, _Locate):
                address = await self._located(name, address.space, context)
            if address is None:
                return await method(self, request, context)
            if isinstance(address, FanOut):
                reply_of_all: R = await self._fan_out(name, request, address, context)
                return reply_of_all
            # The owner's reply, as the method would return it: bytes or the reply message.
            reply: R = await self._peers.unary(
                address, METHODS[name], request, self._backend.peer_secret, context.time_remaining()
            )
            return reply
        except asyncio.CancelledError:
            code = "CANCELLED"
            raise
        except Exception as err:
            failure = Failure.of(err, name)
            code = failure.status.name
            return failure
        finally:
            if metrics is not None:
                metrics.call(name, code, time.perf_counter() - started)

    async def _fan_out(self, name: str, request: Any, fan: FanOut, context: handlers.Context) -> Any:
        """A call of a partitioned space that goes to several of its partitions (`fanout.Fan`)."""
        if name in ("Read", "Take", "ReadMany", "TakeMany"):
            return await self._fan.match(name, request, fan, context)
        if name in ("RenewLeases", "CancelLeases"):
            return await self._fan.leases(name, request, fan, context)
        run = {
            "WriteMany": self._fan.write_many,
            "Count": self._fan.count,
            "DescribeSpace": self._fan.describe,
            "Browse": self._fan.browse,
            "Purge": self._fan.purge,
            "AckChanges": self._fan.ack_changes,
            "DeleteSubscription": self._fan.delete_subscription,
            "Ack": self._fan.acks,
        }.get(name)
        if run is None:
            raise AssertionError(f"{name}: routed to several partitions, which it cannot be")
        return await run(request, fan, context)  # type: ignore[operator]

    async def served(self, name: str, request: Any, context: handlers.Context) -> Any:
        """One partition's share of a fan-out (its request names the partition), here or at the
        server that serves it: its reply, or its error raised."""
        message = request.message if isinstance(request, handlers.Received) else request
        address = await self._backend.locate(message.space)
        if address is None:
            return await _LOCAL[name](self, request, context)
        return await self._peers.unary(
            address, METHODS[name], request, self._backend.peer_secret, context.time_remaining()
        )

    async def served_stream(self, name: str, request: Any, context: handlers.Context) -> AsyncIterator[Any]:
        """One partition's share of a streaming fan-out (Contents, Notify), likewise."""
        address = await self._backend.locate(request.space)
        if address is None:
            async for reply in _LOCAL[name](self, request, context):
                yield reply
            return
        async for reply in self._forwarded_stream(name, address, request, context):
            yield reply

    async def _forwarded_stream(
        self, name: str, address: str, request: Any, context: handlers.Context
    ) -> AsyncIterator[Any]:
        """A streaming call forwarded to `address`: its replies, as the owner sends them."""
        call = self._peers.stream(
            address, METHODS[name], request, self._backend.peer_secret, context.time_remaining()
        )
        try:
            async for reply in call:
                yield reply
        finally:
            call.cancel()  # the caller's stream ended first (a no-op once the call has)

    def _space(self, request: Any) -> str:
        return self._space_named(request.space)

    def _space_named(self, name: str) -> str:
        """`codec.space_name`, remembered: every operation checks its space's name (in its method,
        and first in `admit` when the backend may serve it elsewhere), and a server serves few
        names; a bounded set of those that passed."""
        if name in self._checked_names:
            return name
        checked = codec.space_name(name, self._limits)
        if len(self._checked_names) >= CHECKED_NAMES:
            self._checked_names.clear()
        self._checked_names.add(checked)
        return checked

    @unary
    async def Write(
        self, received: handlers.Received[pb.WriteRequest], context: handlers.Context
    ) -> pb.WriteReply:
        request = received.message
        space = self._space(request)
        if not request.HasField("entry"):
            raise InvalidArgumentError("entry: is required")
        encodings = received.entries
        # A client may send the field twice (the decoder merges them): then re-encode the merge.
        encoding = encodings[0] if len(encodings) == 1 else None
        entry = codec.new_entry(request.entry, "entry", self._limits, encoding)
        (grant,) = await self._backend.write(
            space,
            [entry],
            codec.lease_duration(request),
            request_id=codec.request_id(request),
            transaction=request.transaction,
            visible_at=deliveries.visible_at(request, time.time()),
        )
        reply = pb.WriteReply()
        codec.fill_lease(reply.lease, grant)
        return reply

    @unary
    async def WriteMany(
        self, received: handlers.Received[pb.WriteManyRequest], context: handlers.Context
    ) -> pb.WriteManyReply:
        request = received.message
        space = self._space(request)
        entries = codec.new_entries(request.entries, self._limits, received.entries, one_pass=True)
        grants = await self._backend.write(
            space,
            entries,
            codec.lease_duration(request),
            request_id=codec.request_id(request),
            transaction=request.transaction,
            visible_at=deliveries.visible_at(request, time.time()),
        )
        return codec.write_many_reply(grants)

    async def _match(self, request: pb.MatchRequest, *, take: bool, many: bool) -> bytes:
        space = self._space(request)
        if request.replay_only:
            if request.HasField("ack"):
                raise InvalidArgumentError(
                    "replay_only: a take with ack answers a retry with its request_id itself"
                )
            if not take or not request.request_id:
                raise InvalidArgumentError("replay_only: only a take with a request_id asks for a replay")
            return _entries_reply(await self._backend.replay(space, codec.request_id(request)))
        ack = deliveries.ack_seconds(request, self._limits, take=take)
        if ack is None:
            deliveries.settle_receipts(request, self._limits, ack)  # refuses a settle without ack
        templates = self._templates(request)
        if ack is not None:
            delivered = await self._backend.deliver(
                space,
                templates,
                max_entries=codec.max_entries(request, self._limits) if many else 1,
                timeout=codec.timeout(request, self._limits),
                ack=ack,
                max_deliveries=request.max_deliveries,
                request_id=codec.request_id(request),
                settle=deliveries.settle_receipts(request, self._limits, ack),
            )
            return deliveries.deliveries_reply(delivered)  # an encoded MatchReply
        found = await self._backend.match(
            space,
            templates,
            take=take,
            max_entries=codec.max_entries(request, self._limits) if many else 1,
            timeout=codec.timeout(request, self._limits),
            if_exists=request.if_exists,
            request_id=codec.request_id(request) if take else "",
            transaction=request.transaction,
        )
        return _entries_reply(found)  # an encoded MatchReply

    def _templates(self, request: pb.MatchRequest) -> Sequence[Template]:
        """`codec.templates` of a read's or take's request, remembered by the template's encoding
        (a bounded map): a consumer takes with the same template again and again, and one that
        passed is the same immutable `Template` every time. Only a request of one template with
        neither matchers nor an order; any other is decoded each time."""
        messages = request.templates
        if len(messages) != 1 or request.order_by:
            return codec.templates(messages, self._limits, request.order_by)
        key = messages[0].SerializeToString()
        known = self._known_templates.get(key)
        if known is not None:
            return known
        templates = codec.templates(messages, self._limits)
        if type(templates) is tuple:  # equality only: no matchers (`Templates`, with its order)
            if len(self._known_templates) >= KNOWN_TEMPLATES:
                self._known_templates.clear()
            self._known_templates[key] = templates
        return templates

    @unary
    async def Read(  # type: ignore[override]  # an encoded reply
        self, request: pb.MatchRequest, context: handlers.Context
    ) -> bytes:
        return await self._match(request, take=False, many=False)

    @unary
    async def Take(  # type: ignore[override]  # an encoded reply
        self, request: pb.MatchRequest, context: handlers.Context
    ) -> bytes:
        return await self._match(request, take=True, many=False)

    @unary
    async def ReadMany(  # type: ignore[override]  # an encoded reply
        self, request: pb.MatchRequest, context: handlers.Context
    ) -> bytes:
        return await self._match(request, take=False, many=True)

    @unary
    async def TakeMany(  # type: ignore[override]  # an encoded reply
        self, request: pb.MatchRequest, context: handlers.Context
    ) -> bytes:
        return await self._match(request, take=True, many=True)

    @streaming
    async def Contents(  # type: ignore[override]  # an encoded reply
        self, request: pb.ContentsRequest, context: handlers.Context
    ) -> AsyncIterator[bytes]:
        space = self._space(request)
        templates = codec.templates(request.templates, self._limits, request.order_by)
        async for chunk in self._backend.contents(space, templates, request.max_entries, request.transaction):
            yield _entries_reply(chunk)  # an encoded ContentsReply

    @unary
    async def Count(self, request: pb.CountRequest, context: handlers.Context) -> pb.CountReply:
        space = self._space(request)
        templates = codec.templates(request.templates, self._limits)
        return pb.CountReply(count=await self._backend.count(space, templates, request.transaction))

    @streaming
    async def Notify(  # type: ignore[override]  # an encoded reply
        self, request: pb.NotifyRequest, context: handlers.Context
    ) -> AsyncIterator[bytes]:
        space = self._space(request)
        if request.HasField("resume"):
            subscription = await self._backend.subscribe(space, (), None, resume=request.resume)
        else:
            templates = codec.templates(request.templates, self._limits)
            subscription = await self._backend.subscribe(
                space, templates, codec.lease_duration(request), transaction=request.transaction
            )
        try:
            yield pb.NotifyReply(registration=codec.lease_message(subscription.lease)).SerializeToString()
            async for event in subscription:
                yield wire.event_reply(event.sequence, event.entry.payload)  # type: ignore[arg-type]
        finally:
            subscription.close()

    @streaming
    async def Changes(  # type: ignore[override]  # an encoded reply
        self, request: pb.ChangesRequest, context: handlers.Context
    ) -> AsyncIterator[bytes]:
        """The space's change log after `since` (or its head), then live: a first message with
        the start and oldest cursors, then a message per matching change, and a cursor-only one
        whenever the feed read past changes that did not match (protocol/changes.py)."""
        space = self._space(request)
        names = (space,)
        # No template: every entry (the guard then asks for notify on the space itself).
        templates = codec.templates(request.templates, self._limits) if request.templates else ()
        kinds = changes.kinds(request)
        durable = changes.durable_name(request.durable)
        since = changes.since(request, names)
        try:
            feed = await self._backend.changes(
                space, templates, kinds, since=None if since is None else since[0], durable=durable
            )
        except CompactedError as err:
            oldest = changes.encode_cursor(names, [(err.epoch, err.oldest)])
            raise changes.CompactedCursorError(err, oldest) from None
        try:
            epoch = feed.epoch
            yield changes.start_reply(
                changes.encode_cursor(names, [(epoch, feed.start)]),
                changes.encode_cursor(names, [(epoch, feed.oldest)]),
            )
            async for batch in feed:
                last = None
                for change in batch.changes:
                    last = change.seq
                    yield changes.change_reply(change, changes.encode_cursor(names, [(epoch, last)]))
                if batch.position != last:
                    yield changes.progress_reply(changes.encode_cursor(names, [(epoch, batch.position)]))
        finally:
            feed.close()

    @unary
    async def AckChanges(
        self, request: pb.AckChangesRequest, context: handlers.Context
    ) -> pb.AckChangesReply:
        space = self._space(request)
        durable = changes.durable_name(request.durable, required=True)
        ((_, position),) = changes.decode_cursor(request.cursor, (space,), "cursor")
        await self._backend.ack_changes(space, durable, position)
        return pb.AckChangesReply()

    @unary
    async def DeleteSubscription(
        self, request: pb.DeleteSubscriptionRequest, context: handlers.Context
    ) -> pb.DeleteSubscriptionReply:
        space = self._space(request)
        await self._backend.delete_subscription(space, changes.durable_name(request.durable, required=True))
        return pb.DeleteSubscriptionReply()

    @unary
    async def RenewLeases(
        self, request: pb.RenewLeasesRequest, context: handlers.Context
    ) -> pb.RenewLeasesReply:
        space = self._space(request)
        if len(request.renewals) > self._limits.max_batch:
            raise InvalidArgumentError(
                f"renewals: {len(request.renewals)} exceeds the limit max_batch={self._limits.max_batch}"
            )
        renewals = [(item.id, codec.lease_duration(item, "duration")) for item in request.renewals]
        outcomes = await self._backend.renew(space, renewals)
        results = []
        for (lease_id, _), outcome in zip(renewals, outcomes, strict=True):
            if isinstance(outcome, SpaceError):
                results.append(_lease_error(lease_id, outcome))
            else:
                results.append(pb.LeaseResult(id=lease_id, lease=codec.lease_message(outcome)))
        return pb.RenewLeasesReply(results=results)

    @unary
    async def CancelLeases(
        self, request: pb.CancelLeasesRequest, context: handlers.Context
    ) -> pb.CancelLeasesReply:
        space = self._space(request)
        if len(request.ids) > self._limits.max_batch:
            raise InvalidArgumentError(
                f"ids: {len(request.ids)} exceeds the limit max_batch={self._limits.max_batch}"
            )
        outcomes = await self._backend.cancel(space, list(request.ids))
        results = [
            pb.LeaseResult(id=lease_id) if outcome is None else _lease_error(lease_id, outcome)
            for lease_id, outcome in zip(request.ids, outcomes, strict=True)
        ]
        return pb.CancelLeasesReply(results=results)

    @unary
    async def Begin(self, request: pb.BeginRequest, context: handlers.Context) -> pb.BeginReply:
        grant = await self._backend.begin(self._space(request), codec.lease_duration(request))
        return pb.BeginReply(transaction=codec.lease_message(grant))

    @unary
    async def Commit(self, request: pb.EndRequest, context: handlers.Context) -> pb.EndReply:
        await self._backend.commit(self._space(request), _transaction_id(request))
        return pb.EndReply()

    @unary
    async def Abort(self, request: pb.EndRequest, context: handlers.Context) -> pb.EndReply:
        await self._backend.abort(self._space(request), _transaction_id(request))
        return pb.EndReply()

    @unary
    async def Ack(self, request: pb.AckRequest, context: handlers.Context) -> pb.AckReply:
        space = self._space(request)
        receipts = deliveries.ack_receipts(request, self._limits)
        if receipts is not None:
            outcomes = await self._backend.ack_many(space, receipts, request_id=codec.request_id(request))
            return pb.AckReply(
                results=[
                    pb.AckResult(receipt=receipt) if outcome is None else _ack_error(receipt, outcome)
                    for receipt, outcome in zip(receipts, outcomes, strict=True)
                ]
            )
        await self._backend.ack(space, deliveries.receipt(request), request_id=codec.request_id(request))
        return pb.AckReply()

    @unary
    async def Nack(self, request: pb.NackRequest, context: handlers.Context) -> pb.NackReply:
        space = self._space(request)
        returned = await self._backend.nack(
            space,
            deliveries.receipt(request),
            deliveries.nack_delay(request),
            request_id=codec.request_id(request),
        )
        # The dead-letter space as users name it: a partition's ("jobs.dead~3") is "jobs.dead".
        dead_letter = split_name(returned.dead_letter)[0] if returned.dead_letter else ""
        return pb.NackReply(visible_at=returned.visible_at or 0.0, dead_letter=dead_letter)

    @unary
    async def Extend(self, request: pb.ExtendRequest, context: handlers.Context) -> pb.ExtendReply:
        space = self._space(request)
        seconds = deliveries.deadline_seconds(request.seconds, "seconds", self._limits)
        deadline = await self._backend.extend(
            space, deliveries.receipt(request), seconds, request_id=codec.request_id(request)
        )
        return pb.ExtendReply(deadline=deadline)

    @unary
    async def Locate(self, request: pb.LocateRequest, context: handlers.Context) -> pb.LocateReply:
        space = self._space(request)
        base, k = split_name(space)
        partitioning = self._router.partitioning(base)
        reply = pb.LocateReply(shared_address=self._shared_address)
        if partitioning is not None:  # where its partitions are: LocateRequest.partition
            reply.routing_field, reply.partitions = partitioning.field, partitioning.count
            if k is None:
                reply.address, reply.here = self.advertised, True
                return reply
        address = await self._backend.locate(space)
        if address is None:
            reply.address, reply.here = self.advertised, True
        else:
            reply.address, reply.here = address, False
        return reply

    @unary
    async def ListSpaces(
        self, request: pb.ListSpacesRequest, context: handlers.Context
    ) -> pb.ListSpacesReply:
        reply = pb.ListSpacesReply()
        placements = sorted(await self._backend.placements(), key=lambda p: p.space)
        figures = {name: (f.entries, f.bytes) for name, f in (await self._backend.space_figures()).items()}
        if peer_secret(context) is None:  # asked by a client: the owners elsewhere count theirs
            others = {p.address for p in placements if not p.here and p.address and p.expires_in}
            figures.update(await self._figures_at(others, context.time_remaining()))
        for placement in placements:
            item = reply.spaces.add(
                space=placement.space,
                owner=placement.owner,
                address=placement.address or (self.advertised if placement.here else ""),
                epoch=placement.epoch,
                here=placement.here,
            )
            if placement.expires_in is not None:
                item.expires_in = placement.expires_in
            counted = figures.get(placement.space) if placement.here or placement.address else None
            if counted is not None:
                item.entries, item.bytes = counted
        return reply

    async def _figures_at(self, addresses: set[str], timeout: float | None) -> dict[str, tuple[int, int]]:
        """The (entries, bytes) of the spaces the servers at `addresses` serve, each asked with
        a forwarded ListSpaces; a server that does not answer in time counts none."""
        limit = FIGURES_TIMEOUT if timeout is None else min(timeout, FIGURES_TIMEOUT)

        async def ask(address: str) -> pb.ListSpacesReply | None:
            try:
                answer: pb.ListSpacesReply = await self._peers.unary(
                    address, METHODS["ListSpaces"], pb.ListSpacesRequest(), self._backend.peer_secret, limit
                )
            except Exception as err:  # that server's spaces are shown without figures
                log.info("ListSpaces: no figures from %s: %s", address, err)
                return None
            return answer

        figures: dict[str, tuple[int, int]] = {}
        for answer in await asyncio.gather(*(ask(address) for address in sorted(addresses))):
            for item in () if answer is None else answer.spaces:
                if item.here and item.HasField("entries"):
                    figures[item.space] = (item.entries, item.bytes)
        return figures

    @unary
    async def MoveSpace(self, request: pb.MoveSpaceRequest, context: handlers.Context) -> pb.MoveSpaceReply:
        if len(request.to) > self._limits.max_name_length:
            raise InvalidArgumentError(f"to: longer than {self._limits.max_name_length} characters")
        to = request.to
        return pb.MoveSpaceReply(address=await self._backend.move(self._space(request), to))

    @unary
    async def Drain(self, request: pb.DrainRequest, context: handlers.Context) -> pb.DrainReply:
        reply = pb.DrainReply()
        for space, address in await self._backend.drain():
            reply.moved.add(space=space, address=address)
        return reply

    # ------------------------------------------------------------------ inspection (admin)

    @unary
    async def DescribeSpace(
        self, request: pb.DescribeSpaceRequest, context: handlers.Context
    ) -> pb.DescribeSpaceReply:
        return admin.describe_reply(await self._backend.describe(self._space(request)))

    @unary
    async def Browse(self, request: pb.BrowseRequest, context: handlers.Context) -> pb.BrowseReply:
        space = self._space(request)
        templates = admin.templates(request.templates, self._limits)
        found, cursor = await self._backend.browse(space, templates, request.after, admin.page_size(request))
        return admin.browse_reply(found, cursor)

    @unary
    async def Purge(self, request: pb.PurgeRequest, context: handlers.Context) -> pb.PurgeReply:
        space = self._space(request)
        limit = admin.purge_limit(request)
        templates = codec.templates(request.templates, self._limits)
        count = await self._backend.purge(space, templates, dry_run=request.dry_run, max_entries=limit)
        if not request.dry_run:
            log.warning("purge: %d entries of space %r removed by %s", count, space, context.peer())
        return pb.PurgeReply(count=count)

    @unary
    async def CancelRegistration(self, request: pb.LeaseIdRequest, context: handlers.Context) -> pb.EndReply:
        await self._backend.cancel_registration(self._space(request), _lease_id(request))
        return pb.EndReply()

    @unary
    async def AbortTransaction(self, request: pb.LeaseIdRequest, context: handlers.Context) -> pb.EndReply:
        await self._backend.abort(self._space(request), _lease_id(request))
        return pb.EndReply()


#: The methods as they run here, without the wrapper (a fan-out's calls of one partition each).
_LOCAL: dict[str, Any] = {
    name: getattr(SpaceServicer, name).__wrapped__ for name in METHODS if hasattr(SpaceServicer, name)
}


def _lease_id(request: pb.LeaseIdRequest) -> int:
    if not request.id:
        raise InvalidArgumentError("id: is required (a registration's or a transaction's id)")
    return int(request.id)


def peer_secret(context: handlers.Context) -> str | None:
    """The secret a call presents in `outrig-peer` (PEER_KEY), or None if it presents none; a Mux
    stream's operation, what its stream's metadata presented (found once, when the stream started:
    `handlers.StreamContext`)."""
    if isinstance(context, handlers.StreamContext):
        return context.peer_secret
    for key, value in context.invocation_metadata() or ():
        if key == PEER_KEY:
            return value if isinstance(value, str) else value.decode("utf-8", "replace")
    return None


def _routed_directly(context: handlers.Context) -> bool:
    """Whether the call says it was routed here as to the space's owner (`outrig-direct`)."""
    return any(key == DIRECT_KEY for key, _ in context.invocation_metadata() or ())


def _transaction_id(request: pb.EndRequest) -> int:
    if not request.transaction:
        raise InvalidArgumentError("transaction: is required (the id Begin returned)")
    return int(request.transaction)


def _lease_error(lease_id: int, err: SpaceError) -> pb.LeaseResult:
    status, reason = status_for(err)
    return pb.LeaseResult(
        id=lease_id, error_code=status.value[0], error_message=bounded(str(err)), error_reason=reason
    )


def _ack_error(receipt: int, err: SpaceError) -> pb.AckResult:
    status, reason = status_for(err)
    return pb.AckResult(
        receipt=receipt, error_code=status.value[0], error_message=bounded(str(err)), error_reason=reason
    )
