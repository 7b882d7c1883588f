"""A MuxRequest read through protobuf's view of it (transport/mux.py, `parse_request`) gives what
reading its tags in Python (`_parse_fields`, what every request took before) gives, for any bytes:
the same operations, or the same refusal (ValueError). Hypothesis writes the bytes field by field,
known fields and unknown ones, of every wire type, in any order and any number."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from outrig._protocol import encode_op, request_message, varint
from outrig.service.transport import mux
from outrig.v1 import space_pb2 as pb


def _field(number: int, kind: int, value: int | bytes) -> bytes:
    key = varint(number << 3 | kind)
    if kind == 0:
        return key + varint(value)  # type: ignore[arg-type]
    if kind == 1:
        return key + int(value).to_bytes(8, "little")
    if kind == 5:
        return key + int(value).to_bytes(4, "little")
    data = bytes(value)
    return key + varint(len(data)) + data


_values = st.one_of(st.integers(0, 2**32 - 1), st.binary(max_size=12))
# Fields of an op: mostly its id (1) and the op fields (2-28), sometimes a number no op has.
_op_fields = st.lists(
    st.tuples(st.sampled_from([1, 1, 2, 4, 5, 15, 10, 29, 200]), st.sampled_from([0, 2, 2, 1, 5]), _values),
    max_size=4,
)


def _encode_op(parts: list[tuple[int, int, Any]]) -> bytes:
    out = b""
    for number, kind, value in parts:
        if kind in (0, 1, 5) and not isinstance(value, int):
            value = len(value)
        if kind == 2 and isinstance(value, int):
            value = varint(value)
        out += _field(number, kind, value)
    return out


def _outcome(parse: Any, raw: bytes) -> Any:
    try:
        ops = parse(raw)
    except ValueError:
        return "refused"
    # A view's op bytes and a cancel's bool, as the tags' reading gives them: views and ints.
    return [(i, f, bytes(v) if isinstance(v, (bytes, memoryview)) else int(v)) for i, f, v in ops]


@settings(max_examples=400, deadline=None)
@given(
    st.lists(
        st.one_of(
            _op_fields.map(lambda parts: _field(1, 2, _encode_op(parts))),  # an op
            st.tuples(st.sampled_from([1, 2, 7]), st.sampled_from([0, 1, 5]), st.integers(0, 300)).map(
                lambda t: _field(*t)  # a top-level field of another wire type (ops as a number too)
            ),
            st.binary(max_size=3),  # bytes that may be no protobuf at all
        ),
        max_size=6,
    ).map(b"".join)
)
@example(b"\n\x02x\x02")  # a cancel sent as a varint of 2 (the view once read a bool: 1)
def test_the_view_reads_what_the_tags_read(raw: bytes) -> None:
    assert _outcome(mux.parse_request, raw) == _outcome(mux._parse_fields, raw)


def test_the_sdks_requests_take_the_view() -> None:
    take = pb.MatchRequest(space="s", timeout=1.0).SerializeToString()
    write = pb.WriteRequest(space="s", entry=pb.Entry(type_name="T")).SerializeToString()
    raw = request_message([encode_op(300, 5, take), encode_op(301, 2, write)])
    assert mux._RequestView.FromString(raw).ByteSize() == len(raw)
    assert mux.parse_request(raw) == [(300, 5, take), (301, 2, write)]


@pytest.mark.parametrize(
    "raw",
    [
        _field(1, 2, _field(1, 0, 3) + _field(5, 2, b"") + _field(4, 2, b"x")),  # a oneof sent twice
        _field(1, 2, _field(1, 0, 3) + _field(5, 2, b"") + _field(99, 2, b"x")),  # then an unknown op
        _field(1, 2, _field(1, 2, b"3")),  # an id that is no number
        _field(1, 0, 5),  # ops that are no message
        _field(1, 2, b"\x80" * 11),  # a varint too long
    ],
)
def test_what_the_view_cannot_say_is_read_from_the_tags(raw: bytes) -> None:
    assert _outcome(mux.parse_request, raw) == _outcome(mux._parse_fields, raw)
