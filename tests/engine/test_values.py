"""FieldValue: equality by (kind, canonical data), and index keys that stay cheap for big values."""

from __future__ import annotations

import struct

import pytest

from outrig.service.engine.values import FULL_KEY_LIMIT, NULL, FieldValue


def double(x: float) -> FieldValue:
    return FieldValue("double", struct.pack("<d", x))


def test_int_double_and_bool_of_one_are_three_different_values() -> None:
    values = [FieldValue("int", 1), double(1.0), FieldValue("bool", True)]
    for i, a in enumerate(values):
        for j, b in enumerate(values):
            assert (a == b) is (i == j), (a, b)
    # Python's own 1 == 1.0 == True must not leak in through hashing either.
    assert len({value.key for value in values}) == 3
    assert len(set(values)) == 3


def test_zero_and_false_are_different_values() -> None:
    assert FieldValue("int", 0) != FieldValue("bool", False)
    assert FieldValue("int", 0) != double(0.0)


def test_negative_zero_differs_from_zero() -> None:
    assert double(-0.0) != double(0.0)
    assert double(-0.0).key != double(0.0).key


def test_nan_equals_the_same_bits_only() -> None:
    nan = struct.pack("<d", float("nan"))
    other_nan = struct.pack("<Q", 0x7FF8_0000_0000_0001)
    assert FieldValue("double", nan) == FieldValue("double", nan)
    assert hash(FieldValue("double", nan)) == hash(FieldValue("double", nan))
    assert FieldValue("double", nan) != FieldValue("double", other_nan)


def test_equal_values_built_separately_are_equal_and_hash_alike() -> None:
    a, b = FieldValue("string", "hello"), FieldValue("string", "hello")
    assert a is not b
    assert a == b
    assert hash(a) == hash(b)
    assert {a: 1}[b] == 1


def test_same_data_different_kind_differ() -> None:
    assert FieldValue("string", "x") != FieldValue("bytes", b"x")
    assert FieldValue("bytes", b"\x01") != FieldValue("array:uint8", b"\x01")
    assert FieldValue("array:int8", b"\x01") != FieldValue("array:uint8", b"\x01")


def test_null_equals_null_only() -> None:
    assert FieldValue("null", None) == NULL
    assert FieldValue("int", 0) != NULL
    assert FieldValue("string", "") != NULL


def test_comparison_with_other_types_is_not_equal() -> None:
    assert FieldValue("int", 1) != 1
    assert FieldValue("int", 1) != ("int", 1)


def test_small_value_is_its_own_key() -> None:
    data = b"x" * FULL_KEY_LIMIT
    assert FieldValue("bytes", data).key == ("bytes", data)


def _big(middle: bytes, length: int = 4 * FULL_KEY_LIMIT) -> bytes:
    head, tail = b"H" * 64, b"T" * 64
    return head + middle.ljust(length - 128, b".") + tail


def test_large_values_share_a_coarse_key_but_compare_by_full_data() -> None:
    a = FieldValue("bytes", _big(b"one"))
    b = FieldValue("bytes", _big(b"two"))
    assert isinstance(a.data, bytes) and isinstance(b.data, bytes)
    assert len(a.data) == len(b.data) > FULL_KEY_LIMIT
    assert a.key == b.key
    assert hash(a) == hash(b)
    assert a != b
    assert a == FieldValue("bytes", _big(b"one"))


def test_large_key_does_not_hold_the_whole_value() -> None:
    value = FieldValue("bytes", _big(b"", length=100_000))
    assert value.size == 100_000
    parts: tuple[object, ...] = value.key if isinstance(value.key, tuple) else (value.key,)
    assert sum(len(part) for part in parts if isinstance(part, bytes)) < 1000


@pytest.mark.parametrize("length", [FULL_KEY_LIMIT, FULL_KEY_LIMIT + 1])
def test_values_at_the_key_limit_compare_by_data(length: int) -> None:
    a = bytearray(b"a" * length)
    b = bytearray(a)
    b[length // 2] = ord("b")
    assert FieldValue("bytes", bytes(a)) != FieldValue("bytes", bytes(b))
    assert FieldValue("bytes", bytes(a)) == FieldValue("bytes", bytes(a))


def test_large_strings_compare_by_full_text() -> None:
    a = "h" * 40 + "A" * 300 + "t" * 40
    b = "h" * 40 + "B" * 300 + "t" * 40
    assert FieldValue("string", a).key == FieldValue("string", b).key
    assert FieldValue("string", a) != FieldValue("string", b)
    assert FieldValue("string", a) == FieldValue("string", "".join(list(a)))


def test_large_values_of_different_lengths_or_kinds_have_different_keys() -> None:
    assert FieldValue("bytes", b"x" * 300).key != FieldValue("bytes", b"x" * 301).key
    assert FieldValue("bytes", b"x" * 300).key != FieldValue("array:uint8", b"x" * 300).key
    assert FieldValue("bytes", b"x" * 300) != FieldValue("array:uint8", b"x" * 300)


def test_size_is_the_data_length() -> None:
    assert FieldValue("bytes", b"abc").size == 3
    assert FieldValue("bytes", b"a" * 1000).size == 1000
