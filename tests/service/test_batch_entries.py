"""A write_many's entries read in one pass (codec.new_entries with the request's bytes, through
protocol/views.py) are the entries `new_entry` makes of each, and what it refuses is refused with
the same message, naming the same entry and field."""

from __future__ import annotations

import math

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from outrig._protocol import tag, varint
from outrig.service.config import Limits
from outrig.service.exceptions import InvalidArgumentError
from outrig.service.protocol import codec, wire
from outrig.service.transport import handlers
from outrig.v1 import space_pb2 as pb

LIMITS = Limits(max_fields=4, max_name_length=6, max_depth=2)

names = st.sampled_from(["a", "b", "key", "group", "", "toolong!"])
scalars = st.one_of(
    st.builds(lambda v: pb.Value(int_value=v), st.integers(-(2**63), 2**63 - 1)),
    st.builds(lambda v: pb.Value(string_value=v), st.sampled_from(["", "x", "batch", "é" * 3])),
    st.builds(lambda v: pb.Value(bool_value=v), st.booleans()),
    st.builds(lambda v: pb.Value(bytes_value=v), st.binary(max_size=4)),
    st.builds(lambda v: pb.Value(double_value=v), st.sampled_from([0.0, -0.0, 1.5, math.nan, math.inf])),
    st.just(pb.Value(null_value=pb.Null())),
    st.just(pb.Value()),  # no value set: refused
    st.builds(
        lambda data: pb.Value(array_value=pb.TypedArray(dtype=pb.DTYPE_INT16, data=data)),
        st.binary(max_size=5),  # an odd length is refused
    ),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.builds(lambda items: pb.Value(list_value=pb.ListValue(items=items)), st.lists(inner, max_size=2)),
        st.builds(
            lambda items: pb.Value(
                map_value=pb.MapValue(items=[pb.MapItem(key=k, value=v) for k, v in items])
            ),
            st.lists(st.tuples(st.sampled_from(["z", "y", "z"]), inner), max_size=3),  # unsorted, duplicates
        ),
    ),
    max_leaves=4,
)


def tag_of(number: int, kind: int) -> bytes:
    return varint(number << 3 | kind)


entries = st.builds(
    lambda type_name, supertypes, fields: pb.Entry(type_name=type_name, supertypes=supertypes, fields=fields),
    st.sampled_from(["T", "T", "S", "", "toolong!"]),
    st.lists(st.sampled_from(["S", "U", "T", ""]), max_size=2),
    st.dictionaries(names, values, max_size=5),
)


def _made(raw: bytes, *, viewed: bool) -> list[tuple[object, ...]] | str:
    request = pb.WriteManyRequest.FromString(raw)
    try:
        made = codec.new_entries(request.entries, LIMITS, wire.entry_encodings(raw), one_pass=viewed)
    except InvalidArgumentError as err:
        return str(err)
    return [(n.type_name, n.supertypes, dict(n.fields), n.payload, n.size) for n in made]


@given(batch=st.lists(entries, min_size=1, max_size=5), repeat=st.booleans())
def test_viewed_entries_are_new_entrys(batch: list[pb.Entry], repeat: bool) -> None:
    request = pb.WriteManyRequest(space="s", entries=batch + batch if repeat else batch)
    request.lease.seconds = 5.0
    raw = request.SerializeToString()
    assert _made(raw, viewed=True) == _made(raw, viewed=False)


def test_shared_values_are_one_object() -> None:
    fields = {"g": pb.Value(string_value="batch")}
    batch = [pb.Entry(type_name="T", fields={**fields, "k": pb.Value(int_value=i)}) for i in range(3)]
    raw = pb.WriteManyRequest(space="s", entries=batch).SerializeToString()
    made = codec.new_entries(
        pb.WriteManyRequest.FromString(raw).entries, LIMITS, wire.entry_encodings(raw), one_pass=True
    )
    assert len({id(n.fields["g"]) for n in made}) == 1
    assert [n.fields["k"].data for n in made] == [0, 1, 2]


def test_a_field_sent_twice_is_its_last_value() -> None:
    # A map's key sent twice on the wire: protobuf keeps the last; the one-pass reading leaves it
    # to new_entry.
    first = pb.Entry(type_name="T", fields={"a": pb.Value(int_value=1)}).SerializeToString()
    again = pb.Entry(fields={"a": pb.Value(int_value=2)}).SerializeToString()
    entry = first + again  # one Entry: its fields' items concatenated
    raw = b"".join((tag(pb.WriteManyRequest.DESCRIPTOR.fields_by_name["entries"]), varint(len(entry)), entry))
    made = _made(raw, viewed=True)
    assert made == _made(raw, viewed=False)
    assert not isinstance(made, str)
    fields = made[0][2]
    assert isinstance(fields, dict)
    assert fields["a"].data == 2


@given(
    batch=st.lists(entries, max_size=5),
    extra=st.sampled_from([b"", varint(99 << 3) + b"\x05", tag_of(99, 2) + b"\x01x"]),  # unknown fields
)
def test_a_small_write_arrives_with_the_bytes_of_each_entry(batch: list[pb.Entry], extra: bytes) -> None:
    raw = pb.WriteManyRequest(space="s", entries=batch).SerializeToString() + extra
    received = handlers.receiving(pb.WriteManyRequest)(raw)
    assert isinstance(received, handlers.Received)
    assert [bytes(e) for e in received.entries] == [bytes(e) for e in wire.entry_encodings(raw)]
    assert received.message == pb.WriteManyRequest.FromString(raw)


def test_a_small_write_with_a_group_or_cut_short_is_refused_as_the_server_reads_it() -> None:
    raw = pb.WriteManyRequest(space="s", entries=[pb.Entry(type_name="T")]).SerializeToString()
    grouped = handlers.receiving(pb.WriteManyRequest)(raw + b"\x4b\x4c")  # field 9: start, end group
    assert isinstance(grouped, handlers.Undecodable)
    assert grouped.reason == "wire type 3, which no outrig message has"
    cut = handlers.receiving(pb.WriteManyRequest)(raw[:-1])
    assert isinstance(cut, handlers.Undecodable)
    with pytest.raises(ValueError, match="truncated") as err:
        wire.entry_encodings(raw[:-1])
    assert cut.reason == str(err.value)


_ENTRY = pb.WriteManyRequest.DESCRIPTOR.fields_by_name["entries"]
# What a hand-made encoder may send inside an entry that protobuf's own does not: an explicit
# empty type name, supertype or field (the one-pass reading's separators, views.BATCH_SEPARATOR).
_EMPTIES = st.sampled_from(
    [tag(pb.Entry.DESCRIPTOR.fields_by_name[name]) + b"\x00" for name in ("type_name", "supertypes")]
    + [tag(pb.Entry.DESCRIPTOR.fields_by_name["fields"]) + b"\x00"]
)
# An entry as pieces end to end: each an Entry's encoding or an empty field, so that one entry may
# send its type name twice or not at all, its supertypes and fields in several runs, or an empty
# one (protobuf merges the pieces: the last type name, every supertype and field).
# Entries `new_entry` takes, mostly: a refusal elsewhere in a batch hides how the rest was read.
valid_entries = st.builds(
    lambda type_name, supertypes, fields: pb.Entry(type_name=type_name, supertypes=supertypes, fields=fields),
    st.sampled_from(["T", "S"]),
    st.lists(st.sampled_from(["U", "V"]), max_size=2, unique=True),
    st.dictionaries(st.sampled_from(["a", "b", "key"]), scalars, max_size=3),
)
encoded_entries = st.lists(
    st.one_of(valid_entries, entries).map(lambda entry: entry.SerializeToString()) | _EMPTIES,
    min_size=0,
    max_size=3,
).map(b"".join)
_VALID = pb.Entry(type_name="T", fields={"a": pb.Value(int_value=1)}).SerializeToString()


@given(batch=st.lists(encoded_entries, min_size=1, max_size=4), repeat=st.booleans())
@example(batch=[_VALID + b"\x1a\x00"], repeat=False)  # an empty field (a separator) sent
@example(batch=[_VALID + b"\x12\x00", _VALID], repeat=False)  # an empty supertype
@example(batch=[_VALID + b"\x0a\x00" + _VALID, b"", b""], repeat=False)  # three type names, then none
def test_viewed_entries_of_any_encoding_are_new_entrys(batch: list[bytes], repeat: bool) -> None:
    sent = batch + batch if repeat else batch
    raw = b"".join(tag(_ENTRY) + varint(len(entry)) + entry for entry in sent)
    assert _made(raw, viewed=True) == _made(raw, viewed=False)


@pytest.mark.parametrize("supertypes", [[(), ("A",), ()], [("A", "B"), (), ("C",)], [("A",), ("A",), ("A",)]])
def test_each_entry_keeps_its_own_supertypes(supertypes: list[tuple[str, ...]]) -> None:
    batch = [pb.Entry(type_name=f"T{i}", supertypes=s) for i, s in enumerate(supertypes)]
    raw = pb.WriteManyRequest(space="s", entries=batch).SerializeToString()
    made = _made(raw, viewed=True)
    assert made == _made(raw, viewed=False)
    assert [(entry[0], entry[1]) for entry in made] == [(f"T{i}", s) for i, s in enumerate(supertypes)]


def _delimited(number: int, data: bytes) -> bytes:
    return tag_of(number, 2) + varint(len(data)) + data


# A Value as pieces end to end: a plain or other kind's value, a packed run of ints (which a
# Value's singular int_value does not take as its value), an unknown field, so that one Value
# may send two values, two kinds, or none that protobuf reads as its kind.
_INT = pb.Value.DESCRIPTOR.fields_by_name["int_value"].number
value_pieces = st.one_of(
    scalars.map(lambda value: value.SerializeToString()),
    st.lists(st.integers(0, 300), max_size=2).map(
        lambda run: _delimited(_INT, b"".join(varint(n) for n in run))  # packed
    ),
    st.just(tag_of(15, 0) + b"\x01"),  # unknown
)
encoded_values = st.lists(value_pieces, max_size=2).map(b"".join)
# A field (a map item) as pieces: its key and its Value, each sent once, twice or not at all.
encoded_items = st.lists(
    st.one_of(
        st.sampled_from(["x", "y", ""]).map(lambda key: _delimited(1, key.encode())),
        encoded_values.map(lambda value: _delimited(2, value)),
    ),
    max_size=3,
).map(b"".join)


def _item(key: str, *values: pb.Value) -> bytes:
    return _delimited(1, key.encode()) + _delimited(2, b"".join(v.SerializeToString() for v in values))


_ONE = pb.Entry(type_name="T")


@given(batch=st.lists(st.tuples(st.lists(encoded_items, max_size=3), valid_entries), min_size=1, max_size=3))
# A Value of two ints (the last is its value), and of an int then a null (then it is null).
@example(batch=[([_item("x", pb.Value(int_value=1), pb.Value(int_value=2))], _ONE)])
@example(batch=[([_item("x", pb.Value(int_value=1), pb.Value(null_value=pb.Null()))], _ONE)])
@example(
    batch=[([_item("x", pb.Value(int_value=1))], _ONE), ([_item("y", pb.Value(string_value="s"))], _ONE)]
)
def test_viewed_fields_of_any_encoding_are_new_entrys(batch: list[tuple[list[bytes], pb.Entry]]) -> None:
    fields = pb.Entry.DESCRIPTOR.fields_by_name["fields"].number
    sent = [
        entry.SerializeToString() + b"".join(_delimited(fields, item) for item in items)
        for items, entry in batch
    ]
    raw = b"".join(tag(_ENTRY) + varint(len(entry)) + entry for entry in sent)
    assert _made(raw, viewed=True) == _made(raw, viewed=False)
