"""The errors outrig raises, one class per gRPC status, under one root.

::

    OutrigError                      every error a space call raises
     ├── CallCancelledError          CANCELLED
     ├── UnknownStatusError          UNKNOWN, and any status this client does not know
     ├── InvalidArgumentError        INVALID_ARGUMENT
     ├── DeadlineExceededError       DEADLINE_EXCEEDED
     ├── NotFoundError               NOT_FOUND (for example an unknown or expired lease)
     ├── AlreadyExistsError          ALREADY_EXISTS
     ├── PermissionDeniedError       PERMISSION_DENIED
     ├── ResourceExhaustedError      RESOURCE_EXHAUSTED
     ├── FailedPreconditionError     FAILED_PRECONDITION
     ├── AbortedError                ABORTED
     ├── OutOfRangeError             OUT_OF_RANGE
     ├── UnimplementedError          UNIMPLEMENTED
     ├── InternalError               INTERNAL
     ├── UnavailableError            UNAVAILABLE
     ├── DataLossError               DATA_LOSS
     └── UnauthenticatedError        UNAUTHENTICATED

Every error keeps the gRPC status as ``.code`` (a ``grpc.StatusCode``) and the server's message as
``.details``. Values that cannot be encoded never reach the wire: they raise the builtin
``TypeError`` or ``ValueError`` instead, naming the field.

``_BY_STATUS`` is the one table from status to class; `error_from_status` is the one function that
uses it, and the gRPC boundary (``outrig._base.rpc_errors``) and batch lease results both go
through it.
"""

from __future__ import annotations

from typing import Any

import grpc

__all__ = [
    "AbortedError",
    "AlreadyExistsError",
    "CallCancelledError",
    "DataLossError",
    "DeadlineExceededError",
    "FailedPreconditionError",
    "InternalError",
    "InvalidArgumentError",
    "NotFoundError",
    "OutOfRangeError",
    "OutrigError",
    "PermissionDeniedError",
    "ResourceExhaustedError",
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
    """

    #: The status this class stands for; the table below is built from these.
    code: Any = grpc.StatusCode.UNKNOWN

    def __init__(self, details: str = "", *, code: Any = None) -> None:
        super().__init__(details)
        self.details = details
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

# Batch lease results carry the status as its number, so numbers lead into the same table.
_STATUS_BY_NUMBER: dict[int, Any] = {status.value[0]: status for status in grpc.StatusCode}


def error_from_status(code: Any, details: str) -> OutrigError:
    """Return the error for a ``grpc.StatusCode`` and message (UnknownStatusError if unmapped)."""
    cls = _BY_STATUS.get(code)
    if cls is None:
        return UnknownStatusError(details, code=code if code is not None else grpc.StatusCode.UNKNOWN)
    return cls(details)


def error_from_code(number: int, details: str) -> OutrigError:
    """Return the error for a gRPC status given as its number, as batch lease results carry it."""
    status = _STATUS_BY_NUMBER.get(number)
    if status is None:
        return UnknownStatusError(f"status {number}: {details}")
    return error_from_status(status, details)


def error_from_rpc(err: grpc.RpcError) -> OutrigError:
    """Return the error for a failed sync or asyncio gRPC call (callers ``raise ... from err``)."""
    # Both grpc.Call and grpc.aio.AioRpcError have code() and details(); a bare RpcError has neither.
    code = err.code() if callable(getattr(err, "code", None)) else None
    details = err.details() if callable(getattr(err, "details", None)) else None
    return error_from_status(code, details or "")
