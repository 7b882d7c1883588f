"""The server's protocol tables, derived from the proto's descriptors (outrig._protocol.METHODS):
what each method's handler registration, Mux operation and access rule is, pinned against the
values the tables had when they were kept by hand, so that a change of the proto that would change
them shows here."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any

import grpc
import pytest

from outrig._protocol import (
    BATCH_BYTES,
    LIMIT_KEY,
    METHODS,
    OPS_BY_FIELD,
    encode_cancel,
    encode_op,
    request_message,
)
from outrig.service.config import Limits
from outrig.service.protocol import wire
from outrig.service.security.access import ACCESS, Access
from outrig.service.transport import handlers, mux
from outrig.service.transport.servicer import SpaceServicer, unary
from outrig.v1 import space_pb2 as pb
from outrig.v1 import space_pb2_grpc

ENTRIES, TEMPLATES, SPACE, TIER = pb.Access.ENTRIES, pb.Access.TEMPLATES, pb.Access.SPACE, pb.Access.TIER

# The hand-kept tables as they were: wire._METHODS and wire._RECEIVED (method: kind, request type,
# answers with encoded bytes; requests arrive as a Received), mux.OPERATIONS (MuxOp field: method,
# request type, MuxResult field) and security/access.ACCESS (method: action, resource).
OLD_METHODS: dict[str, tuple[str, Any, bool]] = {
    "Write": ("unary", pb.WriteRequest, False),
    "WriteMany": ("unary", pb.WriteManyRequest, False),
    "Read": ("unary", pb.MatchRequest, True),
    "Take": ("unary", pb.MatchRequest, True),
    "ReadMany": ("unary", pb.MatchRequest, True),
    "TakeMany": ("unary", pb.MatchRequest, True),
    "Contents": ("stream", pb.ContentsRequest, True),
    "Count": ("unary", pb.CountRequest, False),
    "Notify": ("stream", pb.NotifyRequest, True),
    "RenewLeases": ("unary", pb.RenewLeasesRequest, False),
    "CancelLeases": ("unary", pb.CancelLeasesRequest, False),
    "Begin": ("unary", pb.BeginRequest, False),
    "Commit": ("unary", pb.EndRequest, False),
    "Abort": ("unary", pb.EndRequest, False),
    # Added with the owner design (placement): answered by the server called, on the Mux too.
    "Locate": ("unary", pb.LocateRequest, False),
    "ListSpaces": ("unary", pb.ListSpacesRequest, False),
    "MoveSpace": ("unary", pb.MoveSpaceRequest, False),
    "Drain": ("unary", pb.DrainRequest, False),
    # Added with the admin API (inspection): served by the space's owner, on the Mux too.
    "DescribeSpace": ("unary", pb.DescribeSpaceRequest, False),
    "Browse": ("unary", pb.BrowseRequest, False),
    "Purge": ("unary", pb.PurgeRequest, False),
    "CancelRegistration": ("unary", pb.LeaseIdRequest, False),
    "AbortTransaction": ("unary", pb.LeaseIdRequest, False),
    # Added with acknowledged takes (docs/work-queues.md): settled by receipt, on the Mux too.
    "Ack": ("unary", pb.AckRequest, False),
    "Nack": ("unary", pb.NackRequest, False),
    "Extend": ("unary", pb.ExtendRequest, False),
    # Added with the change log (docs/notifications.md): a stream, and its subscriptions' calls.
    "Changes": ("stream", pb.ChangesRequest, True),
    "AckChanges": ("unary", pb.AckChangesRequest, False),
    "DeleteSubscription": ("unary", pb.DeleteSubscriptionRequest, False),
}
OLD_RECEIVED = {"Write", "WriteMany"}
OLD_OPERATIONS: dict[int, tuple[str, type[Any], int]] = {
    2: ("Write", pb.WriteRequest, 2),
    3: ("WriteMany", pb.WriteManyRequest, 3),
    4: ("Read", pb.MatchRequest, 4),
    5: ("Take", pb.MatchRequest, 4),
    6: ("ReadMany", pb.MatchRequest, 4),
    7: ("TakeMany", pb.MatchRequest, 4),
    8: ("RenewLeases", pb.RenewLeasesRequest, 5),
    9: ("CancelLeases", pb.CancelLeasesRequest, 6),
    10: ("Count", pb.CountRequest, 7),
    11: ("Begin", pb.BeginRequest, 8),
    12: ("Commit", pb.EndRequest, 9),
    13: ("Abort", pb.EndRequest, 9),
    14: ("Locate", pb.LocateRequest, 10),
    16: ("ListSpaces", pb.ListSpacesRequest, 11),
    17: ("MoveSpace", pb.MoveSpaceRequest, 12),
    18: ("Drain", pb.DrainRequest, 13),
    19: ("DescribeSpace", pb.DescribeSpaceRequest, 14),
    20: ("Browse", pb.BrowseRequest, 16),
    21: ("Purge", pb.PurgeRequest, 17),
    22: ("CancelRegistration", pb.LeaseIdRequest, 9),
    23: ("AbortTransaction", pb.LeaseIdRequest, 9),
    24: ("Ack", pb.AckRequest, 18),
    25: ("Nack", pb.NackRequest, 19),
    26: ("Extend", pb.ExtendRequest, 20),
    27: ("AckChanges", pb.AckChangesRequest, 21),
    28: ("DeleteSubscription", pb.DeleteSubscriptionRequest, 22),
}
OLD_ACCESS = {
    "Write": ("write", ENTRIES),
    "WriteMany": ("write", ENTRIES),
    "Read": ("read", TEMPLATES),
    "ReadMany": ("read", TEMPLATES),
    "Take": ("take", TEMPLATES),
    "TakeMany": ("take", TEMPLATES),
    "Contents": ("read", TEMPLATES),
    "Count": ("read", TEMPLATES),
    "Notify": ("notify", TEMPLATES),
    "RenewLeases": ("renew", SPACE),
    "CancelLeases": ("cancel", SPACE),
    "Begin": ("renew", SPACE),
    "Commit": ("renew", SPACE),
    "Abort": ("cancel", SPACE),
    "Locate": ("read", SPACE),
    "ListSpaces": ("admin", TIER),
    "MoveSpace": ("admin", SPACE),
    "Drain": ("admin", TIER),
    "DescribeSpace": ("admin", SPACE),
    "Browse": ("admin", TEMPLATES),
    "Purge": ("admin", TEMPLATES),
    "CancelRegistration": ("admin", SPACE),
    "AbortTransaction": ("admin", SPACE),
    "Ack": ("take", SPACE),
    "Nack": ("take", SPACE),
    "Extend": ("take", SPACE),
    "Changes": ("notify", TEMPLATES),
    "AckChanges": ("notify", SPACE),
    "DeleteSubscription": ("notify", SPACE),
}

SPACE_SERVICE = pb.DESCRIPTOR.services_by_name["Space"]


def test_every_space_rpc_but_mux_is_a_method_with_an_access_option() -> None:
    for rpc in SPACE_SERVICE.methods:
        if rpc.name == handlers.MUX:
            assert rpc.client_streaming and rpc.server_streaming
            continue
        # protoc's .pyi types the extension as a plain FieldDescriptor (outrig._protocol reads it as Any)
        assert rpc.GetOptions().HasExtension(pb.access), rpc.name  # type: ignore[arg-type]
        assert rpc.name in METHODS
    assert [rpc.name for rpc in SPACE_SERVICE.methods] == [*METHODS, handlers.MUX]


def test_every_unary_method_has_a_mux_op_and_a_mux_result_field() -> None:
    for method in METHODS.values():
        if method.streaming:
            assert (method.op_field, method.result_field) == (None, None), method.name
        else:
            assert method.op_field is not None, method.name
            assert method.result_field is not None, method.name
    # ... and every MuxOp and MuxResult field but `cancel` and `error` is some method's.
    ops = {field.number for field in pb.MuxOp.DESCRIPTOR.oneofs_by_name["op"].fields}
    assert ops - set(OPS_BY_FIELD) == {pb.MuxOp.DESCRIPTOR.fields_by_name["cancel"].number}
    results = {field.number for field in pb.MuxResult.DESCRIPTOR.oneofs_by_name["result"].fields}
    assert results - {m.result_field for m in METHODS.values()} == {
        pb.MuxResult.DESCRIPTOR.fields_by_name["error"].number
    }


def test_the_derived_method_table_is_the_old_one() -> None:
    derived = {
        m.name: ("stream" if m.streaming else "unary", m.request, handlers.answers_encoded(m))
        for m in METHODS.values()
    }
    assert derived == OLD_METHODS
    assert {m.name for m in METHODS.values() if handlers.receives(m)} == OLD_RECEIVED


class _Server:
    """Stands in for a grpc.aio server to collect what `add_to_server` registers."""

    def __init__(self) -> None:
        self.service = ""
        self.handlers: dict[str, grpc.RpcMethodHandler] = {}

    def add_generic_rpc_handlers(self, generic: Sequence[grpc.GenericRpcHandler]) -> None:
        pass  # the same handlers as the registered ones

    def add_registered_method_handlers(self, service: str, found: dict[str, grpc.RpcMethodHandler]) -> None:
        self.service, self.handlers = service, found


async def _mux(requests: AsyncIterator[bytes], context: Any) -> None:
    pass


def _servicer() -> SpaceServicer:
    return SpaceServicer(object(), Limits())  # type: ignore[arg-type]  # no call reaches the backend


def test_handlers_registers_exactly_the_methods_and_mux() -> None:
    server = _Server()
    handlers.add_to_server(_servicer(), server, _mux)  # type: ignore[arg-type]
    assert server.service == "outrig.v1.Space"
    assert set(server.handlers) == {*METHODS, "Mux"}
    mux_handler = server.handlers["Mux"]
    assert mux_handler.request_streaming and mux_handler.response_streaming
    assert mux_handler.request_deserializer is not None
    assert mux_handler.request_deserializer(b"\x0a\x00") == b"\x0a\x00"  # bytes both ways
    for name, (kind, request_type, encoded) in OLD_METHODS.items():
        handler = server.handlers[name]
        assert not handler.request_streaming
        assert handler.response_streaming == (kind == "stream")
        assert handler.request_deserializer is not None and handler.response_serializer is not None
        sample = (
            request_type(space="s") if "space" in request_type.DESCRIPTOR.fields_by_name else request_type()
        )
        request = handler.request_deserializer(sample.SerializeToString())
        if name in OLD_RECEIVED:
            assert isinstance(request, handlers.Received) and isinstance(request.message, request_type)
        else:
            assert isinstance(request, request_type)
        if encoded:
            assert handler.response_serializer(b"\x0a\x00") == b"\x0a\x00"
        else:
            assert handler.response_serializer(METHODS[name].reply()) == b""


def test_a_method_the_servicer_does_not_serve_is_refused_at_registration() -> None:
    class WithoutCount(SpaceServicer):
        Count = space_pb2_grpc.SpaceServicer.Count  # type: ignore[assignment]  # the generated stub: UNIMPLEMENTED

    with pytest.raises(AssertionError, match=r"WithoutCount has no handler for /outrig.v1.Space/Count"):
        handlers.add_to_server(WithoutCount(object(), Limits()), _Server(), _mux)  # type: ignore[arg-type]

    class NotifyAnswersOnce(SpaceServicer):
        async def Notify(self, request: Any, context: Any) -> None:  # type: ignore[override]  # noqa: N802  # not a stream
            pass

    with pytest.raises(AssertionError, match=r"Notify \(an async generator method Notify\)"):
        handlers.add_to_server(NotifyAnswersOnce(object(), Limits()), _Server(), _mux)  # type: ignore[arg-type]


def test_a_servicer_method_the_proto_does_not_declare_is_refused() -> None:
    with pytest.raises(AssertionError, match="Sing: no entry"):

        @unary
        async def Sing(self: Any, request: Any, context: Any) -> None:  # noqa: N802
            pass


def test_the_derived_mux_operations_are_the_old_ones() -> None:
    assert {f: (op.name, op.request, op.result_field) for f, op in mux.OPERATIONS.items()} == OLD_OPERATIONS
    for field, (name, request_type, _) in OLD_OPERATIONS.items():
        if "space" not in request_type.DESCRIPTOR.fields_by_name:  # ListSpaces: about every space
            assert isinstance(mux.OPERATIONS[field].decode(memoryview(b"")), request_type)
            continue
        decoded = mux.OPERATIONS[field].decode(memoryview(request_type(space="s").SerializeToString()))
        if name in OLD_RECEIVED:
            assert isinstance(decoded, handlers.Received) and decoded.message.space == "s"
        else:
            assert isinstance(decoded, request_type) and decoded.space == "s"


def test_the_mux_vocabulary_is_the_old_one() -> None:
    assert LIMIT_KEY == "outrig-max-stream-ops"
    assert BATCH_BYTES == 3 * 1024 * 1024
    # What mux.py wrote with literal tags: MuxResult.id 0x08, a reply field (number << 3 | 2),
    # MuxResult.error 0x7a; MuxError code 0x08, message 0x12, reason 0x18; MuxReply.results 0x0a.
    result = mux.Result(300, 4, b"xy")
    assert result.head + result.body == b"\x08\xac\x02" + b"\x22\x02" + b"xy"
    error = mux.error_result(7, grpc.StatusCode.NOT_FOUND, "gone", pb.LEASE_NOT_FOUND)
    assert error.head + error.body == b"\x08\x07\x7a\x0a" + b"\x08\x05\x12\x04gone\x18\x02"
    reply = mux.reply_message([result, error])
    assert reply.startswith(b"\x0a" + bytes((result.size,)) + result.head)
    decoded = pb.MuxReply.FromString(reply)
    assert decoded.results[0].id == 300 and decoded.results[0].WhichOneof("result") == "match"
    assert (decoded.results[1].error.code, decoded.results[1].error.message) == (5, "gone")
    assert decoded.results[1].error.reason == pb.LEASE_NOT_FOUND
    # MuxError.metadata 0x22, a map entry: key 0x0a, value 0x12 (NOT_OWNER's owner).
    owned = mux.error_result(8, grpc.StatusCode.UNAVAILABLE, "moved", pb.NOT_OWNER, {"owner": "h:1"})
    assert owned.body.endswith(b"\x18\x0d\x22\x0c\x0a\x05owner\x12\x03h:1")
    error_message = pb.MuxReply.FromString(mux.reply_message([owned])).results[0].error
    assert (error_message.reason, dict(error_message.metadata)) == (pb.NOT_OWNER, {"owner": "h:1"})
    # MuxRequest.ops 0x0a, MuxOp.id 0x08, MuxOp.cancel 15, read as the SDK writes them.
    take = pb.MatchRequest(space="s").SerializeToString()
    raw = request_message([encode_op(3, 5, take), encode_cancel(3)])
    assert raw.startswith(b"\x0a")
    assert [(i, f, bytes(v) if isinstance(v, memoryview) else v) for i, f, v in mux.parse_request(raw)] == [
        (3, 5, take),
        (3, 15, 1),
    ]


def test_the_wire_tags_are_the_old_ones() -> None:
    # MatchReply.entries 0x0a (a payload's frame); NotifyReply.sequence 0x10, entry 0x1a.
    assert wire.frame(b"ab") == b"\x0a\x02ab"
    assert wire.event_reply(9, wire.frame(b"ab")) == b"\x10\x09\x1a\x02ab"
    assert wire.ENTRY_FIELD == 2  # WriteRequest.entry, WriteManyRequest.entries
    # Entry.fields 3 (map items: key 1, value 2), Value.array_value 7, TypedArray.data 2.
    assert (wire._ENTRY_FIELDS, wire._MAP_KEY, wire._MAP_VALUE) == (3, 1, 2)
    assert wire._ARRAY_DATA_PATH == (3, 2, 7, 2)


def _sample(request_type: Any) -> Any:
    """A request of `request_type` in space "s": entries of type T (a subtype of S), templates of T."""
    entry = pb.Entry(type_name="T", supertypes=["S"])
    if request_type is pb.WriteRequest:
        return handlers.Received(pb.WriteRequest(space="s", entry=entry), b"")
    if request_type is pb.WriteManyRequest:
        return handlers.Received(pb.WriteManyRequest(space="s", entries=[entry, entry]), b"")
    if "templates" in request_type.DESCRIPTOR.fields_by_name:
        return request_type(space="s", templates=[pb.Template(type_name="T")])
    if "space" not in request_type.DESCRIPTOR.fields_by_name:
        return request_type()
    return request_type(space="s")


def test_access_covers_exactly_the_methods_as_the_old_table_did() -> None:
    assert set(ACCESS) == set(METHODS) == set(OLD_ACCESS)
    types = {ENTRIES: ("T", "S"), TEMPLATES: ("T",), SPACE: (None,), TIER: (None,)}
    for name, (action, resource) in OLD_ACCESS.items():
        assert (METHODS[name].action, METHODS[name].resource) == (action, resource)
        space = "*" if resource == TIER else "s"  # TIER: every space, outrig://*
        assert ACCESS[name](_sample(METHODS[name].request), Limits()) == Access(
            action, space, types[resource]
        )
    # A notify registration resumed by its id is checked against the space itself.
    resumed = pb.NotifyRequest(space="s", templates=[pb.Template(type_name="T")], resume=7)
    assert ACCESS["Notify"](resumed, Limits()) == Access("notify", "s", (None,))
    # A write without its entry, and a match without templates, name the space itself.
    assert ACCESS["Write"](handlers.Received(pb.WriteRequest(space="s"), b""), Limits()) == Access(
        "write", "s", (None,)
    )
    assert ACCESS["Take"](pb.MatchRequest(space="s"), Limits()) == Access("take", "s", (None,))
