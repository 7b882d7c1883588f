"""Requests whose bytes are not what they claim to be (issue 17, sections 3 and 4), against a real
server through raw channels: each is refused INVALID_ARGUMENT with a short message naming what
could not be parsed, the same on a unary call and on the Mux stream, and logged a line at a time.
"""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest

from outrig._protocol import varint
from outrig.v1 import space_pb2 as pb

from ..conftest import ServerProcess, start_server

# method: (request type, server-streaming)
METHODS: dict[str, tuple[str, bool]] = {
    "Write": ("WriteRequest", False),
    "WriteMany": ("WriteManyRequest", False),
    "Read": ("MatchRequest", False),
    "Take": ("MatchRequest", False),
    "ReadMany": ("MatchRequest", False),
    "TakeMany": ("MatchRequest", False),
    "Contents": ("ContentsRequest", True),
    "Count": ("CountRequest", False),
    "Notify": ("NotifyRequest", True),
    "RenewLeases": ("RenewLeasesRequest", False),
    "CancelLeases": ("CancelLeasesRequest", False),
    "Begin": ("BeginRequest", False),
    "Commit": ("EndRequest", False),
    "Abort": ("EndRequest", False),
}

#: MuxOp's field for each operation (proto/outrig/v1/space.proto).
OP_FIELDS = {
    "Write": 2, "WriteMany": 3, "Read": 4, "Take": 5, "ReadMany": 6, "TakeMany": 7,
    "RenewLeases": 8, "CancelLeases": 9, "Count": 10, "Begin": 11, "Commit": 12, "Abort": 13,
}  # fmt: skip

#: The status message's bound (service/transport/servicer.py MAX_STATUS_MESSAGE).
MESSAGE_BOUND = 1024


@pytest.fixture
def channel(server: ServerProcess) -> Iterator[grpc.Channel]:
    # gRPC's default limits, as a client has them (8 KiB of metadata among them).
    with grpc.insecure_channel(server.address) as opened:
        yield opened


def call(
    channel: grpc.Channel, method: str, raw: bytes, timeout: float = 10.0
) -> tuple[grpc.StatusCode, str]:
    """The status a raw call ends with (OK for a unary call that returns, or a stream that ends)."""
    path = f"/outrig.v1.Space/{method}"
    try:
        if METHODS[method][1]:
            stream: grpc.UnaryStreamMultiCallable[bytes, bytes] = channel.unary_stream(path)
            for _ in stream(raw, timeout=timeout):
                pass
        else:
            unary: grpc.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(path)
            unary(raw, timeout=timeout)
    except grpc.RpcError as err:
        return err.code(), err.details() or ""
    return grpc.StatusCode.OK, ""


def mux_result(channel: grpc.Channel, method: str, raw: bytes) -> tuple[grpc.StatusCode, str]:
    """The status of `raw` sent as one op of a Mux stream (the stream's own, if it ends it)."""
    stream: grpc.StreamStreamMultiCallable[bytes, pb.MuxReply] = channel.stream_stream(
        "/outrig.v1.Space/Mux", response_deserializer=pb.MuxReply.FromString
    )
    message = mux_request(1, OP_FIELDS[method], raw)
    try:
        (result,) = next(iter(stream(iter([message]), timeout=10.0))).results
    except grpc.RpcError as err:
        return err.code(), err.details() or ""
    if result.WhichOneof("result") != "error":
        return grpc.StatusCode.OK, ""
    code = next(code for code in grpc.StatusCode if code.value[0] == result.error.code)
    return code, result.error.message


def mux_request(op_id: int, field: int, raw: bytes) -> bytes:
    """A MuxRequest of one MuxOp{id, field: raw}, framed by hand around bytes that may be no
    protobuf at all."""
    return _field(1, _tag(1, 0) + varint(op_id) + _field(field, raw))


def _tag(field: int, kind: int) -> bytes:
    return varint((field << 3) | kind)


def _field(number: int, content: bytes) -> bytes:
    return _tag(number, 2) + varint(len(content)) + content


def nested(depth: int, kind: str) -> bytes:
    """An encoded Value of lists (or maps) nested `depth` deep around an int, built by hand:
    protobuf's own objects cannot hold what its parser refuses."""
    value = pb.Value(int_value=1).SerializeToString()
    for _ in range(depth):
        if kind == "list":
            value = _field(8, _field(1, value))  # Value.list_value{items}
        else:
            value = _field(9, _field(1, _field(1, b"k") + _field(2, value)))  # map_value{items{k, v}}
    return value


def deep_request(method: str, depth: int, kind: str) -> bytes:
    """A request to `method` whose entry or template has a field nested `depth` deep."""
    fields = _field(1, b"deep") + _field(2, nested(depth, kind))  # a map entry: key, value
    space = _field(1, b"s")
    if method in ("Write", "WriteMany"):
        return space + _field(2, _field(1, b"test.Thing") + _field(3, fields))  # entry/entries
    return space + _field(2, _field(1, b"test.Thing") + _field(2, fields))  # templates


# ---------------------------------------------------------------- section 3: undecodable bytes


@pytest.mark.parametrize("method", list(METHODS))
def test_bytes_that_are_no_protobuf_are_refused_invalid_argument(channel: grpc.Channel, method: str) -> None:
    code, details = call(channel, method, b"\xff\xff\xff")
    assert code == grpc.StatusCode.INVALID_ARGUMENT, details
    assert details.startswith("request: ")
    assert f"not a valid outrig.v1.{METHODS[method][0]}" in details


@pytest.mark.parametrize("method", ["Write", "Count", "Contents", "Notify"])
def test_invalid_utf8_in_a_string_is_refused_invalid_argument(channel: grpc.Channel, method: str) -> None:
    code, details = call(channel, method, _field(1, b"sp\xff\xfeace"))  # space
    assert code == grpc.StatusCode.INVALID_ARGUMENT, details
    assert "UTF-8" in details


@pytest.mark.parametrize("method", ["Write", "Read", "Contents", "Notify", "Begin"])
def test_a_length_past_the_end_is_refused_invalid_argument(channel: grpc.Channel, method: str) -> None:
    code, details = call(channel, method, b"\x0a\x05ab")
    assert code == grpc.StatusCode.INVALID_ARGUMENT, details
    assert f"not a valid outrig.v1.{METHODS[method][0]}" in details


@pytest.mark.parametrize("method", ["Write", "WriteMany", "Read", "Count", "Contents", "Notify"])
@pytest.mark.parametrize(("kind", "depth"), [("list", 60), ("map", 40), ("list", 500)])
def test_nesting_past_protobufs_parse_limit_names_max_depth(
    channel: grpc.Channel, method: str, kind: str, depth: int
) -> None:
    code, details = call(channel, method, deep_request(method, depth, kind))
    assert code == grpc.StatusCode.INVALID_ARGUMENT, details
    assert "max_depth=32" in details


def test_nesting_within_protobufs_parse_limit_still_gets_the_max_depth_refusal(channel: grpc.Channel) -> None:
    code, details = call(channel, "Write", deep_request("Write", 40, "list"))
    assert (code, "max_depth=32" in details) == (grpc.StatusCode.INVALID_ARGUMENT, True)
    assert "entry.fields['deep']" in details  # this one protobuf parsed: the path is known


@pytest.mark.parametrize(
    ("method", "raw"),
    [
        ("Write", b"\xff\xff\xff"),
        ("Count", _field(1, b"\xff")),
        ("Read", b"\x0a\x05ab"),
        ("Write", deep_request("Write", 60, "list")),
        ("Take", deep_request("Take", 40, "map")),
        ("WriteMany", b"\x12\xa0\x8d\x06" + b"x" * 70_000),  # an entry 100,000 bytes long, past the end
    ],
)
def test_the_mux_stream_gives_the_answer_of_the_unary_call(
    channel: grpc.Channel, method: str, raw: bytes
) -> None:
    unary = call(channel, method, raw)
    assert unary[0] == grpc.StatusCode.INVALID_ARGUMENT
    assert mux_result(channel, method, raw) == unary


@pytest.mark.parametrize(
    "raw",
    [
        b"\x0a\x01s\x12\xa0\x8d\x06" + b"x" * 70_000,  # entry: 100,000 bytes long, past the end
        b"\x0a\x01s" + _field(2, b"\x1a" + b"\xff" * 70_000),  # an entry's field: a varint with no end
        # a field's value: a length past the end of its field
        b"\x0a\x01s" + _field(2, _field(1, b"T") + _field(3, b"\x0a\x01a\x12\x90\xa1\x0f" + b"x" * 70_000)),
    ],
)
@pytest.mark.parametrize("method", ["Write", "WriteMany"])
def test_a_large_malformed_write_is_refused_invalid_argument(
    channel: grpc.Channel, method: str, raw: bytes
) -> None:
    code, details = call(channel, method, raw)
    assert code == grpc.StatusCode.INVALID_ARGUMENT, details
    assert f"not a valid outrig.v1.{METHODS[method][0]}" in details


def test_a_write_with_a_group_protobuf_skips_is_refused_invalid_argument(
    channel: grpc.Channel, space_name: str
) -> None:
    """Protobuf keeps an unknown group as an unknown field; the server's own reading of a write's
    tags does not, and outrig's protocol has no groups."""
    valid = pb.WriteRequest(space=space_name, entry=pb.Entry(type_name="test.Thing")).SerializeToString()
    code, details = call(channel, "Write", valid + _tag(9, 3) + _tag(9, 4))
    assert code == grpc.StatusCode.INVALID_ARGUMENT, details
    assert "not a valid outrig.v1.WriteRequest" in details
    assert mux_result(channel, "Write", valid + _tag(9, 3) + _tag(9, 4)) == (code, details)


def test_a_varint_that_never_ends_is_refused_at_once(channel: grpc.Channel) -> None:
    """Reading a varint of n bytes as a number costs n squared: 2 MB of them took minutes of the
    event loop. A varint is at most 10 bytes."""
    stream: grpc.StreamStreamMultiCallable[bytes, bytes] = channel.stream_stream("/outrig.v1.Space/Mux")
    with pytest.raises(grpc.RpcError) as raised:
        next(iter(stream(iter([b"\x0a" + b"\xff" * 2_000_000 + b"\x01"]), timeout=10.0)))
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "varint" in (raised.value.details() or "")
    raw = b"\x0a\x01s" + b"\x12" + b"\xff" * 2_000_000 + b"\x01"
    assert call(channel, "Write", raw)[0] == grpc.StatusCode.INVALID_ARGUMENT


def test_undecodable_requests_are_logged_a_line_at_a_time() -> None:
    running = start_server("--in-memory")
    try:
        with grpc.insecure_channel(running.address) as opened:
            for _ in range(50):
                for method in ("Write", "Contents"):
                    assert call(opened, method, b"\xff\xff\xff")[0] == grpc.StatusCode.INVALID_ARGUMENT
                assert mux_result(opened, "Take", b"\xff")[0] == grpc.StatusCode.INVALID_ARGUMENT
    finally:
        assert running.stop() == 0
    log = running.log.read_text()
    assert "Traceback" not in log
    lines = [line for line in log.splitlines() if "undecodable" in line]
    assert len(lines) == 3, lines  # one per method, within the interval
    assert all(len(line) < 400 for line in lines)


# ---------------------------------------------------------------- section 4: long client text


def test_a_refusal_quotes_a_prefix_of_a_long_field_name(channel: grpc.Channel, space_name: str) -> None:
    name = "a" * 100_000
    request = pb.WriteRequest(
        space=space_name, entry=pb.Entry(type_name="test.Thing", fields={name: pb.Value()})
    )
    code, details = call(channel, "Write", request.SerializeToString())
    assert code == grpc.StatusCode.INVALID_ARGUMENT, details  # not RESOURCE_EXHAUSTED: it fits the metadata
    assert len(details.encode()) <= MESSAGE_BOUND
    assert "'" + "a" * 64 + "…' (100000 characters)" in details
    assert "max_name_length=256" in details


def test_a_refusal_quotes_a_prefix_of_a_long_map_key(channel: grpc.Channel, space_name: str) -> None:
    key = "k" * 100_000
    value = pb.Value(map_value=pb.MapValue(items=[pb.MapItem(key=key, value=pb.Value())]))
    request = pb.WriteRequest(space=space_name, entry=pb.Entry(type_name="test.Thing", fields={"m": value}))
    code, details = call(channel, "Write", request.SerializeToString())
    assert code == grpc.StatusCode.INVALID_ARGUMENT, details
    assert len(details.encode()) <= MESSAGE_BOUND
    assert "(100000 characters)" in details


def test_a_refusal_of_repeated_supertypes_names_the_type_once(channel: grpc.Channel, space_name: str) -> None:
    entry = pb.Entry(type_name="test.Thing", supertypes=["s" * 200] * 100)
    code, details = call(channel, "Write", pb.WriteRequest(space=space_name, entry=entry).SerializeToString())
    assert code == grpc.StatusCode.INVALID_ARGUMENT, details
    assert len(details.encode()) <= MESSAGE_BOUND
    assert "entry.supertypes" in details and "(200 characters)" in details


def test_a_refusal_quotes_a_prefix_of_a_long_space_name(channel: grpc.Channel) -> None:
    request = pb.CountRequest(space="x y" * 50_000, templates=[pb.Template(type_name="test.Thing")])
    code, details = call(channel, "Count", request.SerializeToString())
    assert code == grpc.StatusCode.INVALID_ARGUMENT, details
    assert "(150000 characters)" in details
    assert len(details.encode()) <= MESSAGE_BOUND
