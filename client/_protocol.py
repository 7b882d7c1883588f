"""The protocol's vocabulary, shared by the SDK and the server: which methods there are, how a Mux
stream frames them, and how an error carries its reason.

Everything here is derived from the generated descriptors of proto/outrig/v1/space.proto, the one
source of the protocol: a method is listed because the `Space` service declares it, is carried by
a Mux stream because `MuxOp` has a field for it, and is checked against the grant policy as its
`(outrig.v1.access)` option says. A new RPC is therefore added in the proto and in one server
handler, and nowhere else.

A Mux stream's messages are encoded around the requests' and replies' bytes by hand (a tag and a
length in front), so that a request or a reply is serialized once, as for a unary call; the field
numbers and tags for that are here too, read from the descriptors.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from google.protobuf.message import DecodeError
from google.rpc import error_details_pb2, status_pb2

from outrig.v1 import space_pb2 as pb

__all__ = [
    "BATCH_BYTES",
    "BATCH_OPS",
    "CHANGE_KIND_NUMBERS",
    "DEFAULT_LIMIT",
    "DETAILS_KEY",
    "DIRECT_KEY",
    "LIMIT_KEY",
    "MAX_STREAM_REQUEST",
    "METHODS",
    "MUX_METHOD",
    "OPS_BY_FIELD",
    "REASON_DOMAIN",
    "SERVICE",
    "Method",
    "encode_cancel",
    "encode_op",
    "error_info",
    "reason_in",
    "request_message",
    "status_details",
    "tag",
    "varint",
]

#: The change log's kinds of change (docs/notifications.md) by name, as the wire numbers them.
CHANGE_KIND_NUMBERS: Final[dict[str, int]] = {
    "write": pb.CHANGE_KIND_WRITE,
    "take": pb.CHANGE_KIND_TAKE,
    "expire": pb.CHANGE_KIND_EXPIRE,
    "cancel": pb.CHANGE_KIND_CANCEL,
    "purge": pb.CHANGE_KIND_PURGE,
    "dead": pb.CHANGE_KIND_DEAD,
}

#: The full name of the service.
SERVICE: Final = pb.DESCRIPTOR.services_by_name["Space"].full_name
#: The method path of the Mux stream.
MUX_METHOD: Final = f"/{SERVICE}/Mux"
#: The initial metadata key with the server's limit of operations in flight per Mux stream.
LIMIT_KEY: Final = "outrig-max-stream-ops"
#: The limit of operations in flight per stream, unless a server is configured otherwise (and
#: what a client assumes until the server has said its own).
DEFAULT_LIMIT: Final = 1024
#: A request larger than this goes as a unary call of its own: on the stream, its transfer would
#: hold up the small operations queued behind it.
MAX_STREAM_REQUEST: Final = 1024 * 1024
#: A MuxRequest or MuxReply carries several ops or results only up to this size, below gRPC's
#: default limit of 4 MiB on what a peer receives: a peer whose limit is lower than ours then gets
#: each large one in a message of its own, as it would get a unary call.
BATCH_BYTES: Final = 3 * 1024 * 1024
#: Ops per MuxRequest at most.
BATCH_OPS: Final = 256

#: The `domain` of the google.rpc.ErrorInfo that carries an error's reason.
REASON_DOMAIN: Final = "outrig.v1"
#: The trailing metadata key of a google.rpc.Status (gRPC's own convention).
DETAILS_KEY: Final = "grpc-status-details-bin"
#: The metadata the SDK sends on the calls it routes to a space's owner itself: a server that does
#: not serve the space then answers UNAVAILABLE/NOT_OWNER naming the owner (a redirect) instead of
#: forwarding the call, so the SDK learns where the space went instead of paying a hop per call.
DIRECT_KEY: Final = "outrig-direct"

_VARINT, _LENGTH_DELIMITED = 0, 2


def varint(value: int) -> bytes:
    """`value` (>= 0) as a protobuf varint."""
    if value < 0x80:
        return bytes((value,))
    if value < 0x4000:  # two bytes: a Mux op's id, a small reply's length
        return bytes((value & 0x7F | 0x80, value >> 7))
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def tag(field: Any) -> bytes:
    """The tag that starts `field` in an encoded message."""
    kind = (
        _LENGTH_DELIMITED
        if field.type in (field.TYPE_MESSAGE, field.TYPE_BYTES, field.TYPE_STRING)
        else _VARINT
    )
    return varint((field.number << 3) | kind)


@dataclass(frozen=True, slots=True)
class Method:
    """One method of outrig.v1.Space, as its descriptor declares it.

    Attributes:
        name: as in the service ("TakeMany").
        path: the gRPC method path ("/outrig.v1.Space/TakeMany").
        request: its request message class.
        reply: its reply message class (of each message, for a streaming method).
        streaming: whether the server answers with a stream.
        op_field: the `MuxOp` field that carries its request on a Mux stream; None if no Mux
            stream carries it.
        result_field: the `MuxResult` field that carries its reply; None likewise.
        action: the policy action a call needs (its `(outrig.v1.access)` option).
        resource: what the call's resource is made of (an `Access.Resource` value).
    """

    name: str
    path: str
    request: Any
    reply: Any
    streaming: bool
    op_field: int | None
    result_field: int | None
    action: str
    resource: int


def _message_class(descriptor: Any) -> Any:
    if descriptor.file is not pb.DESCRIPTOR:
        raise AssertionError(f"{descriptor.full_name}: not a message of outrig/v1/space.proto")
    return getattr(pb, descriptor.name)


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def _methods() -> dict[str, Method]:
    ops = {field.name: field for field in pb.MuxOp.DESCRIPTOR.oneofs_by_name["op"].fields}
    results: dict[str, Any] = {}
    for field in pb.MuxResult.DESCRIPTOR.oneofs_by_name["result"].fields:
        if field.message_type is not None:
            results.setdefault(field.message_type.full_name, field)
    methods: dict[str, Method] = {}
    for method in pb.DESCRIPTOR.services_by_name["Space"].methods:
        if method.client_streaming:  # the Mux stream itself
            continue
        methods[method.name] = _method(method, ops.get(_snake(method.name)), results)
    return methods


def _method(method: Any, op: Any, results: dict[str, Any]) -> Method:
    """The Method a descriptor declares (`op`: its MuxOp field, if any)."""
    options: Any = method.GetOptions()
    if not options.HasExtension(pb.access):
        raise AssertionError(f"{method.full_name}: declares no (outrig.v1.access) option")
    access = options.Extensions[pb.access]
    result = results.get(method.output_type.full_name) if op is not None else None
    if op is not None and (op.message_type is not method.input_type or result is None):
        raise AssertionError(f"MuxOp.{op.name}: does not match {method.full_name}'s request and reply")
    return Method(
        name=method.name,
        path=f"/{SERVICE}/{method.name}",
        request=_message_class(method.input_type),
        reply=_message_class(method.output_type),
        streaming=method.server_streaming,
        op_field=None if op is None else op.number,
        result_field=None if result is None else result.number,
        action=access.action,
        resource=access.resource,
    )


#: Every method but Mux, by name, in the order the service declares them.
METHODS: Final = _methods()
#: The methods a Mux stream carries, by their MuxOp field.
OPS_BY_FIELD: Final = {m.op_field: m for m in METHODS.values() if m.op_field is not None}

_OP_ID = tag(pb.MuxOp.DESCRIPTOR.fields_by_name["id"])
_CANCEL = tag(pb.MuxOp.DESCRIPTOR.fields_by_name["cancel"]) + varint(1)
_OPS = tag(pb.MuxRequest.DESCRIPTOR.fields_by_name["ops"])
_OP_TAGS: Final = {
    field: varint((field << 3) | _LENGTH_DELIMITED) for field in OPS_BY_FIELD
}  # a request field of MuxOp


def encode_op(op_id: int, field: int, request: bytes) -> bytes:
    """A MuxOp carrying an encoded request as its `field`."""
    return b"".join((_OP_ID, varint(op_id), _OP_TAGS[field], varint(len(request)), request))


def encode_cancel(op_id: int) -> bytes:
    """A MuxOp that abandons the operation `op_id`."""
    return _OP_ID + varint(op_id) + _CANCEL


def request_message(ops: Sequence[bytes]) -> bytes:
    """A MuxRequest carrying encoded MuxOps."""
    parts: list[bytes] = []
    for op in ops:
        parts += (_OPS, varint(len(op)), op)
    return b"".join(parts)


def status_details(code: int, message: str, reason: int, metadata: Mapping[str, str] | None = None) -> bytes:
    """The google.rpc.Status (for the `grpc-status-details-bin` trailer) of a call that failed
    with status `code`, `message` and an `ErrorReason`, and the ErrorInfo's `metadata` (NOT_OWNER
    names the owner's address under "owner")."""
    status = status_pb2.Status(code=code, message=message)
    status.details.add().Pack(
        error_details_pb2.ErrorInfo(
            reason=pb.ErrorReason.Name(reason), domain=REASON_DOMAIN, metadata=dict(metadata or {})
        )
    )
    encoded: bytes = status.SerializeToString()
    return encoded


def error_info(metadata: Iterable[tuple[str, Any]] | None) -> tuple[int, dict[str, str]]:
    """The `ErrorReason` a failed call's trailing metadata carries, and its ErrorInfo's metadata;
    (0, {}) if none, and reason 0 (unspecified) for one this client does not know."""
    for key, value in metadata or ():
        if key != DETAILS_KEY or not isinstance(value, bytes):
            continue
        try:
            status = status_pb2.Status.FromString(value)
        except DecodeError:  # a peer's bytes: anything unreadable is no reason
            return 0, {}
        for detail in status.details:
            info = error_details_pb2.ErrorInfo()
            if detail.Unpack(info) and info.domain == REASON_DOMAIN:
                known = pb.ErrorReason.DESCRIPTOR.values_by_name.get(info.reason)
                return (0 if known is None else known.number), dict(info.metadata)
    return 0, {}


def reason_in(metadata: Iterable[tuple[str, Any]] | None) -> int:
    """The `ErrorReason` a failed call's trailing metadata carries; 0 (unspecified) if none, or
    one this client does not know."""
    return error_info(metadata)[0]
