"""The codec: every bad input is an InvalidArgumentError naming its field; values are canonical."""

from __future__ import annotations

import math
import re
import struct

import pytest

from outrig.service.config import Limits
from outrig.service.engine import LeaseGrant
from outrig.service.engine.values import NULL
from outrig.service.exceptions import InvalidArgumentError
from outrig.service.protocol import codec
from outrig.v1 import space_pb2 as pb

LIMITS = Limits()


def i(x: int) -> pb.Value:
    return pb.Value(int_value=x)


def d(x: float) -> pb.Value:
    return pb.Value(double_value=x)


def s(x: str) -> pb.Value:
    return pb.Value(string_value=x)


def lst(*items: pb.Value) -> pb.Value:
    return pb.Value(list_value=pb.ListValue(items=list(items)))


def mp(*items: tuple[str, pb.Value]) -> pb.Value:
    return pb.Value(map_value=pb.MapValue(items=[pb.MapItem(key=k, value=v) for k, v in items]))


def arr(dtype: int, data: bytes) -> pb.Value:
    return pb.Value(array_value=pb.TypedArray(dtype=dtype, data=data))  # type: ignore[arg-type]


def nested_lists(depth: int, leaf: pb.Value | None) -> pb.Value:
    value = lst(leaf) if leaf is not None else lst()
    for _ in range(depth - 1):
        value = lst(value)
    return value


def invalid(field: str) -> pytest.RaisesExc[InvalidArgumentError]:
    """Expect an InvalidArgumentError whose message starts with the field at fault."""
    return pytest.raises(InvalidArgumentError, match="^" + re.escape(field + ":"))


def one_entry(**fields: pb.Value) -> list[pb.Entry]:
    return [pb.Entry(type_name="T", fields={"ok": i(1)}), pb.Entry(type_name="T", fields=fields)]


# ---------------------------------------------------------------- space names


@pytest.mark.parametrize("name", ["jobs", "a", "Jobs.v2_prod-1", "0day", "x" * 256])
def test_valid_space_names(name: str) -> None:
    assert codec.space_name(name, LIMITS) == name


@pytest.mark.parametrize("name", ["", "has space", "-leading", ".hidden", "_x", "a/b", "é", "x" * 257, "a\n"])
def test_invalid_space_names(name: str) -> None:
    with invalid("space"):
        codec.space_name(name, LIMITS)


# ---------------------------------------------------------------- entries


def test_entries_must_not_be_empty_or_too_many() -> None:
    with invalid("entries"):
        codec.new_entries([], LIMITS)
    with invalid("entries"):
        codec.new_entries([pb.Entry(type_name="T")] * 3, Limits(max_batch=2))
    assert len(codec.new_entries([pb.Entry(type_name="T")] * 2, Limits(max_batch=2))) == 2


def test_type_names() -> None:
    with invalid("entries[1].type_name"):
        codec.new_entries([pb.Entry(type_name="T"), pb.Entry(type_name="")], LIMITS)
    with invalid("entries[0].type_name"):
        codec.new_entries([pb.Entry(type_name="T" * 11)], Limits(max_name_length=10))
    with invalid("entries[0].supertypes[1]"):
        codec.new_entries([pb.Entry(type_name="T", supertypes=["A", ""])], LIMITS)


@pytest.mark.parametrize(
    ("supertypes", "where"), [(["A", "A"], "[1]"), (["T"], "[0]"), (["A", "B", "T"], "[2]")]
)
def test_duplicate_supertypes(supertypes: list[str], where: str) -> None:
    """The message names the one repeated, not the whole list (which a client can make long)."""
    with invalid(f"entries[0].supertypes{where}"):
        codec.new_entries([pb.Entry(type_name="T", supertypes=supertypes)], LIMITS)


def test_a_valid_entry() -> None:
    message = pb.Entry(type_name="Dog", supertypes=["Mammal", "Animal"], fields={"n": i(1), "s": s("x")})
    (entry,) = codec.new_entries([message], LIMITS)
    assert entry.type_name == "Dog"
    assert entry.supertypes == ("Mammal", "Animal")
    assert set(entry.fields) == {"n", "s"}
    assert entry.payload == codec.payload_of(message)  # the encoding replies and the store carry
    assert entry.size == message.ByteSize()


def test_unset_value_names_its_field() -> None:
    with invalid("entries[1].fields['x']"):
        codec.new_entries(one_entry(x=pb.Value()), LIMITS)


def test_empty_field_name() -> None:
    with invalid("entries[1].fields['']"):
        codec.new_entries(one_entry(**{"": i(1)}), LIMITS)


def test_too_many_fields() -> None:
    limits = Limits(max_fields=2)
    with invalid("entries[1].fields"):
        codec.new_entries(one_entry(a=i(1), b=i(2), c=i(3)), limits)
    with invalid("templates[0].fields"):
        codec.templates([pb.Template(type_name="T", fields={"a": i(1), "b": i(2), "c": i(3)})], limits)
    codec.new_entries(one_entry(a=i(1), b=i(2)), limits)


@pytest.mark.parametrize("dtype", [pb.DTYPE_UNSPECIFIED, 99])
def test_bad_dtype(dtype: int) -> None:
    with invalid("entries[1].fields['x'].array_value.dtype"):
        codec.new_entries(one_entry(x=arr(dtype, b"")), LIMITS)


@pytest.mark.parametrize(
    ("dtype", "length"),
    [
        (pb.DTYPE_INT16, 3),
        (pb.DTYPE_INT32, 6),
        (pb.DTYPE_INT64, 12),
        (pb.DTYPE_FLOAT32, 2),
        (pb.DTYPE_FLOAT64, 7),
    ],
)
def test_array_length_must_be_whole_elements(dtype: int, length: int) -> None:
    with invalid("entries[1].fields['x'].array_value.data"):
        codec.new_entries(one_entry(x=arr(dtype, b"\0" * length)), LIMITS)


@pytest.mark.parametrize(
    ("dtype", "length"),
    [(pb.DTYPE_INT8, 3), (pb.DTYPE_UINT8, 0), (pb.DTYPE_INT32, 8), (pb.DTYPE_FLOAT64, 16)],
)
def test_valid_arrays(dtype: int, length: int) -> None:
    (entry,) = codec.new_entries([pb.Entry(type_name="T", fields={"x": arr(dtype, b"\1" * length)})], LIMITS)
    assert entry.fields["x"].data == b"\1" * length
    assert entry.fields["x"].kind.startswith("array:")


def test_errors_inside_lists_and_maps_name_the_element() -> None:
    with invalid("entries[1].fields['x'][1].array_value.data"):
        codec.new_entries(one_entry(x=lst(i(1), arr(pb.DTYPE_INT32, b"\0\0"))), LIMITS)
    with invalid("entries[1].fields['x'][0]"):
        codec.new_entries(one_entry(x=lst(pb.Value())), LIMITS)
    with invalid("entries[1].fields['x']['k']"):
        codec.new_entries(one_entry(x=mp(("k", pb.Value()))), LIMITS)


def test_duplicate_map_keys() -> None:
    with invalid("entries[1].fields['x']"):
        codec.new_entries(one_entry(x=mp(("a", i(1)), ("b", i(2)), ("a", i(3)))), LIMITS)
    with invalid("entries[1].fields['x'][0]"):
        codec.new_entries(one_entry(x=lst(mp(("a", i(1)), ("a", i(1))))), LIMITS)
    with invalid("templates[0].fields['x']"):
        codec.templates([pb.Template(type_name="T", fields={"x": mp(("a", i(1)), ("a", i(2)))})], LIMITS)


def test_lists_nested_deeper_than_max_depth_are_refused() -> None:
    limits = Limits(max_depth=3)
    too_deep = r"^entries\[1\]\.fields\['x'\][^:]*: .*max_depth=3"
    with pytest.raises(InvalidArgumentError, match=too_deep):
        codec.new_entries(one_entry(x=nested_lists(4, i(1))), limits)
    with pytest.raises(InvalidArgumentError, match=too_deep):
        codec.new_entries(one_entry(x=nested_lists(4, None)), limits)
    four_maps = mp(("a", mp(("b", mp(("c", mp()))))))
    with pytest.raises(InvalidArgumentError, match=too_deep):
        codec.new_entries(one_entry(x=four_maps), limits)
    codec.new_entries(one_entry(x=nested_lists(3, None)), limits)


def test_lists_nested_exactly_max_depth_with_values_are_accepted() -> None:
    limits = Limits(max_depth=3)
    codec.new_entries(one_entry(x=nested_lists(3, i(1))), limits)
    codec.new_entries(one_entry(x=lst(i(1))), Limits(max_depth=1))


# ---------------------------------------------------------------- templates


def test_templates_must_not_be_empty_or_too_many() -> None:
    with invalid("templates"):
        codec.templates([], LIMITS)
    with invalid("templates"):
        codec.templates([pb.Template(type_name="T")] * 3, Limits(max_templates=2))
    assert len(codec.templates([pb.Template(type_name="T")] * 2, Limits(max_templates=2))) == 2


def test_template_errors_name_the_template() -> None:
    with invalid("templates[0].type_name"):
        codec.templates([pb.Template(type_name="")], LIMITS)
    with invalid("templates[1].fields['x']"):
        codec.templates(
            [pb.Template(type_name="T"), pb.Template(type_name="T", fields={"x": pb.Value()})], LIMITS
        )
    with invalid("templates[0].fields['x'].array_value.dtype"):
        codec.templates([pb.Template(type_name="T", fields={"x": arr(0, b"")})], LIMITS)


def test_null_template_fields_are_wildcards() -> None:
    (template,) = codec.templates(
        [pb.Template(type_name="T", fields={"x": pb.Value(null_value=pb.Null()), "y": i(1)})], LIMITS
    )
    assert [name for name, _ in template.fields] == ["y"]


# ---------------------------------------------------------------- leases, timeouts, max_entries


@pytest.mark.parametrize("seconds", [-1.0, 0.0, -0.0, math.nan, math.inf, -math.inf])
def test_bad_lease_seconds(seconds: float) -> None:
    with invalid("lease.seconds"):
        codec.lease_duration(pb.WriteRequest(lease=pb.LeaseDuration(seconds=seconds)))
    with invalid("duration.seconds"):
        codec.lease_duration(pb.LeaseRenewal(duration=pb.LeaseDuration(seconds=seconds)), "duration")


def test_lease_forever_must_be_true() -> None:
    with invalid("lease.forever"):
        codec.lease_duration(pb.NotifyRequest(lease=pb.LeaseDuration(forever=False)))


def test_valid_leases() -> None:
    assert codec.lease_duration(pb.WriteRequest()) is None
    assert codec.lease_duration(pb.WriteRequest(lease=pb.LeaseDuration())) is None
    assert codec.lease_duration(pb.WriteManyRequest(lease=pb.LeaseDuration(seconds=2.5))) == 2.5
    assert codec.lease_duration(pb.WriteRequest(lease=pb.LeaseDuration(forever=True))) == math.inf
    renewal = pb.LeaseRenewal(id=3, duration=pb.LeaseDuration(seconds=7))
    assert codec.lease_duration(renewal, "duration") == 7


@pytest.mark.parametrize("seconds", [-0.001, math.nan, math.inf, -math.inf])
def test_bad_timeouts(seconds: float) -> None:
    with invalid("timeout"):
        codec.timeout(pb.MatchRequest(timeout=seconds), LIMITS)


def test_timeout_beyond_the_limit() -> None:
    with invalid("timeout"):
        codec.timeout(pb.MatchRequest(timeout=11), Limits(max_timeout=10))
    assert codec.timeout(pb.MatchRequest(timeout=10), Limits(max_timeout=10)) == 10


def test_valid_timeouts() -> None:
    assert codec.timeout(pb.MatchRequest(), LIMITS) is None
    assert codec.timeout(pb.MatchRequest(timeout=0), LIMITS) == 0
    assert codec.timeout(pb.MatchRequest(timeout=0.25), LIMITS) == 0.25


def test_max_entries() -> None:
    limits = Limits(max_batch=5)
    with invalid("max_entries"):
        codec.max_entries(pb.MatchRequest(max_entries=0), limits)
    with invalid("max_entries"):
        codec.max_entries(pb.MatchRequest(max_entries=6), limits)
    assert codec.max_entries(pb.MatchRequest(max_entries=1), limits) == 1
    assert codec.max_entries(pb.MatchRequest(max_entries=5), limits) == 5


def test_lease_message() -> None:
    forever = codec.lease_message(LeaseGrant(7, None, None))
    assert (forever.id, forever.expires_at, forever.HasField("granted_seconds")) == (7, 0.0, False)
    timed = codec.lease_message(LeaseGrant(8, 1000.5, 30.0))
    assert (timed.id, timed.expires_at, timed.granted_seconds) == (8, 1000.5, 30.0)


def test_a_write_many_reply_carries_each_grant_as_its_lease_message() -> None:
    grants = [LeaseGrant(7, None, None), LeaseGrant(8, 1000.5, 30.0), LeaseGrant(9, 1000.5, 30.0)]
    reply = codec.write_many_reply(grants)
    assert list(reply.leases) == [codec.lease_message(grant) for grant in grants]
    assert [lease.HasField("granted_seconds") for lease in reply.leases] == [False, True, True]


# ---------------------------------------------------------------- canonical values


def fv(value: pb.Value) -> object:
    return codec.field_value(value, "x", LIMITS)


def test_maps_in_any_order_are_equal() -> None:
    a = mp(("x", i(1)), ("y", s("two")), ("z", d(3.0)))
    b = mp(("z", d(3.0)), ("x", i(1)), ("y", s("two")))
    assert fv(a) == fv(b)
    assert hash(fv(a)) == hash(fv(b))
    assert fv(a) != fv(mp(("x", i(1)), ("y", s("two")), ("z", d(4.0))))
    assert fv(a) != fv(mp(("x", i(1)), ("y", s("two"))))


def test_nested_maps_in_any_order_are_equal() -> None:
    a = lst(mp(("a", mp(("p", i(1)), ("q", i(2)))), ("b", i(0))), i(5))
    b = lst(mp(("b", i(0)), ("a", mp(("q", i(2)), ("p", i(1))))), i(5))
    assert fv(a) == fv(b)
    assert fv(a) != fv(lst(i(5), mp(("b", i(0)), ("a", mp(("q", i(2)), ("p", i(1)))))))  # list order counts


def test_canonicalizing_leaves_the_request_untouched() -> None:
    value = mp(("b", i(1)), ("a", i(2)))
    before = value.SerializeToString()
    fv(value)
    assert value.SerializeToString() == before


def test_int_double_and_bool_are_different_values() -> None:
    values = [fv(i(1)), fv(d(1.0)), fv(pb.Value(bool_value=True))]
    assert len(set(values)) == 3
    assert values[0] != values[1] != values[2] != values[0]
    assert fv(lst(i(1))) != fv(lst(d(1.0)))
    assert fv(mp(("k", i(0)))) != fv(mp(("k", pb.Value(bool_value=False))))


def test_doubles_compare_by_bits() -> None:
    assert fv(d(0.0)) != fv(d(-0.0))
    assert fv(d(math.nan)) == fv(d(math.nan))
    assert fv(d(1.5)).data == struct.pack("<d", 1.5)  # type: ignore[attr-defined]


def test_kinds_and_arrays() -> None:
    assert fv(s("a")) != fv(pb.Value(bytes_value=b"a"))
    assert fv(arr(pb.DTYPE_INT8, b"\1")) != fv(arr(pb.DTYPE_UINT8, b"\1"))
    assert fv(arr(pb.DTYPE_INT8, b"\1")) != fv(pb.Value(bytes_value=b"\1"))
    assert fv(arr(pb.DTYPE_INT8, b"\1")) == fv(arr(pb.DTYPE_INT8, b"\1"))
    assert fv(pb.Value(null_value=pb.Null())) == NULL
    assert fv(lst()) != fv(mp())
