"""The errors outrig raises, one class per gRPC status, under one root.

::

    OutrigError                      every error a space call raises
     ├── CallCancelledError          CANCELLED
     ├── UnknownStatusError          UNKNOWN, and any status this client does not know
     ├── InvalidArgumentError        INVALID_ARGUMENT
     │   └── RoutingValueError       an entry of a partitioned space without its routing value
     ├── DeadlineExceededError       DEADLINE_EXCEEDED
     ├── NotFoundError               NOT_FOUND
     │   ├── LeaseNotFoundError      an unknown, cancelled or expired lease
     │   │   └── TransactionNotFoundError an unknown or ended transaction
     │   └── SubscriptionNotFoundError an unknown durable subscription of the change log
     ├── AlreadyExistsError          ALREADY_EXISTS
     ├── PermissionDeniedError       PERMISSION_DENIED
     ├── ResourceExhaustedError      RESOURCE_EXHAUSTED
     │   └── QuotaExceededError      a space quota or server limit
     ├── FailedPreconditionError     FAILED_PRECONDITION
     │   ├── TypeConflictError       an entry type declared with other supertypes than it has
     │   ├── TransactionAbortedError a commit of an aborted transaction
     │   ├── RequestConflictError    a request id used again for another call
     │   ├── RegistrationBusyError   resuming a notify registration another stream holds
     │   ├── SubscriptionBusyError   a durable subscription another stream reads
     │   ├── CrossPartitionError     a transaction touching a second partition
 │   ├── DeliveryExpiredError    an ack, nack or extend of a delivery no longer pending
     │   └── NoOtherServerError      moving a space or draining a server with no other server
     ├── AbortedError                ABORTED
     ├── OutOfRangeError             OUT_OF_RANGE
     │   └── CompactedError          a change cursor older than the log holds (``.oldest``)
     ├── UnimplementedError          UNIMPLEMENTED
     ├── InternalError               INTERNAL
     ├── UnavailableError            UNAVAILABLE
     │   ├── ShuttingDownError       the server is stopping
     │   └── StoreUnavailableError   a change could not be made durable (nothing acknowledged)
     │       └── NotOwnerError       the server does not own the space (nothing acknowledged)
     ├── DataLossError               DATA_LOSS
     └── UnauthenticatedError        UNAUTHENTICATED

Every error keeps the gRPC status as ``.code`` (a ``grpc.StatusCode``), the server's message as
``.details`` and the server's reason as ``.reason`` (an ``outrig.v1.ErrorReason`` name such as
``"TYPE_CONFLICT"``, or ``""``). The classes under a status class are told apart by that reason,
which the server sends as a google.rpc.ErrorInfo (see ``outrig._protocol``), so ``except
FailedPreconditionError`` catches a type conflict as it always did, and ``except
TypeConflictError`` catches only that. Values that cannot be encoded never reach the wire: they
raise the builtin ``TypeError`` or ``ValueError`` instead, naming the field.

``_BY_STATUS`` and ``_BY_REASON`` are the tables from status and reason to class;
`error_from_status` is the one function that uses them, and the gRPC boundary
(``outrig._base.rpc_errors``), Mux results and batch lease results all go through it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, ClassVar

import grpc

from outrig._protocol import error_info
from outrig.v1 import space_pb2 as pb

__all__ = [
    "AbortedError",
    "AlreadyExistsError",
    "CallCancelledError",
    "CompactedError",
    "CrossPartitionError",
    "DataLossError",
    "DeadlineExceededError",
    "DeliveryExpiredError",
    "FailedPreconditionError",
    "InternalError",
    "InvalidArgumentError",
    "LeaseNotFoundError",
    "NoOtherServerError",
    "NotFoundError",
    "NotOwnerError",
    "OutOfRangeError",
    "OutrigError",
    "PermissionDeniedError",
    "QuotaExceededError",
    "RegistrationBusyError",
    "RequestConflictError",
    "ResourceExhaustedError",
    "RoutingValueError",
    "ShuttingDownError",
    "StoreUnavailableError",
    "SubscriptionBusyError",
    "SubscriptionNotFoundError",
    "TransactionAbortedError",
    "TransactionNotFoundError",
    "TypeConflictError",
    "UnauthenticatedError",
    "UnavailableError",
    "UnimplementedError",
    "UnknownStatusError",
    "error_from_code",
    "error_from_rpc",
    "error_from_status",
]


class OutrigError(Exception):
    """The root of every error a space call raises.

    Attributes:
        code: the gRPC status (``grpc.StatusCode``) the server answered with.
        details: the server's message (may be empty).
        reason: why, in the protocol's words: an ``outrig.v1.ErrorReason`` name, or ``""`` when
            the server gave none.
    """

    #: The status this class stands for; the table below is built from these.
    code: Any = grpc.StatusCode.UNKNOWN
    #: The `ErrorReason` (its number) a domain class stands for; 0 for a status class.
    _reason: ClassVar[int] = 0

    def __init__(self, details: str = "", *, code: Any = None, reason: str = "") -> None:
        super().__init__(details)
        self.details = details
        self.reason = reason or (pb.ErrorReason.Name(self._reason) if self._reason else "")
        # Only UnknownStatusError is ever built with a code other than its class's own.
        if code is not None:
            self.code = code

    def __str__(self) -> str:
        return self.details or self.code.name


class CallCancelledError(OutrigError):
    """The call was cancelled (CANCELLED), by the client or the server."""

    code = grpc.StatusCode.CANCELLED


class UnknownStatusError(OutrigError):
    """The server failed without saying why (UNKNOWN), or with a status this client does not know."""

    code = grpc.StatusCode.UNKNOWN


class InvalidArgumentError(OutrigError):
    """The request was malformed (INVALID_ARGUMENT): a bad duration, template or value."""

    code = grpc.StatusCode.INVALID_ARGUMENT


class DeadlineExceededError(OutrigError):
    """The call's gRPC deadline passed before it finished (DEADLINE_EXCEEDED)."""

    code = grpc.StatusCode.DEADLINE_EXCEEDED


class NotFoundError(OutrigError):
    """Something named does not exist (NOT_FOUND), such as an unknown or expired lease."""

    code = grpc.StatusCode.NOT_FOUND


class AlreadyExistsError(OutrigError):
    """Something to be created exists already (ALREADY_EXISTS)."""

    code = grpc.StatusCode.ALREADY_EXISTS


class PermissionDeniedError(OutrigError):
    """The caller may not do this (PERMISSION_DENIED)."""

    code = grpc.StatusCode.PERMISSION_DENIED


class ResourceExhaustedError(OutrigError):
    """A quota or limit was hit (RESOURCE_EXHAUSTED), such as the maximum message size."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class FailedPreconditionError(OutrigError):
    """The space is not in a state that allows this call (FAILED_PRECONDITION)."""

    code = grpc.StatusCode.FAILED_PRECONDITION


class AbortedError(OutrigError):
    """The call was aborted, typically by a conflict (ABORTED); it may be retried."""

    code = grpc.StatusCode.ABORTED


class OutOfRangeError(OutrigError):
    """A value was outside its valid range (OUT_OF_RANGE)."""

    code = grpc.StatusCode.OUT_OF_RANGE


class UnimplementedError(OutrigError):
    """The server does not implement this call (UNIMPLEMENTED)."""

    code = grpc.StatusCode.UNIMPLEMENTED


class InternalError(OutrigError):
    """The server broke, or broke the protocol (INTERNAL)."""

    code = grpc.StatusCode.INTERNAL


class UnavailableError(OutrigError):
    """The server could not be reached (UNAVAILABLE); the call may be retried."""

    code = grpc.StatusCode.UNAVAILABLE


class DataLossError(OutrigError):
    """Data was lost or corrupted (DATA_LOSS)."""

    code = grpc.StatusCode.DATA_LOSS


class UnauthenticatedError(OutrigError):
    """The caller has no valid credentials (UNAUTHENTICATED)."""

    code = grpc.StatusCode.UNAUTHENTICATED


class RoutingValueError(InvalidArgumentError):
    """An entry written to a partitioned space holds no value in the space's routing field (the
    field that decides its partition): the message names the field."""

    _reason = pb.ROUTING_VALUE_MISSING


class CrossPartitionError(FailedPreconditionError):
    """A transaction of a partitioned space works in one partition (the one its routing value,
    given to `Space.transaction(route=...)`, picks): a call under it touched another."""

    _reason = pb.CROSS_PARTITION


class DeliveryExpiredError(FailedPreconditionError):
    """An ack, nack or extend named a delivery that is no longer pending: acknowledged or returned
    already, past its deadline (the entry visible again, perhaps delivered to someone else since),
    its entry cancelled or expired, or never given. Nothing was changed."""

    _reason = pb.DELIVERY_EXPIRED


class LeaseNotFoundError(NotFoundError):
    """A renew or cancel named a lease that is unknown, cancelled or expired."""

    _reason = pb.LEASE_NOT_FOUND


class TransactionNotFoundError(LeaseNotFoundError):
    """The transaction is unknown, or has committed, aborted or run out of lease."""

    _reason = pb.TRANSACTION_NOT_FOUND


class QuotaExceededError(ResourceExhaustedError):
    """A space quota (entries, bytes) or a server limit would be exceeded."""

    _reason = pb.QUOTA_EXCEEDED


class TypeConflictError(FailedPreconditionError):
    """An entry type was declared with other supertypes than the space already has for it."""

    _reason = pb.TYPE_CONFLICT


class TransactionAbortedError(FailedPreconditionError):
    """A commit of a transaction that has aborted (its lease ran out, say), or an abort of one
    that has committed."""

    _reason = pb.TRANSACTION_ABORTED


class RequestConflictError(FailedPreconditionError):
    """A request id was used again for a different call."""

    _reason = pb.REQUEST_CONFLICT


class RegistrationBusyError(FailedPreconditionError):
    """Another stream holds the notify registration being resumed."""

    _reason = pb.REGISTRATION_BUSY


class SubscriptionBusyError(FailedPreconditionError):
    """Another stream reads the durable subscription (at most one at once)."""

    _reason = pb.SUBSCRIPTION_BUSY


class SubscriptionNotFoundError(NotFoundError):
    """The space has no durable subscription of that name."""

    _reason = pb.SUBSCRIPTION_NOT_FOUND


class CompactedError(OutOfRangeError):
    """A change cursor older than the space's change log holds (retention trimmed the changes
    after it, or the log is another: a memory-only server restarted): those changes are gone.

    Attributes:
        oldest: the oldest cursor the log can still resume from (``""`` if the server named
            none): pass it as ``since`` to go on from there, knowing what was lost.
    """

    _reason = pb.CURSOR_COMPACTED

    def __init__(self, details: str = "", *, code: Any = None, reason: str = "", oldest: str = "") -> None:
        super().__init__(details, code=code, reason=reason)
        self.oldest = oldest


class NoOtherServerError(FailedPreconditionError):
    """Moving a space or draining a server needs another live server in the tier."""

    _reason = pb.NO_OTHER_SERVER


class ShuttingDownError(UnavailableError):
    """The server is stopping; the call may be retried (on another server, or after a restart)."""

    _reason = pb.SHUTTING_DOWN


class StoreUnavailableError(UnavailableError):
    """The server could not make a change durable, and acknowledged nothing; it may be retried."""

    _reason = pb.STORE_UNAVAILABLE


class NotOwnerError(StoreUnavailableError):
    """The server does not own the space (any more, or not yet) and could not forward the call to
    its owner: it acknowledged nothing, and may be retried (through any server of the tier).

    Attributes:
        owner: the owner's address as the server knows it (``"host:port"``), or ``""``.
    """

    _reason = pb.NOT_OWNER

    def __init__(self, details: str = "", *, code: Any = None, reason: str = "", owner: str = "") -> None:
        super().__init__(details, code=code, reason=reason)
        self.owner = owner


# The one table from gRPC status to error class (OK is not an error, so it maps to nothing).
_BY_STATUS: dict[Any, type[OutrigError]] = {
    cls.code: cls
    for cls in (
        CallCancelledError,
        UnknownStatusError,
        InvalidArgumentError,
        DeadlineExceededError,
        NotFoundError,
        AlreadyExistsError,
        PermissionDeniedError,
        ResourceExhaustedError,
        FailedPreconditionError,
        AbortedError,
        OutOfRangeError,
        UnimplementedError,
        InternalError,
        UnavailableError,
        DataLossError,
        UnauthenticatedError,
    )
}

# The domain classes, by the reason each stands for.
_BY_REASON: dict[int, type[OutrigError]] = {
    cls._reason: cls
    for cls in (
        LeaseNotFoundError,
        TransactionNotFoundError,
        QuotaExceededError,
        RoutingValueError,
        CrossPartitionError,
        DeliveryExpiredError,
        TypeConflictError,
        TransactionAbortedError,
        RequestConflictError,
        RegistrationBusyError,
        SubscriptionBusyError,
        SubscriptionNotFoundError,
        CompactedError,
        NoOtherServerError,
        ShuttingDownError,
        StoreUnavailableError,
        NotOwnerError,
    )
}

# Batch lease results carry the status as its number, so numbers lead into the same table.
_STATUS_BY_NUMBER: dict[int, Any] = {status.value[0]: status for status in grpc.StatusCode}


def error_from_status(
    code: Any, details: str, reason: int = 0, metadata: Mapping[str, str] | None = None
) -> OutrigError:
    """Return the error for a ``grpc.StatusCode``, message and ``ErrorReason`` (UnknownStatusError
    if the status is unmapped), with what the ErrorInfo's `metadata` says (NotOwnerError's
    ``owner``). A reason names a subclass of the status's class only if it is one: a reason that
    does not belong to its status is kept in ``.reason`` but picks no class."""
    cls = _BY_STATUS.get(code)
    name = pb.ErrorReason.Name(reason) if reason in pb.ErrorReason.values() and reason else ""
    if cls is None:
        return UnknownStatusError(
            details, code=code if code is not None else grpc.StatusCode.UNKNOWN, reason=name
        )
    domain = _BY_REASON.get(reason)
    if domain is not None and issubclass(domain, cls):
        cls = domain
    if cls is NotOwnerError:
        return NotOwnerError(details, reason=name, owner=(metadata or {}).get("owner", ""))
    if cls is CompactedError:
        return CompactedError(details, reason=name, oldest=(metadata or {}).get("oldest", ""))
    return cls(details, reason=name)


def error_from_code(
    number: int, details: str, reason: int = 0, metadata: Mapping[str, str] | None = None
) -> OutrigError:
    """Return the error for a gRPC status given as its number, as Mux results and batch lease
    results carry it."""
    status = _STATUS_BY_NUMBER.get(number)
    if status is None:
        return UnknownStatusError(f"status {number}: {details}")
    return error_from_status(status, details, reason, metadata)


def error_from_rpc(err: grpc.RpcError) -> OutrigError:
    """Return the error for a failed sync or asyncio gRPC call (callers ``raise ... from err``)."""
    # Both grpc.Call and grpc.aio.AioRpcError have code() and details(); a bare RpcError has neither.
    code = err.code() if callable(getattr(err, "code", None)) else None
    details = err.details() if callable(getattr(err, "details", None)) else None
    trailing = err.trailing_metadata() if callable(getattr(err, "trailing_metadata", None)) else None
    reason, metadata = error_info(_pairs(trailing))
    return error_from_status(code, details or "", reason, metadata)


def _pairs(metadata: Any) -> Iterable[tuple[str, Any]] | None:
    # grpc.aio gives a Metadata object (iterable of pairs), sync gRPC a tuple of _Metadatum.
    return None if metadata is None else [(item[0], item[1]) for item in metadata]
