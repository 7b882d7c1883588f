"""Which partition of a partitioned space a call concerns, as the server decides it.

A partitioned space (docs/scaling.md) tells the SDK its routing field and number of partitions in
its Locate reply. A call whose entries or templates all hold routing values of one partition, or
that acts under a transaction (or on leases) of one partition, goes straight to that partition's
server; any other goes to the server given to `connect`, which fans it out.

The hash is the server's (outrig.service.engine.partitions): the first 8 bytes of BLAKE2b over
the value's kind, a zero byte and its canonical data, big-endian, modulo the partition count. The
SDK computes it for scalar values (int, bool, float, str, bytes); a call routed by any other kind
goes to the given server, which routes it.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterable
from typing import Any

from outrig.v1 import space_pb2 as pb

#: A partition's ids are its number modulo this (the server's ID_STRIDE).
ID_STRIDE = 1024

_pack_double = struct.Struct("<d").pack


#: Routing values seen lately and their partitions: hot values repeat (a region, a customer), and
#: a lookup costs a fifth of the hash. Emptied when full (no process keeps more than this).
_SEEN: dict[tuple[str, Any, int], int] = {}
_SEEN_MAX = 1 << 16


def value_partition(value: pb.Value, count: int) -> int | None:
    """The partition of an entry whose routing field holds `value`; None: not known here."""
    kind = value.WhichOneof("kind")
    if kind is None or kind == "double_value":  # doubles by their bits: -0.0 == 0.0 as keys
        return None if kind is None else _hash_partition(value, kind, count)
    key = (kind, getattr(value, kind), count)
    try:
        return _SEEN[key]
    except (KeyError, TypeError):  # not seen yet; or unhashable (a list, a map)
        pass
    k = _hash_partition(value, kind, count)
    if k is not None:
        if len(_SEEN) >= _SEEN_MAX:
            _SEEN.clear()
        _SEEN[key] = k
    return k


def _hash_partition(value: pb.Value, kind: str, count: int) -> int | None:
    if kind == "string_value":
        data = b"string\0" + value.string_value.encode()
    elif kind == "int_value":
        data = b"int\0" + str(value.int_value).encode()
    elif kind == "bool_value":
        data = b"bool\0" + (b"1" if value.bool_value else b"0")
    elif kind == "bytes_value":
        data = b"bytes\0" + value.bytes_value
    elif kind == "double_value":
        data = b"double\0" + _pack_double(value.double_value)
    else:
        return None
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big") % count


def _one(partitions: Iterable[int | None]) -> int | None:
    found: int | None = None
    for k in partitions:
        if k is None or (found is not None and k != found):
            return None
        found = k
    return found


def _template_partition(template: pb.Template, field: str, count: int) -> int | None:
    value = template.fields.get(field)  # one lookup: `get` adds no item to a map of messages
    if value is not None and value.WhichOneof("kind") not in (None, "null_value"):
        return value_partition(value, count)
    matcher = template.matchers.get(field)
    if matcher is not None and matcher.WhichOneof("kind") == "equal":
        return value_partition(matcher.equal, count)
    return None


def _entry_partition(entry: pb.Entry, field: str, count: int) -> int | None:
    value = entry.fields.get(field)
    return None if value is None else value_partition(value, count)


def request_partition(request: Any, field: str, count: int) -> int | None:
    """The one partition `request` concerns, or None (several, or not known here)."""
    transaction = getattr(request, "transaction", 0)
    if transaction:
        return int(transaction) % ID_STRIDE
    kind = type(request)
    if kind is pb.WriteRequest:  # the usual calls first, of one entry or template
        return _entry_partition(request.entry, field, count)
    if kind is pb.MatchRequest and request.settle:  # a take that also acks: one partition for all
        k = _one(_template_partition(template, field, count) for template in request.templates)
        return _one([k, *(int(receipt) % ID_STRIDE for receipt in request.settle)])
    if kind is pb.MatchRequest or kind is pb.CountRequest:
        templates = request.templates
        if len(templates) == 1:
            return _template_partition(templates[0], field, count)
        if not templates:
            return None
        return _one(_template_partition(template, field, count) for template in templates)
    if kind is pb.WriteManyRequest:
        return _one(_entry_partition(entry, field, count) for entry in request.entries)
    if kind is pb.CancelLeasesRequest:
        return _one(int(lease_id) % ID_STRIDE for lease_id in request.ids) if request.ids else None
    if kind is pb.RenewLeasesRequest:
        ids = [renewal.id % ID_STRIDE for renewal in request.renewals]
        return _one(ids) if ids else None
    if kind is pb.AckRequest and request.receipts:  # a batch: one partition's, or the space's
        return _one(int(receipt) % ID_STRIDE for receipt in request.receipts)
    if kind is pb.AckRequest or kind is pb.NackRequest or kind is pb.ExtendRequest:
        return int(request.receipt) % ID_STRIDE  # a receipt is an id of its partition
    if kind is pb.BeginRequest:
        return value_partition(request.route, count) if request.HasField("route") else None
    return None
