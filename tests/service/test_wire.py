"""Replies encoded from stored payloads decode as the protobuf messages they stand for; wire.py is
byte work only."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from outrig.service.protocol import wire
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
    from outrig.service.config import Limits
    from outrig.service.protocol import codec

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


def _frame_entry(pixels: bytes, **more: pb.Value) -> pb.Entry:
    fields = {"pixels": pb.Value(array_value=pb.TypedArray(dtype=pb.DTYPE_INT32, data=pixels))}
    return pb.Entry(type_name="Frame", supertypes=["Image"], fields={**fields, **more})


def _new_entries_both_ways(
    raw: bytes, message_type: type[pb.WriteRequest] | type[pb.WriteManyRequest]
) -> tuple[list[object], list[object]]:
    """new_entry's view of each entry of a Write or WriteMany request, decoded as the server
    decodes it (without large arrays' data) and decoded in full."""
    from outrig.service.config import Limits
    from outrig.service.protocol import codec

    decoded = message_type.FromString(wire.without_array_data(raw, one_entry=message_type is pb.WriteRequest))
    full = message_type.FromString(raw)
    encodings = wire.entry_encodings(raw)

    def views(message: pb.WriteRequest | pb.WriteManyRequest) -> list[object]:
        entries = [message.entry] if isinstance(message, pb.WriteRequest) else list(message.entries)
        pairs = zip(entries, encodings, strict=True)
        made = [codec.new_entry(e, "entry", Limits(), encoding) for e, encoding in pairs]
        return [(n.type_name, n.supertypes, n.fields, n.payload, n.size) for n in made]

    return views(decoded), views(full)


def test_a_large_entry_is_decoded_without_its_arrays_data() -> None:
    pixels = bytes(range(256)) * 14_400  # 3.6 MB
    inner = pb.Value(array_value=pb.TypedArray(dtype=pb.DTYPE_UINT8, data=b"abcd"))
    nested = pb.Value(list_value=pb.ListValue(items=[inner]))
    entry = _frame_entry(pixels, n=pb.Value(int_value=7), nested=nested, small=pb.Value(string_value="s"))
    request = pb.WriteRequest(space="s", entry=entry, request_id="r")
    request.lease.seconds = 5.0
    raw = request.SerializeToString()
    decoded = pb.WriteRequest.FromString(wire.without_array_data(raw, one_entry=True))
    assert len(decoded.SerializeToString()) < 1_000
    assert decoded.entry.fields["pixels"].array_value == pb.TypedArray(dtype=pb.DTYPE_INT32)
    for name in ("n", "nested", "small"):  # only top-level typed arrays lose their data
        assert decoded.entry.fields[name] == entry.fields[name]
    assert (decoded.space, decoded.request_id, decoded.lease) == (request.space, "r", request.lease)
    mine, full = _new_entries_both_ways(raw, pb.WriteRequest)
    assert mine == full


def test_small_entries_and_merged_entries_are_decoded_whole() -> None:
    small = pb.WriteRequest(space="s", entry=_frame_entry(b"\0" * 4000)).SerializeToString()
    assert wire.without_array_data(small, one_entry=True) is small
    large = pb.WriteRequest(entry=_frame_entry(b"\1" * 80_000)).SerializeToString()
    twice = large + pb.WriteRequest(entry=pb.Entry(fields={"b": pb.Value(int_value=2)})).SerializeToString()
    assert wire.without_array_data(twice, one_entry=True) is twice  # merged: encoded from the message
    assert wire.without_array_data(twice, one_entry=False) is not twice  # WriteMany: two entries


@given(
    sizes=st.lists(st.sampled_from([0, 4, 65_532, 65_536, 70_000, 200_000]), min_size=1, max_size=4),
    extra=st.booleans(),
)
def test_write_many_decodes_to_the_same_entries_either_way(sizes: list[int], extra: bool) -> None:
    more = {"t": pb.Value(array_value=pb.TypedArray(dtype=pb.DTYPE_UINT8, data=b"xy"))} if extra else {}
    entries = [_frame_entry(bytes([i % 256]) * size, **more) for i, size in enumerate(sizes)]
    raw = pb.WriteManyRequest(space="s", entries=entries, request_id="r").SerializeToString()
    mine, full = _new_entries_both_ways(raw, pb.WriteManyRequest)
    assert mine == full


def test_wire_is_pure_byte_work_without_grpc() -> None:
    # codec.py, and through it the stores, frame entries with wire: it must not bring gRPC along
    # (decoding requests for gRPC is service/transport/handlers.py).
    tree = ast.parse(Path(wire.__file__).read_text())
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert not {name for name in imported if name.split(".")[0] == "grpc"}
