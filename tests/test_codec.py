"""The client's pure parts: values, arrays, requests and replies, and the error table. No server."""

from __future__ import annotations

import array
import builtins
import struct
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

import grpc
import grpc.aio
import numpy as np
import pytest

import outrig
from outrig._base import rpc_errors
from outrig._codec import decode_entry, decode_value, encode_entry, encode_value
from outrig._exceptions import error_from_code, error_from_rpc, error_from_status
from outrig.v1 import space_pb2 as pb

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


@dataclass
class Task(outrig.Entry, type_name="tests.codec.Task"):
    job: str | None = None
    n: int | None = None


@dataclass
class Signal(outrig.Entry, type_name="tests.codec.Signal"):
    samples: np.ndarray | None = None
    window: array.array | None = None
    anything: Any = None


# ---------------------------------------------------------------- scalar and container values

ROUND_TRIPS = [
    None,
    True,
    False,
    0,
    -1,
    INT64_MIN,
    INT64_MAX,
    1.5,
    float("inf"),
    "",
    "héllo ☃",
    b"",
    b"\x00\xff",
    [],
    [1, "a", None, [2.5, b"x"]],
    {},
    {"b": [True, {"c": None}], "a": 1},
]


@pytest.mark.parametrize("value", ROUND_TRIPS, ids=repr)
def test_value_round_trip(value: object) -> None:
    decoded = decode_value(pb.Value.FromString(encode_value(value).SerializeToString()))
    assert decoded == value
    assert type(decoded) is type(value)


def test_one_one_point_zero_and_true_are_three_different_values() -> None:
    kinds = [encode_value(v).WhichOneof("kind") for v in (1, 1.0, True)]
    assert kinds == ["int_value", "double_value", "bool_value"]
    assert len({encode_value(v).SerializeToString() for v in (1, 1.0, True)}) == 3


def test_bytes_like_values_decode_as_bytes_and_tuples_as_lists() -> None:
    for value in (bytearray(b"ab"), memoryview(b"ab")):
        assert decode_value(encode_value(value)) == b"ab"
    assert decode_value(encode_value((1, (2,)))) == [1, [2]]


def test_empty_containers_are_set_not_absent() -> None:
    assert encode_value([]).WhichOneof("kind") == "list_value"
    assert encode_value({}).WhichOneof("kind") == "map_value"


def test_dict_encoding_is_canonical() -> None:
    one = encode_value({"b": 1, "a": {"y": 2, "x": 3}})
    other = encode_value({"a": {"x": 3, "y": 2}, "b": 1})
    assert one.SerializeToString() == other.SerializeToString()
    assert [item.key for item in one.map_value.items] == ["a", "b"]


def test_subclasses_of_supported_types_encode() -> None:
    import enum

    class Color(enum.IntEnum):
        RED = 1

    assert encode_value(Color.RED) == encode_value(1)
    assert encode_value(np.float64(2.5)) == encode_value(2.5)
    assert encode_value(np.int16(7)) == encode_value(7)
    assert encode_value(np.bool_(True)) == encode_value(True)


@pytest.mark.parametrize("value", [INT64_MAX + 1, INT64_MIN - 1])
def test_int_outside_int64_raises_value_error_naming_the_field(value: int) -> None:
    with pytest.raises(ValueError, match=r"field 'n'.*int64"):
        encode_entry(Task(n=value))


@pytest.mark.parametrize(
    "value", [object(), {1, 2}, 1j, frozenset()], ids=["object", "set", "complex", "frozenset"]
)
def test_unsupported_type_raises_type_error_naming_field_and_type(value: object) -> None:
    with pytest.raises(TypeError, match=f"field 'job'.*{type(value).__name__}"):
        encode_entry(Task(job=value))  # type: ignore[arg-type]


def test_errors_inside_containers_give_the_path() -> None:
    with pytest.raises(TypeError, match=r"field 'anything'\['a'\]\[1\]: cannot encode .*object"):
        encode_entry(Signal(anything={"a": [1, object()]}))
    with pytest.raises(TypeError, match=r"field 'anything'.*dict keys must be str"):
        encode_entry(Signal(anything={1: "x"}))


# ---------------------------------------------------------------- typed arrays

ARRAY_TYPECODES = {
    "b": pb.DTYPE_INT8,
    "h": pb.DTYPE_INT16,
    "i": pb.DTYPE_INT32,
    "q": pb.DTYPE_INT64,
    "B": pb.DTYPE_UINT8,
    "f": pb.DTYPE_FLOAT32,
    "d": pb.DTYPE_FLOAT64,
}
if array.array("l").itemsize == 8:
    ARRAY_TYPECODES["l"] = pb.DTYPE_INT64
# struct's standard-size format code of each dtype ('l' is 4 bytes there, 8 in array on Linux).
STANDARD_CODE = {dtype: code for code, dtype in ARRAY_TYPECODES.items() if code != "l"}
NUMPY_DTYPES = {
    "int8": pb.DTYPE_INT8,
    "int16": pb.DTYPE_INT16,
    "int32": pb.DTYPE_INT32,
    "int64": pb.DTYPE_INT64,
    "uint8": pb.DTYPE_UINT8,
    "float32": pb.DTYPE_FLOAT32,
    "float64": pb.DTYPE_FLOAT64,
}


@pytest.mark.parametrize(("typecode", "dtype"), ARRAY_TYPECODES.items())
def test_array_array_round_trips_as_array_array(typecode: str, dtype: pb.DType) -> None:
    values = array.array(typecode, [0, 1, 2, 100])
    message = encode_value(values)
    assert message.array_value.dtype == dtype
    assert message.array_value.data == struct.pack(f"<4{STANDARD_CODE[dtype]}", *values)  # little-endian
    decoded = decode_entry(encode_entry(Signal(window=values)))
    assert isinstance(decoded, Signal)
    assert isinstance(decoded.window, array.array)
    assert decoded.window.itemsize == values.itemsize
    assert decoded.window == values
    # A field declared as ndarray gets a numpy array from the same wire value.
    as_numpy = decode_entry(encode_entry(Signal(samples=values)))  # type: ignore[arg-type]
    assert isinstance(as_numpy, Signal)
    assert isinstance(as_numpy.samples, np.ndarray)
    assert as_numpy.samples.tolist() == values.tolist()


@pytest.mark.parametrize("typecode", ["H", "I", "L", "Q"])
def test_unsupported_array_typecodes_raise_value_error(typecode: str) -> None:
    with pytest.raises(ValueError, match=f"field 'window'.*typecode '{typecode}'"):
        encode_entry(Signal(window=array.array(typecode, [1])))


@pytest.mark.parametrize(("name", "dtype"), NUMPY_DTYPES.items())
def test_numpy_round_trips_as_numpy_with_its_dtype(name: str, dtype: pb.DType) -> None:
    values = np.array([0, 1, 2, 100], dtype=name)
    message = encode_value(values)
    assert message.array_value.dtype == dtype
    assert message.array_value.data == values.astype(values.dtype.newbyteorder("<")).tobytes()
    decoded = decode_entry(encode_entry(Signal(samples=values)))
    assert isinstance(decoded, Signal)
    assert isinstance(decoded.samples, np.ndarray)
    assert decoded.samples.dtype == values.dtype
    assert np.array_equal(decoded.samples, values)
    # A field declared as array.array gets one from the same wire value.
    as_stdlib = decode_entry(encode_entry(Signal(window=values)))  # type: ignore[arg-type]
    assert isinstance(as_stdlib, Signal)
    assert isinstance(as_stdlib.window, array.array)
    assert as_stdlib.window.tolist() == values.tolist()


def test_numpy_arrays_are_sent_little_endian_whatever_their_layout() -> None:
    big = np.array([1, 256], dtype=">i4")
    assert encode_value(big).array_value.data == struct.pack("<2i", 1, 256)
    strided = np.arange(10, dtype=np.int16)[::3]
    assert encode_value(strided).array_value.data == struct.pack("<4h", 0, 3, 6, 9)


def test_numpy_arrays_inside_containers_follow_the_field_annotation() -> None:
    decoded = decode_entry(encode_entry(Signal(anything=[np.arange(3, dtype=np.float32)])))
    assert isinstance(decoded, Signal)
    assert decoded.anything == [array.array("f", [0.0, 1.0, 2.0])]


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (np.zeros((2, 2)), "must be 1-D"),
        (np.zeros(3, dtype=bool), "dtype bool is not supported"),
        (np.zeros(3, dtype=np.uint16), "dtype uint16 is not supported"),
        (np.zeros(3, dtype=np.complex64), "dtype complex64 is not supported"),
    ],
)
def test_unsupported_numpy_arrays_raise_value_error(value: Any, message: str) -> None:
    with pytest.raises(ValueError, match=f"field 'samples'.*{message}"):
        encode_entry(Signal(samples=value))


def test_numpy_is_not_imported_for_entries_without_arrays() -> None:
    script = (
        "import sys, dataclasses, outrig\n"
        "from outrig._codec import encode_entry, decode_entry\n"
        "@dataclasses.dataclass\n"
        "class T(outrig.Entry):\n"
        "    a: list | None = None\n"
        "decode_entry(encode_entry(T(a=[1, 'x', {'k': b''}])))\n"
        "assert 'numpy' not in sys.modules, 'numpy was imported'\n"
    )
    subprocess.run([sys.executable, "-c", script], check=True)


# ---------------------------------------------------------------- the error table


@pytest.mark.parametrize("status", [s for s in grpc.StatusCode if s is not grpc.StatusCode.OK], ids=str)
def test_every_grpc_status_maps_to_its_own_exported_class(status: Any) -> None:
    error = error_from_status(status, "why")
    assert isinstance(error, outrig.OutrigError)
    assert (error.code, error.details, str(error)) == (status, "why", "why")
    assert getattr(outrig, type(error).__name__) is type(error)
    assert type(error_from_code(status.value[0], "why")) is type(error)
    assert type(error).code == status


def test_error_classes_are_distinct_and_do_not_shadow_builtins() -> None:
    classes = {type(error_from_status(s, "")) for s in grpc.StatusCode if s is not grpc.StatusCode.OK}
    assert len(classes) == len(grpc.StatusCode) - 1
    assert not [name for name in outrig.__all__ if hasattr(builtins, name)]


def test_unknown_status_numbers_and_ok_map_to_unknown_status_error() -> None:
    error = error_from_code(99, "odd")
    assert isinstance(error, outrig.UnknownStatusError)
    assert "99" in str(error)
    assert type(error_from_status(grpc.StatusCode.OK, "")) is outrig.UnknownStatusError


class FakeRpcError(grpc.RpcError):
    def code(self) -> Any:
        return grpc.StatusCode.NOT_FOUND

    def details(self) -> str:
        return "no lease 7"


def test_the_grpc_boundary_maps_and_chains_errors() -> None:
    original = FakeRpcError()
    with pytest.raises(outrig.NotFoundError, match="no lease 7") as caught, rpc_errors:
        raise original
    assert caught.value.__cause__ is original
    aio_error = grpc.aio.AioRpcError(
        grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(), "down"
    )
    assert isinstance(error_from_rpc(aio_error), outrig.UnavailableError)
    assert isinstance(error_from_rpc(grpc.RpcError()), outrig.UnknownStatusError)
    with pytest.raises(KeyError), rpc_errors:  # other errors pass through untouched
        raise KeyError("x")


# ---------------------------------------------------------------- channel options (outrig.channel_options)


def test_channel_options_are_connects_reconnect_and_size_limits() -> None:
    options = outrig.channel_options()
    assert dict(options) == {
        "grpc.max_receive_message_length": 64 * 1024 * 1024,
        "grpc.max_send_message_length": 64 * 1024 * 1024,
        "grpc.initial_reconnect_backoff_ms": 100,
        "grpc.min_reconnect_backoff_ms": 100,
        "grpc.max_reconnect_backoff_ms": 1000,
    }
    assert len(options) == len(dict(options))  # each name once, so no option shadows another


def test_channel_options_take_a_size_and_the_callers_own_which_win() -> None:
    own = [("grpc.max_reconnect_backoff_ms", 5000), ("grpc.ssl_target_name_override", "db")]
    options = outrig.channel_options(1024, own)
    assert options[-2:] == own
    assert dict(options)["grpc.max_reconnect_backoff_ms"] == 5000
    assert [name for name, _ in options].count("grpc.max_reconnect_backoff_ms") == 1
    assert dict(outrig.channel_options(max_message_bytes=1024))["grpc.max_send_message_length"] == 1024
    with pytest.raises(TypeError, match="max_message_bytes"):
        outrig.channel_options(True)


def test_a_space_wraps_a_channel_made_with_the_channel_options() -> None:
    channel = grpc.insecure_channel("127.0.0.1:1", options=outrig.channel_options())
    with outrig.Space(channel, "jobs", owns_channel=True, retry_deadline=0) as space:
        assert space.name == "jobs"


# ---------------------------------------------------------------- arguments checked before any call
# (Requests and replies are exercised against a real server in tests/integration.)


def test_bad_arguments_raise_before_any_call() -> None:
    # Nothing listens on port 1: a call that reached the network would be UnavailableError
    # (at once: no retries).
    with outrig.connect("127.0.0.1:1", space="jobs", retry_deadline=0) as space:
        with pytest.raises(TypeError, match="timeout"):
            space.read(Task(), timeout="1")  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="lease"):
            space.write(Task(), lease=True)
        with pytest.raises(TypeError, match="the class Task"):
            space.count(Task)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="max_entries"):
            list(space.contents(Task(), max_entries=-1))
        with pytest.raises(ValueError, match="belongs to space 'jobs'"):
            space.with_space("other").cancel_many([outrig.Lease(space, pb.Lease(id=1))])
        with pytest.raises(outrig.UnavailableError):
            space.count(Task())


def test_lease_sentinels() -> None:
    assert len({outrig.FOREVER, outrig.ANY}) == 2
    assert repr(outrig.FOREVER) == "outrig.FOREVER"
