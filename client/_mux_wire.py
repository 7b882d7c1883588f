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

from outrig._exceptions import OutrigError, UnavailableError, error_from_code, error_from_rpc
from outrig.v1 import space_pb2 as pb

#: The method path of the stream.
MUX_METHOD: Final = "/outrig.v1.Space/Mux"
#: The initial metadata key with the server's limit of operations in flight per stream.
LIMIT_KEY: Final = "outrig-max-stream-ops"
#: The limit assumed until the server has said its own (its default).
DEFAULT_LIMIT: Final = 1024
#: A request larger than this goes as a unary call of its own: on the stream, its transfer would
#: hold up the small operations queued behind it.
MAX_STREAM_REQUEST: Final = 1024 * 1024

#: A MuxRequest carries several ops only up to this size, below gRPC's default limit of 4 MiB
#: on what a server receives (an op is at most MAX_STREAM_REQUEST).
BATCH_BYTES: Final = 3 * 1024 * 1024
#: Ops per MuxRequest at most.
BATCH_OPS: Final = 256

#: The unary methods a Mux stream carries, and their MuxOp field numbers.
OP_FIELDS: Final = {
    "Write": 2, "WriteMany": 3, "Read": 4, "Take": 5, "ReadMany": 6, "TakeMany": 7,
    "RenewLeases": 8, "CancelLeases": 9, "Count": 10, "Begin": 11, "Commit": 12, "Abort": 13,
}  # fmt: skip
_CANCEL = b"\x78\x01"  # MuxOp.cancel = true (field 15, varint)

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


def _varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def callables(channel: Any) -> tuple[Any, dict[str, Any]]:
    """A sync or asyncio channel's Mux method, and its unary methods that a stream carries, all
    taking requests already encoded (a request is serialized once, whichever way it goes)."""
    stream = channel.stream_stream(
        MUX_METHOD, request_serializer=None, response_deserializer=pb.MuxReply.FromString
    )
    unary = {
        name: channel.unary_unary(
            f"/outrig.v1.Space/{name}", request_serializer=None, response_deserializer=reply.FromString
        )
        for name, reply in REPLY_TYPES.items()
    }
    return stream, unary


def encode_op(op_id: int, field: int, request: bytes) -> bytes:
    """A MuxOp carrying an encoded request as its `field`."""
    return b"".join((b"\x08", _varint(op_id), bytes(((field << 3) | 2,)), _varint(len(request)), request))


def encode_cancel(op_id: int) -> bytes:
    """A MuxOp that abandons the operation `op_id`."""
    return b"\x08" + _varint(op_id) + _CANCEL


def request_message(ops: Sequence[bytes]) -> bytes:
    """A MuxRequest carrying encoded MuxOps."""
    parts: list[bytes] = []
    for op in ops:
        parts += (b"\x0a", _varint(len(op)), op)
    return b"".join(parts)


def outcome(result: pb.MuxResult) -> Any:
    """The reply a MuxResult carries; its error raised as the unary call would have raised it."""
    kind = result.WhichOneof("result")
    if kind == "error":
        raise error_from_code(result.error.code, result.error.message)
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


#: The reply type of each method a stream carries, for a request sent as a unary call instead.
REPLY_TYPES: Final[dict[str, Any]] = {
    "Write": pb.WriteReply, "WriteMany": pb.WriteManyReply, "Read": pb.MatchReply, "Take": pb.MatchReply,
    "ReadMany": pb.MatchReply, "TakeMany": pb.MatchReply, "RenewLeases": pb.RenewLeasesReply,
    "CancelLeases": pb.CancelLeasesReply, "Count": pb.CountReply, "Begin": pb.BeginReply,
    "Commit": pb.EndReply, "Abort": pb.EndReply,
}  # fmt: skip
