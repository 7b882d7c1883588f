"""Python values, entries and templates to and from their protobuf messages. No I/O.

Python -> ``Value``:

==========================================  =====================================================
``None``                                    ``null_value`` (in a template, the field is omitted)
``bool``                                    ``bool_value`` (checked before int: True is not 1)
``int``                                     ``int_value``, int64 range
``float``                                   ``double_value``
``str``                                     ``string_value``
``bytes``, ``bytearray``, ``memoryview``    ``bytes_value``
``array.array`` (b h i l q B f d)           ``array_value``, little-endian
1-D ``numpy.ndarray`` (int8..64, uint8,     ``array_value``, little-endian; the shape is not sent,
float32/64), numpy scalars                  so other shapes are refused (``.ravel()`` them first)
``list``, ``tuple``                         ``list_value`` (decodes as ``list``)
``dict`` with ``str`` keys                  ``map_value``, sorted by key so equal dicts encode
                                            to identical bytes
==========================================  =====================================================

Typed arrays decode as ``numpy.ndarray`` (read-only, backed by the message's bytes; ``.copy()``
it to modify) when the entry class's field annotation mentions ``ndarray``, and as
``array.array`` otherwise. Anything else raises ``TypeError``, and an out-of-range int or an
unsupported array type ``ValueError``; both name the field.
"""

from __future__ import annotations

import array
import sys
from collections.abc import Callable, Iterable
from typing import Any

from google.protobuf.message import DecodeError

from outrig._entry import Entry, GenericEntry, entry_info, registered_class
from outrig._matchers import Matcher
from outrig.v1 import space_pb2 as pb

__all__ = [
    "AnyEntry",
    "decode_entries",
    "decode_entry",
    "decode_value",
    "encode_entry",
    "encode_entry_into",
    "encode_template",
    "encode_template_into",
    "encode_value",
    "entry_from_bytes",
    "entry_to_bytes",
    "iter_templates",
]

#: What reads return: an instance of a registered `Entry` class, or a `GenericEntry`.
AnyEntry = Entry | GenericEntry

_BIG_ENDIAN = sys.byteorder == "big"
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1

# (signed/unsigned/float kind, item size) -> DType. Shared by array.array and numpy, whose
# typecodes and dtypes differ by platform (array 'l' is 4 bytes on Windows, 8 elsewhere).
_DTYPE_BY_KIND: dict[tuple[str, int], pb.DType] = {
    ("i", 1): pb.DTYPE_INT8,
    ("i", 2): pb.DTYPE_INT16,
    ("i", 4): pb.DTYPE_INT32,
    ("i", 8): pb.DTYPE_INT64,
    ("u", 1): pb.DTYPE_UINT8,
    ("f", 4): pb.DTYPE_FLOAT32,
    ("f", 8): pb.DTYPE_FLOAT64,
}
# Ordered so that decoding picks the portable typecode: INT32 -> 'i', INT64 -> 'q'.
_KIND_OF_TYPECODE = {"b": "i", "h": "i", "i": "i", "q": "i", "l": "i", "B": "u", "f": "f", "d": "f"}
_DTYPE_OF_TYPECODE: dict[str, pb.DType] = {}
_TYPECODE_OF_DTYPE: dict[pb.DType, str] = {}
for _code, _kind in _KIND_OF_TYPECODE.items():
    _dtype = _DTYPE_BY_KIND.get((_kind, array.array(_code).itemsize))
    if _dtype is not None:
        _DTYPE_OF_TYPECODE[_code] = _dtype
        _TYPECODE_OF_DTYPE.setdefault(_dtype, _code)
_NUMPY_DTYPE_OF_DTYPE: dict[pb.DType, str] = {
    pb.DTYPE_INT8: "i1",
    pb.DTYPE_INT16: "<i2",
    pb.DTYPE_INT32: "<i4",
    pb.DTYPE_INT64: "<i8",
    pb.DTYPE_UINT8: "u1",
    pb.DTYPE_FLOAT32: "<f4",
    pb.DTYPE_FLOAT64: "<f8",
}


class _BadValueError(Exception):
    """Raised deep inside a value; re-raised as TypeError/ValueError naming the field and path.

    The path is collected while unwinding, so the happy path builds no strings.
    """

    def __init__(self, error: type[Exception], message: str) -> None:
        super().__init__(message)
        self.error = error
        self.message = message
        self.path: list[str] = []


# ---------------------------------------------------------------- encoding values


def encode_value(value: object, field: str = "value") -> pb.Value:
    """Encode one Python value as a ``Value`` message (``field`` names it in errors)."""
    target = pb.Value()
    _fill_field(target, value, field)
    return target


def _fill_field(target: pb.Value, value: object, field: str) -> None:
    try:
        _fill(target, value)
    except _BadValueError as bad:
        raise _named(bad, field) from None


def _named(bad: _BadValueError, field: str) -> Exception:
    """The TypeError or ValueError for a bad value, naming its field and where in it."""
    path = "".join(reversed(bad.path))
    return bad.error(f"field {field!r}{path}: {bad.message}")


def _fill(target: pb.Value, value: Any) -> None:
    filler = _FILLERS.get(type(value))
    if filler is None:
        filler = _filler_for_subclass(value)
    filler(target, value)


def _fill_none(target: pb.Value, value: None) -> None:
    target.null_value.SetInParent()


def _fill_bool(target: pb.Value, value: bool) -> None:
    target.bool_value = bool(value)


def _fill_int(target: pb.Value, value: int) -> None:
    if not _INT64_MIN <= value <= _INT64_MAX:
        raise _BadValueError(ValueError, f"int {value} is outside the int64 range")
    target.int_value = int(value)


def _fill_float(target: pb.Value, value: float) -> None:
    target.double_value = float(value)


def _fill_str(target: pb.Value, value: str) -> None:
    target.string_value = str(value)


def _fill_bytes(target: pb.Value, value: bytes | bytearray | memoryview) -> None:
    target.bytes_value = bytes(value)


def _fill_array(target: pb.Value, value: array.array[Any]) -> None:
    dtype = _DTYPE_OF_TYPECODE.get(value.typecode)
    if dtype is None:
        raise _BadValueError(
            ValueError,
            f"array.array typecode {value.typecode!r} is not supported "
            f"(use one of {''.join(_DTYPE_OF_TYPECODE)})",
        )
    if _BIG_ENDIAN and value.itemsize > 1:
        value = array.array(value.typecode, value)  # swap a copy, never the caller's array
        value.byteswap()
    target.array_value.dtype = dtype
    target.array_value.data = value.tobytes()


def _fill_list(target: pb.Value, value: list[Any] | tuple[Any, ...]) -> None:
    items = target.list_value.items
    target.list_value.SetInParent()  # an empty list is still a list, not an unset value
    for index, item in enumerate(value):
        try:
            _fill(items.add(), item)
        except _BadValueError as bad:
            bad.path.append(f"[{index}]")
            raise


def _fill_dict(target: pb.Value, value: dict[Any, Any]) -> None:
    items = target.map_value.items
    target.map_value.SetInParent()
    for key in value:
        if not isinstance(key, str):
            raise _BadValueError(TypeError, f"dict keys must be str, got {type(key).__name__} {key!r}")
    for key in sorted(value):  # canonical: equal dicts give identical bytes
        try:
            _fill(items.add(key=key).value, value[key])
        except _BadValueError as bad:
            bad.path.append(f"[{key!r}]")
            raise


def _fill_numpy(target: pb.Value, value: Any) -> None:
    numpy = sys.modules["numpy"]  # loaded already: the value is a numpy object
    if isinstance(value, numpy.generic):  # a numpy scalar: encode the Python number it holds
        _fill(target, value.item())
        return
    if not isinstance(value, numpy.ndarray):
        raise _BadValueError(TypeError, f"cannot encode {type(value).__module__}.{type(value).__qualname__}")
    dt = value.dtype
    dtype = _DTYPE_BY_KIND.get((dt.kind, dt.itemsize))
    if dtype is None:
        raise _BadValueError(
            ValueError, f"numpy dtype {dt} is not supported (int8/16/32/64, uint8, float32/64)"
        )
    if value.ndim != 1:
        raise _BadValueError(
            ValueError, f"numpy arrays must be 1-D (the shape is not sent), got shape {value.shape}"
        )
    target.array_value.dtype = dtype
    # One C-level conversion and copy; no Python work per element.
    target.array_value.data = value.astype(dt.newbyteorder("<"), copy=False).tobytes()


_FILLERS: dict[type, Callable[[pb.Value, Any], None]] = {
    type(None): _fill_none,
    bool: _fill_bool,
    int: _fill_int,
    float: _fill_float,
    str: _fill_str,
    bytes: _fill_bytes,
    bytearray: _fill_bytes,
    memoryview: _fill_bytes,
    array.array: _fill_array,
    list: _fill_list,
    tuple: _fill_list,
    dict: _fill_dict,
}


def _filler_for_subclass(value: object) -> Callable[[pb.Value, Any], None]:
    """The slow path, for subclasses (IntEnum, StrEnum, OrderedDict, numpy.float64) and numpy."""
    # Before the isinstance checks; numpy.float64 is a float and takes the float path below.
    if type(value).__module__.partition(".")[0] == "numpy" and not isinstance(value, float):
        return _fill_numpy
    for kind in (bool, int, float, str, bytes, bytearray, memoryview, array.array, list, tuple, dict):
        if isinstance(value, kind):
            return _FILLERS[kind]
    raise _BadValueError(TypeError, f"cannot encode a value of type {type(value).__qualname__}")


# ---------------------------------------------------------------- encoding entries


def encode_entry_into(target: pb.Entry, entry: AnyEntry) -> None:
    """Encode an entry into ``target`` (an empty ``Entry`` message, such as a request's field).

    Every field is sent; ``None`` is sent as null.
    """
    # The cached EntryInfo read inline (entry_info's hit), one try around the whole loop and
    # the filler looked up here: each is a Python call fewer per field of every entry written.
    info = type(entry).__dict__.get("_outrig_info")
    if info is None:
        if isinstance(entry, GenericEntry):
            target.type_name = entry.type_name
            target.supertypes.extend(entry.supertypes)
            for name, value in entry.fields.items():
                _fill_field(target.fields[name], value, name)
            return
        info = entry_info(_entry_class(entry))
    target.type_name = info.type_name
    if info.supertypes:
        target.supertypes.extend(info.supertypes)
    fields = target.fields
    name = ""
    try:
        for name, _ in info.fields:
            value = getattr(entry, name)
            (_FILLERS.get(type(value)) or _filler_for_subclass(value))(fields[name], value)
    except _BadValueError as bad:
        raise _named(bad, name) from None


def encode_template_into(target: pb.Template, template: AnyEntry) -> None:
    """Encode a template into ``target``: fields that are ``None`` are left out (wildcards), and
    matchers (`outrig.GE(5)`, ...) go to its ``matchers``."""
    info = type(template).__dict__.get("_outrig_info")  # as in encode_entry_into
    if info is None:
        if isinstance(template, GenericEntry):
            _encode_generic_template(target, template)
            return
        info = entry_info(_entry_class(template))
    target.type_name = info.type_name
    fields = target.fields
    name = ""
    try:
        for name, _ in info.fields:
            value = getattr(template, name)
            if value is None:
                continue
            filler = _FILLERS.get(type(value))  # before the Matcher check: plain values are most
            if filler is not None:
                filler(fields[name], value)
            elif isinstance(value, Matcher):
                value.fill(target.matchers[name], encode_value, name)
            else:
                _filler_for_subclass(value)(fields[name], value)
    except _BadValueError as bad:
        raise _named(bad, name) from None


def _encode_generic_template(target: pb.Template, template: GenericEntry) -> None:
    target.type_name = template.type_name
    fields = target.fields
    for name, value in template.fields.items():
        if value is None:
            continue
        if isinstance(value, Matcher):
            value.fill(target.matchers[name], encode_value, name)
        else:
            _fill_field(fields[name], value, name)


def encode_entry(entry: AnyEntry) -> pb.Entry:
    """Encode an entry as a new ``Entry`` message."""
    target = pb.Entry()
    encode_entry_into(target, entry)
    return target


def encode_template(template: AnyEntry) -> pb.Template:
    """Encode a template as a new ``Template`` message."""
    target = pb.Template()
    encode_template_into(target, template)
    return target


def iter_templates(templates: AnyEntry | Iterable[AnyEntry]) -> Iterable[AnyEntry]:
    """Normalise one template or a collection of them (any match qualifies) to an iterable."""
    if isinstance(templates, Entry | GenericEntry):
        return (templates,)
    if isinstance(templates, type):
        raise TypeError(f"expected an entry or a list of entries, got the class {templates.__qualname__}")
    try:
        return list(templates)
    except TypeError:
        raise TypeError(
            f"expected an entry or a list of entries, got {type(templates).__qualname__}"
        ) from None


def _entry_class(entry: object) -> type[Entry]:
    if not isinstance(entry, Entry):
        raise TypeError(f"expected an outrig.Entry or GenericEntry, got {type(entry).__qualname__}")
    return type(entry)


# ---------------------------------------------------------------- decoding


def decode_value(value: pb.Value, numpy: bool = False) -> Any:
    """Decode a ``Value``; typed arrays become numpy arrays if ``numpy``, else ``array.array``."""
    kind = value.WhichOneof("kind")
    if kind is None:
        return None
    if kind in _SCALARS:
        return getattr(value, kind)
    return _DECODERS[kind](value, numpy)


def _decode_array(value: pb.Value, numpy: bool) -> Any:
    typed = value.array_value
    if numpy:
        import numpy as np  # only reached for classes that declared ndarray fields

        return np.frombuffer(typed.data, dtype=_NUMPY_DTYPE_OF_DTYPE[typed.dtype])
    typecode = _TYPECODE_OF_DTYPE.get(typed.dtype)
    if typecode is None:
        raise ValueError(f"unknown array dtype {typed.dtype}")
    result = array.array(typecode)
    result.frombytes(typed.data)
    if _BIG_ENDIAN and result.itemsize > 1:
        result.byteswap()
    return result


#: The kinds whose value is the field itself: read with getattr, no decoder call.
_SCALARS = frozenset({"bool_value", "int_value", "double_value", "string_value", "bytes_value"})
_DECODERS: dict[str, Callable[[pb.Value, bool], Any]] = {
    "null_value": lambda v, numpy: None,
    "array_value": _decode_array,
    "list_value": lambda v, numpy: [decode_value(item, numpy) for item in v.list_value.items],
    "map_value": lambda v, numpy: {item.key: decode_value(item.value, numpy) for item in v.map_value.items},
}


def decode_entry(message: pb.Entry) -> AnyEntry:
    """Decode an ``Entry`` message as its registered class, or as a `GenericEntry`."""
    type_name = message.type_name
    cls = registered_class(type_name)
    fields = message.fields
    if cls is None:
        return GenericEntry(
            type_name,
            tuple(message.supertypes),
            {name: decode_value(fields[name]) for name in sorted(fields)},
        )
    info = cls.__dict__.get("_outrig_info") or entry_info(cls)  # entry_info's hit, inline
    # Rebuilt without __init__ (works for frozen, slots and init=False fields alike).
    entry = object.__new__(cls)
    setattr_ = object.__setattr__
    get = fields.get
    for name, numpy in info.fields:
        value = get(name)
        if value is None:
            setattr_(entry, name, None)
            continue
        # decode_value inline: one call fewer per field of every entry read.
        kind = value.WhichOneof("kind")
        if kind in _SCALARS:
            setattr_(entry, name, getattr(value, kind))
        else:
            setattr_(entry, name, None if kind is None else _DECODERS[kind](value, numpy))
    return entry


def decode_entries(messages: Iterable[pb.Entry]) -> list[AnyEntry]:
    """Decode a sequence of ``Entry`` messages."""
    return [decode_entry(message) for message in messages]


# ---------------------------------------------------------------- entries as bytes (public)


def entry_to_bytes(entry: AnyEntry) -> bytes:
    """Encode an entry as bytes: the serialized ``outrig.v1.Entry`` message a write sends.

    For entries kept or shipped outside a space (a file, a queue, another program, which can
    parse them with the protocol's ``Entry`` message); `entry_from_bytes` rebuilds the entry.
    Every field is encoded, ``None`` as null, by the rules of a write, which also raise here:
    ``TypeError`` or ``ValueError`` naming the field. Equal entries give identical bytes, and
    ``len()`` of them is the entry's size in a request.
    """
    # deterministic: the fields are a protobuf map, whose order is otherwise unspecified.
    return encode_entry(entry).SerializeToString(deterministic=True)


def entry_from_bytes(data: bytes) -> AnyEntry:
    """Rebuild an entry from `entry_to_bytes`'s bytes (or any serialized ``outrig.v1.Entry``).

    As a read does, it returns the entry's registered class, or a `GenericEntry` when its type
    has no class in this process. Bytes that do not parse as an ``Entry``, or parse as one with
    no type name (as ``b""`` does), raise ``ValueError``.
    """
    try:
        message = pb.Entry.FromString(data)
    except DecodeError as err:
        raise ValueError("the bytes are not an encoded outrig.v1.Entry") from err
    if not message.type_name:
        raise ValueError("the bytes are not an encoded outrig.v1.Entry: they carry no type name")
    return decode_entry(message)
