"""What the sync and asyncio Mux clients share: the messages of a Mux stream, and its errors.

A connection sends its operations over one `Mux` stream (see proto/outrig/v1/space.proto): each
as a `MuxOp` (an id and the request of the unary method it stands for), several together in one
`MuxRequest` when several are waiting to be sent. The ops are encoded around the requests' bytes
by hand (a tag, a length), so a request is serialized once, as for a unary call.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

import grpc

from outrig._exceptions import (
    CallCancelledError,
    OutrigError,
    UnavailableError,
    error_from_code,
    error_from_rpc,
)
from outrig._protocol import (
    BATCH_BYTES,
    BATCH_OPS,
    DEFAULT_LIMIT,
    LIMIT_KEY,
    METHODS,
    MUX_METHOD,
    OPS_BY_FIELD,
)
from outrig.v1 import space_pb2 as pb

#: The unary methods a Mux stream carries, and their MuxOp field numbers.
OP_FIELDS: Final = {method.name: field for field, method in OPS_BY_FIELD.items()}
#: The reply type of each method a stream carries, for a request sent as a unary call instead.
REPLY_TYPES: Final[dict[str, Any]] = {name: METHODS[name].reply for name in OP_FIELDS}

#: Statuses with which a broken stream fails its operations as they are, because retrying would
#: fail the same way; every other way a stream ends fails them with UNAVAILABLE, to be retried.
_FINAL = frozenset(
    {
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.UNAUTHENTICATED,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.UNIMPLEMENTED,
    }
)


def closed() -> OutrigError:
    """The error of a call on a connection that has been closed."""
    return CallCancelledError("the connection is closed")


def batch_length(ops: Sequence[bytes]) -> int:
    """How many of the encoded ops queued, from the first, go in the next MuxRequest: up to
    BATCH_OPS and BATCH_BYTES, and at least one (an op that does not fit goes first in the next)."""
    size = 0
    for count, op in enumerate(ops):
        size += len(op)
        if count and (count == BATCH_OPS or size > BATCH_BYTES):
            return count
    return len(ops)


def callables(channel: Any) -> tuple[Any, dict[str, Any]]:
    """A sync or asyncio channel's Mux method, and its unary methods that a stream carries, all
    taking requests already encoded (a request is serialized once, whichever way it goes)."""
    stream = channel.stream_stream(
        MUX_METHOD, request_serializer=None, response_deserializer=pb.MuxReply.FromString
    )
    unary = {
        name: channel.unary_unary(
            METHODS[name].path, request_serializer=None, response_deserializer=reply.FromString
        )
        for name, reply in REPLY_TYPES.items()
    }
    return stream, unary


def outcome(result: pb.MuxResult) -> Any:
    """The reply a MuxResult carries; its error raised as the unary call would have raised it."""
    kind = result.WhichOneof("result")
    if kind == "error":
        error = result.error
        raise error_from_code(error.code, error.message, error.reason, dict(error.metadata))
    if kind is None:
        raise UnavailableError(f"the server sent an empty result for operation {result.id}")
    return getattr(result, kind)


def limit_of(metadata: Any) -> int:
    """The server's limit of operations in flight, from a stream's initial metadata."""
    for key, value in metadata or ():
        if key == LIMIT_KEY:
            try:
                return max(1, int(value))
            except ValueError:
                break
    return DEFAULT_LIMIT


def stream_error(err: BaseException) -> OutrigError:
    """The error for the operations in flight on a stream that ended with `err` (a fresh one for
    each operation: one exception raised in several threads would share its traceback)."""
    if isinstance(err, OutrigError):
        return type(err)(err.details)
    if isinstance(err, grpc.RpcError):
        converted = error_from_rpc(err)
        if converted.code in _FINAL:
            return converted
        return UnavailableError(f"the operation's stream ended: {converted.code.name}: {converted.details}")
    return UnavailableError(f"the operation's stream ended: {err!r}")


def unsupported(err: BaseException) -> bool:
    """Whether a stream ended because the server has no Mux method (an older server)."""
    return isinstance(err, grpc.RpcError) and error_from_rpc(err).code == grpc.StatusCode.UNIMPLEMENTED
