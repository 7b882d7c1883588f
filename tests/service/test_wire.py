"""Replies encoded from stored payloads decode as the protobuf messages they stand for."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from outrig.service import wire
from outrig.v1 import space_pb2 as pb


def entry(size: int) -> pb.Entry:
    return pb.Entry(type_name="T", supertypes=["S"], fields={"b": pb.Value(bytes_value=b"x" * size)})


# Lengths around each varint boundary, and an HD array's size.
@pytest.mark.parametrize("size", [0, 1, 120, 127, 128, 16_380, 16_384, 2_097_152, 3_686_400])
def test_entries_reply_is_a_match_reply_and_a_contents_reply(size: int) -> None:
    entries = [entry(size), entry(1)]
    encoded = wire.entries_reply([wire.frame(e.SerializeToString()) for e in entries])
    assert list(pb.MatchReply.FromString(encoded).entries) == entries
    assert list(pb.ContentsReply.FromString(encoded).entries) == entries


def test_no_entries_is_an_empty_reply() -> None:
    assert wire.entries_reply([]) == b""
    assert pb.MatchReply.FromString(b"") == pb.MatchReply()


@given(
    sequence=st.integers(min_value=1, max_value=2**64 - 1), size=st.integers(min_value=0, max_value=70_000)
)
def test_event_reply_is_a_notify_reply(sequence: int, size: int) -> None:
    encoded = wire.event_reply(sequence, wire.frame(entry(size).SerializeToString()))
    reply = pb.NotifyReply.FromString(encoded)
    assert reply.sequence == sequence
    assert reply.entry == entry(size)
    assert not reply.HasField("registration")


def test_a_reply_of_one_entry_is_its_payload_itself() -> None:
    payload = wire.frame(entry(3_686_400).SerializeToString())
    assert wire.entries_reply([payload]) is payload  # no copy
    assert bytes(wire.unframed(payload)) == entry(3_686_400).SerializeToString()


def test_entry_encodings_are_the_entries_as_they_arrived() -> None:
    entries = [entry(0), entry(200), entry(70_000)]
    request = pb.WriteManyRequest(space="s", entries=entries, request_id="r")
    request.lease.seconds = 5.0
    encodings = wire.entry_encodings(request.SerializeToString())
    assert [pb.Entry.FromString(bytes(e)) for e in encodings] == entries
    single = pb.WriteRequest(space="s", entry=entries[1]).SerializeToString()
    assert [bytes(e) for e in wire.entry_encodings(single)] == [entries[1].SerializeToString()]


def test_an_entry_sent_twice_is_merged_and_re_encoded() -> None:
    """Protobuf merges a singular message field that occurs twice; the server then keeps the
    merged entry, not the bytes of either occurrence."""
    first = pb.WriteRequest(entry=pb.Entry(type_name="A", fields={"a": pb.Value(int_value=1)}))
    second = pb.WriteRequest(entry=pb.Entry(fields={"b": pb.Value(int_value=2)}))
    raw = first.SerializeToString() + second.SerializeToString()
    assert len(wire.entry_encodings(raw)) == 2
    merged = pb.WriteRequest.FromString(raw).entry
    assert dict(merged.fields) == {"a": pb.Value(int_value=1), "b": pb.Value(int_value=2)}


def test_a_large_entrys_arrays_are_views_into_its_payload() -> None:
    """An HD array is held once: its FieldValue views the stored payload, and still equals (and
    hashes like) the same array sent in a template."""
    from outrig.service import codec
    from outrig.service.config import Limits

    pixels = bytes(range(256)) * 14_400  # 3.6 MB
    message = pb.Entry(
        type_name="Frame",
        fields={
            "pixels": pb.Value(array_value=pb.TypedArray(dtype=pb.DTYPE_INT32, data=pixels)),
            "small": pb.Value(array_value=pb.TypedArray(dtype=pb.DTYPE_UINT8, data=b"ab")),
            "n": pb.Value(int_value=7),
        },
    )
    stored = codec.new_entry(message, "entry", Limits(), message.SerializeToString())
    view = stored.fields["pixels"].data
    assert isinstance(view, memoryview) and view.obj is stored.payload
    (template,) = codec.templates([pb.Template(type_name="Frame", fields=message.fields)], Limits())
    sent = dict(template.fields)
    for name in ("pixels", "small", "n"):
        assert stored.fields[name] == sent[name] and hash(stored.fields[name]) == hash(sent[name])
    assert wire.array_views(memoryview(message.SerializeToString())).keys() == {"pixels", "small"}
