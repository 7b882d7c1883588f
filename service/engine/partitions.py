"""Partitions of a space: their names, the routing hash, and the ids each one hands out.

A space declared partitioned (`Partitioning`: a routing field and a count P) is served as P
spaces of its own, named `partition_name(space, k)` ("jobs~3": '~' is no character of a space
name, so no client can name one), each owned, recorded, fenced and taken over as any space is.
An entry lives in the partition of its routing field's value (`partition_of`); a template with
that field set equal to a value looks in that partition alone.

Ids: every partition of a space numbers its leases, entries and transactions in a class of its
own modulo `ID_STRIDE` (`IdClass`), so an id names its partition (`partition_of_id`) and a lease
or transaction id handed out by one partition is never another's: a renewal, a cancel or a commit
finds its partition from the id alone. An unpartitioned space numbers 1, 2, 3, ... as always.

The hash (docs/scaling.md gives it for other languages): the first 8 bytes of BLAKE2b over the
value's kind, a zero byte and its canonical data (an int or a bool in decimal ASCII, a string in
UTF-8, anything else its canonical bytes), read big-endian, modulo P.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass

from outrig.service.engine.model import Template
from outrig.service.engine.values import FieldValue

#: '~' cannot appear in a space's name, so a partition's name is nobody's space.
SEPARATOR = "~"
#: The most partitions a space may have, and the stride of a partition's ids.
MAX_PARTITIONS = 1024
ID_STRIDE = MAX_PARTITIONS


@dataclass(frozen=True, slots=True)
class Partitioning:
    """How a space is split: by the value of the field `field` into `count` partitions."""

    field: str
    count: int

    def names(self, space: str) -> list[str]:
        return [partition_name(space, k) for k in range(self.count)]


def partition_name(space: str, k: int) -> str:
    return f"{space}{SEPARATOR}{k}"


def dead_letter_name(space: str, dead_letter: str = "") -> str:
    """The dead-letter space of `space` (docs/work-queues.md): `dead_letter`, or "<space>.dead";
    a partition's is that space's partition of the same number ("jobs~3" -> "jobs.dead~3")."""
    base, k = split_name(space)
    dead = dead_letter or f"{base}.dead"
    return dead if k is None else partition_name(dead, k)


def split_name(name: str) -> tuple[str, int | None]:
    """(space, k) for a partition's name; (name, None) for any other name."""
    space, sep, number = name.rpartition(SEPARATOR)
    if not sep or not number.isdigit():
        return name, None
    return space, int(number)


def routing_bytes(value: FieldValue) -> bytes:
    data = value.data
    if isinstance(data, bool | int):
        canonical = str(int(data)).encode()
    elif isinstance(data, str):
        canonical = data.encode()
    elif data is None:
        canonical = b""
    else:
        canonical = bytes(data)
    return value.kind.encode() + b"\0" + canonical


def partition_of(value: FieldValue, count: int) -> int:
    """The partition (0 <= k < count) of an entry whose routing field holds `value`."""
    if count == 1:
        return 0
    digest = hashlib.blake2b(routing_bytes(value), digest_size=8).digest()
    return int.from_bytes(digest, "big") % count


def template_partitions(templates: Iterable[Template], partitioning: Partitioning) -> set[int] | None:
    """The partitions engine templates can match in (a routing field equal to a value, or to one
    of a set); None: any (one of them leaves the field open)."""
    found: set[int] = set()
    for template in templates:
        fields = dict(template.fields)
        matchers = dict(template.matchers)
        value = fields.get(partitioning.field)
        matcher = matchers.get(partitioning.field)
        values = (value,) if value is not None else (None if matcher is None else matcher.equals())
        if values is None:
            return None
        found.update(partition_of(v, partitioning.count) for v in values)
    return found


def partition_of_id(lease_id: int) -> int:
    """The partition that handed out a lease, entry or transaction id of a partitioned space."""
    return lease_id % ID_STRIDE


@dataclass(frozen=True, slots=True)
class IdClass:
    """The ids a space hands out: `offset` + n * `stride`, from `first`."""

    stride: int = 1
    offset: int = 0

    def first(self) -> int:
        """The first id: 1, or a partition's first at or above the stride, so that an id (or a
        browse cursor) below the stride never names an entry of a partition."""
        return self.at_least(1 if self.stride == 1 else self.stride)

    def at_least(self, value: int) -> int:
        """The smallest id of the class that is at least `value`."""
        if self.stride == 1:
            return value
        return value + (self.offset - value) % self.stride


PLAIN_IDS = IdClass()


def ids_of(name: str) -> IdClass:
    """The id class of the space or partition named `name`."""
    _, k = split_name(name)
    return PLAIN_IDS if k is None else IdClass(ID_STRIDE, k)
