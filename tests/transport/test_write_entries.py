"""A Write's entries found by reading its top-level tags in Python (`wire.known_entries`, what the
Write deserializer does first for a small request, handlers.py's `_small`) are what the reading
it replaces finds: protobuf's second decode (`views.entry_encodings`) of a request with no unknown
field at its top level, or, when there is one, `wire.entry_encodings`. Hypothesis writes the
request field by field, WriteRequest's fields and others, of every wire type, in any order and
any number, an entry sent twice and entries longer than a one-byte length among them."""

from __future__ import annotations

from typing import Any

from google.protobuf import unknown_fields
from google.protobuf.message import DecodeError
from hypothesis import example, given, settings
from hypothesis import strategies as st

from outrig._protocol import METHODS, varint
from outrig.service.protocol import views, wire
from outrig.service.transport import handlers
from outrig.v1 import space_pb2 as pb

_TAGS = wire.one_byte_tags(pb.WriteRequest)
_deserialize = handlers.request_deserializer(METHODS["Write"])


def _field(number: int, kind: int, value: int | bytes) -> bytes:
    key = varint(number << 3 | kind)
    if kind == 0:
        return key + varint(int(value) if isinstance(value, int) else len(value))
    if kind in (1, 5):
        width = 8 if kind == 1 else 4
        return key + (int(value) if isinstance(value, int) else len(value)).to_bytes(width, "little")
    data = varint(value) if isinstance(value, int) else bytes(value)
    return key + varint(len(data)) + data


def _entry(type_name: str, note: str) -> bytes:
    entry = pb.Entry(type_name=type_name)
    entry.fields["note"].string_value = note
    return entry.SerializeToString()


_entries = st.builds(_entry, st.sampled_from(["a", "bench.Small", ""]), st.text(max_size=150))
_values = st.one_of(st.integers(0, 2**32 - 1), st.binary(max_size=12), _entries)
# WriteRequest's numbers (1-7) mostly, with the wire types they have and others, and numbers it
# has not (8, 16: a tag of two bytes).
_parts = st.lists(
    st.tuples(st.sampled_from([1, 2, 2, 2, 3, 4, 5, 6, 7, 8, 16]), st.sampled_from([0, 1, 2, 2, 5]), _values),
    max_size=6,
)


def _replaced(raw: bytes) -> list[bytes] | str:
    """What a parsed Write's entries were found as before `known_entries`."""
    try:
        message = pb.WriteRequest.FromString(raw)
    except DecodeError:
        return "undecodable"
    if unknown_fields.UnknownFieldSet(message):
        try:
            return [bytes(entry) for entry in wire.entry_encodings(raw)]
        except ValueError:
            return "refused"
    return views.entry_encodings(raw)


@settings(max_examples=500, deadline=None)
@given(_parts)
@example([(1, 2, b"bench"), (2, 2, _entry("bench.Small", "x" * 200)), (4, 2, b"id")])
@example([(2, 2, _entry("a", "one")), (2, 2, _entry("b", "two"))])
@example([(2, 0, 5), (2, 2, _entry("a", ""))])
@example([(16, 2, b"x"), (2, 2, _entry("a", ""))])
def test_known_entries_are_what_the_second_decode_finds(parts: list[tuple[int, int, Any]]) -> None:
    raw = b"".join(_field(*part) for part in parts)
    before = _replaced(raw)
    if before == "undecodable":
        return
    found = wire.known_entries(raw, _TAGS)
    if found is not None:
        assert found == before
    received = _deserialize(raw)
    if isinstance(received, handlers.Undecodable):
        assert before == "refused"
    else:
        assert [bytes(entry) for entry in received.entries] == before


def test_a_request_of_known_fields_is_read_by_its_tags() -> None:
    entry = _entry("bench.Small", "x" * 300)  # a length of two bytes
    request = pb.WriteRequest(space="s", entry=pb.Entry.FromString(entry), request_id="r", transaction=3)
    request.lease.seconds = 30
    request.visible_at = 5.0
    raw = request.SerializeToString()
    assert wire.known_entries(raw, _TAGS) == [entry]
    assert wire.known_entries(raw + _field(8, 0, 1), _TAGS) is None  # a field WriteRequest has not
    assert wire.known_entries(raw + _field(1, 0, 1), _TAGS) is None  # space as a varint
