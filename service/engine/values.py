"""Field values as the engine sees them: a kind and canonical data, compared by equality.

The engine never looks inside a value. Two values are equal when their kinds and canonical data
are equal, so int 1, double 1.0 and bool true are three different values (JavaSpaces compares
serialized forms). Doubles are kept as their 8 IEEE bytes, so -0.0 != 0.0 and a NaN equals
itself bit for bit. Lists and maps are kept as their canonical encoding.

Index keys: a small value is its own key. A large one (an HD array, a long string) is keyed by
its kind, length and a few bytes from each end, so filing an entry never hashes its whole payload
(lessons.md, section 2); candidates from that bucket are then compared in full.
"""

from __future__ import annotations

from collections.abc import Hashable

# Values whose data is at most this many bytes (or characters) are their own index key.
FULL_KEY_LIMIT = 256
_SAMPLE = 32


class FieldValue:
    """One field's value: `kind` names the value type, `data` is its canonical, hashable form.

    Kinds: "null", "bool", "int", "double" (8 bytes), "string", "bytes", "array:<dtype>" (packed
    little-endian bytes), "list" and "map" (canonical encoded bytes). A large array's data may be
    a memoryview into the stored entry's payload, so it is not held twice.
    """

    __slots__ = ("data", "key", "kind", "size")

    def __init__(self, kind: str, data: bool | int | str | bytes | memoryview | None) -> None:
        self.kind = kind
        self.data = data
        cls = type(data)
        if cls is int or cls is bool or data is None:  # the common case first: no length to take
            self.size = 8
            self.key: Hashable = (kind, data)
        elif isinstance(data, str | bytes):
            self.size = len(data)
            self.key = (
                (kind, len(data), data[:_SAMPLE], data[-_SAMPLE:])
                if len(data) > FULL_KEY_LIMIT
                else (kind, data)
            )
        elif isinstance(data, memoryview):  # a view into the stored entry: key by copies
            self.size = len(data)
            if len(data) > FULL_KEY_LIMIT:
                self.key = (kind, len(data), bytes(data[:_SAMPLE]), bytes(data[-_SAMPLE:]))
            else:
                self.key = (kind, bytes(data))
        else:
            self.size = 8
            self.key = (kind, data)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, FieldValue):
            return NotImplemented
        return self.key == other.key and (self.size <= FULL_KEY_LIMIT or self.data == other.data)

    def __hash__(self) -> int:
        return hash(self.key)

    def __repr__(self) -> str:
        data = bytes(self.data) if isinstance(self.data, memoryview) else self.data
        shown = data if self.size <= 64 else f"<{self.size} bytes>"
        return f"FieldValue({self.kind!r}, {shown!r})"


NULL = FieldValue("null", None)
