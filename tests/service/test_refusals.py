"""How the service refuses what a client sent, in pieces: client text quoted short (`excerpt`),
every status message bounded, undecodable bytes a marker the servicer refuses, and unexpected
errors logged a traceback at a time."""

from __future__ import annotations

import logging

import grpc
import pytest

from outrig._protocol import varint
from outrig.service.config import Limits
from outrig.service.exceptions import InvalidArgumentError, excerpt
from outrig.service.logs import Throttle
from outrig.service.protocol import wire
from outrig.service.transport import handlers, servicer
from outrig.service.transport.servicer import MAX_STATUS_MESSAGE, Failure, bounded, refusal
from outrig.v1 import space_pb2 as pb


def test_excerpt_quotes_short_text_whole() -> None:
    assert excerpt("name") == "'name'"
    assert excerpt("a" * 64) == repr("a" * 64)


def test_excerpt_quotes_a_prefix_of_long_text_and_says_how_long_it_was() -> None:
    assert excerpt("a" * 100_000) == "'" + "a" * 64 + "…' (100000 characters)"
    assert excerpt("it's" * 100, limit=4) == '"it\'s…" (400 characters)'  # repr's own quotes
    assert excerpt("a\\" * 100, limit=2) == "'a\\\\…' (200 characters)"


def test_bounded_cuts_a_message_to_its_bytes_on_a_character_boundary() -> None:
    assert bounded("short") == "short"
    cut = bounded("é" * 2000)  # 4,000 bytes
    assert len(cut.encode()) <= MAX_STATUS_MESSAGE
    assert cut.startswith("éé") and cut.endswith("… (cut: 4000 bytes in all)")


def test_any_failure_has_a_bounded_message() -> None:
    failure = Failure.of(InvalidArgumentError("x" * 100_000), "Write")
    assert failure.status == grpc.StatusCode.INVALID_ARGUMENT
    assert len(failure.message.encode()) <= MAX_STATUS_MESSAGE
    assert len(Failure(grpc.StatusCode.NOT_FOUND, "y" * 5000).message.encode()) <= MAX_STATUS_MESSAGE


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(servicer, "_throttle", Throttle(servicer.LOG_INTERVAL, fake))
    return fake


def test_an_unexpected_error_logs_its_traceback_once_per_interval(
    clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.ERROR, logger="outrig.service"):
        statuses = {Failure.of(KeyError("x" * 10_000), "Count").status for _ in range(100)}
        Failure.of(ValueError("another kind"), "Count")  # another type: a line of its own
        clock.now += servicer.LOG_INTERVAL
        Failure.of(KeyError("again"), "Count")
    assert statuses == {grpc.StatusCode.INTERNAL}
    assert [(r.getMessage(), r.exc_info is not None) for r in caplog.records] == [
        ("unexpected error in Count", True),
        ("unexpected error in Count", True),
        ("unexpected error in Count (and 99 more like it since the last such line, not logged)", True),
    ]


def test_undecodable_bytes_decode_as_a_marker_not_an_exception() -> None:
    for decode in (handlers.decoding(pb.MatchRequest), handlers.receiving(pb.WriteRequest)):
        marker = decode(b"\xff\xff\xff")
        assert isinstance(marker, handlers.Undecodable)
        assert not marker.too_deep
    marker = handlers.decoding(pb.CountRequest)(b"\x0a\x02\xff\xfe")
    assert isinstance(marker, handlers.Undecodable)
    assert (marker.message_type, marker.reason) == ("outrig.v1.CountRequest", "String field had bad UTF-8")
    assert isinstance(handlers.decoding(pb.CountRequest)(b"\x0a\x01s"), pb.CountRequest)
    received = handlers.receiving(pb.WriteRequest)(
        pb.WriteRequest(space="s", entry=pb.Entry()).SerializeToString()
    )
    assert isinstance(received, handlers.Received)
    assert [bytes(e) for e in received.entries] == [b""]


def _deep(levels: int) -> bytes:
    value = pb.Value(int_value=1).SerializeToString()
    for _ in range(levels):
        items = b"\x0a" + varint(len(value)) + value  # ListValue.items
        value = b"\x42" + varint(len(items)) + items  # Value.list_value
    return value


def test_nesting_past_protobufs_limit_is_told_apart_and_named_by_max_depth(
    clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    value = _deep(100)
    marker = handlers.decoding(pb.Value)(value)
    assert isinstance(marker, handlers.Undecodable) and marker.too_deep
    with caplog.at_level(logging.WARNING, logger="outrig.service"):
        message = str(refusal(marker, "Write", Limits(max_depth=7)))
        refusal(marker, "Write", Limits(max_depth=7))
    assert message == (
        "request: cannot decode Write's request: lists and maps nested deeper than protobuf can parse "
        "(the limit is max_depth=7)"
    )
    assert len(caplog.records) == 1  # the second held back


def test_a_refusal_names_the_type_and_why() -> None:
    marker = handlers.Undecodable("outrig.v1.EndRequest", "Wire format was corrupt")
    assert str(refusal(marker, "Commit", Limits())) == (
        "request: cannot decode Commit's request: not a valid outrig.v1.EndRequest (Wire format was corrupt)"
    )


def test_a_varint_is_at_most_ten_bytes() -> None:
    longest = varint(2**64 - 1)
    assert len(longest) == 10
    assert wire.fields(memoryview(b"\x08" + longest)) == [(1, 2**64 - 1)]
    with pytest.raises(ValueError, match="longer than 10 bytes"):
        wire.fields(memoryview(b"\x08" + b"\xff" * 10 + b"\x01"))
    with pytest.raises(ValueError, match="runs past the end"):
        wire.fields(memoryview(b"\x08\xff"))


def test_a_group_is_no_outrig_field() -> None:
    request = pb.WriteRequest(space="s").SerializeToString() + b"\x4b\x4c"  # field 9: start, end group
    pb.WriteRequest.FromString(request)  # protobuf skips it
    marker = handlers.receiving(pb.WriteRequest)(request)
    assert isinstance(marker, handlers.Undecodable)
    assert marker.reason == "wire type 3, which no outrig message has"
