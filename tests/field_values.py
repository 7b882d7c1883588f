"""Engine `FieldValue`s from plain Python scalars, for tests that build entries by hand."""

from __future__ import annotations

import struct

from outrig.service.engine.values import NULL, FieldValue


def value(x: object) -> FieldValue:
    """The engine's value for a scalar, as the codec would make it from the protobuf value."""
    if x is None:
        return NULL
    if isinstance(x, bool):
        return FieldValue("bool", x)
    if isinstance(x, int):
        return FieldValue("int", x)
    if isinstance(x, float):
        return FieldValue("double", struct.pack("<d", x))
    if isinstance(x, str):
        return FieldValue("string", x)
    assert isinstance(x, bytes)
    return FieldValue("bytes", x)
