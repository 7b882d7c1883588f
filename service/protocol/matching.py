"""Protobuf <-> engine matchers (outrig.v1.Matcher) and order keys (outrig.v1.OrderKey).

Part of the codec (codec.py decodes templates through `matchers`): every problem is an
InvalidArgumentError naming the field at fault (`templates[0].matchers['n'].range.low`). A
matcher of the wrong kind for its comparison (a range over maps, a prefix of an int, a NaN bound,
bounds of two kinds) is refused here, so the engine only sees matchers that mean something.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence

from outrig.service.config import Limits
from outrig.service.engine.matchers import (
    ORDERED_KINDS,
    All,
    Equal,
    Matcher,
    NotEqual,
    OneOf,
    Prefix,
    Presence,
    Range,
    sort_key,
)
from outrig.service.engine.model import OrderKey
from outrig.service.engine.values import FieldValue
from outrig.service.exceptions import InvalidArgumentError, excerpt
from outrig.service.protocol import codec
from outrig.v1 import space_pb2 as pb

__all__ = ["matcher_message", "matchers", "order_by"]

_pack_double = struct.Struct("<d").pack
_ORDERED = ", ".join(ORDERED_KINDS)


def matchers(
    messages: Mapping[str, pb.Matcher], where: str, limits: Limits, fields: dict[str, FieldValue]
) -> dict[str, Matcher]:
    """A template's matchers by field. An equality matcher on a field the template does not
    already set becomes a plain field of `fields` (the equality fast path)."""
    if len(messages) > limits.max_fields:
        raise InvalidArgumentError(
            f"{where}: {len(messages)} matchers exceeds the limit max_fields={limits.max_fields}"
        )
    result: dict[str, Matcher] = {}
    for name in messages:
        path = f"{where}[{excerpt(name)}]"
        codec.name(name, path, limits)
        matcher = _matcher(messages[name], path, limits)
        if isinstance(matcher, Equal) and name not in fields:
            fields[name] = matcher.value
        else:
            result[name] = matcher
    return result


def _value(message: pb.Value, where: str, limits: Limits) -> FieldValue:
    value = codec.field_value(message, where, limits)
    if value.kind == "null":
        raise InvalidArgumentError(
            f"{where}: null is no value to compare with (present=false matches an absent or null field)"
        )
    return value


def _matcher(message: pb.Matcher, where: str, limits: Limits) -> Matcher:
    kind = message.WhichOneof("kind")
    if kind == "equal":
        return Equal(_value(message.equal, f"{where}.equal", limits))
    if kind == "not_equal":
        return NotEqual(_value(message.not_equal, f"{where}.not_equal", limits))
    if kind == "present":
        return Presence(message.present)
    if kind == "one_of":
        values = message.one_of.values
        _check_count(len(values), f"{where}.one_of.values", "values", "max_batch", limits.max_batch)
        return OneOf(_value(value, f"{where}.one_of.values[{i}]", limits) for i, value in enumerate(values))
    if kind == "prefix":
        value = _value(message.prefix, f"{where}.prefix", limits)
        if value.kind not in ("string", "bytes") or not isinstance(value.data, str | bytes):
            raise InvalidArgumentError(f"{where}.prefix: a prefix is a string or bytes, got {value.kind}")
        return Prefix(value.kind, value.data)
    if kind == "range":
        return _range(message.range, f"{where}.range", limits)
    if kind == "all":
        parts = message.all.matchers
        _check_count(len(parts), f"{where}.all.matchers", "matchers", "max_fields", limits.max_fields)
        found = [_matcher(part, f"{where}.all.matchers[{i}]", limits) for i, part in enumerate(parts)]
        return found[0] if len(found) == 1 else All(found)
    raise InvalidArgumentError(f"{where}: no matcher set")


def _check_count(count: int, where: str, what: str, limit_name: str, limit: int) -> None:
    """At least one, and at most the limit."""
    if not count:
        raise InvalidArgumentError(f"{where}: must not be empty")
    if count > limit:
        raise InvalidArgumentError(f"{where}: {count} {what} exceeds the limit {limit_name}={limit}")


def _bound(message: pb.Value, where: str, limits: Limits) -> tuple[str, object]:
    value = _value(message, where, limits)
    key = sort_key(value)
    if key is None:
        raise InvalidArgumentError(f"{where}: a range compares {_ORDERED} values, got {value.kind}")
    if key[1]:
        raise InvalidArgumentError(f"{where}: NaN has no place in a range")
    return value.kind, key[2]


def _range(message: pb.Range, where: str, limits: Limits) -> Range:
    low = _bound(message.low, f"{where}.low", limits) if message.HasField("low") else None
    high = _bound(message.high, f"{where}.high", limits) if message.HasField("high") else None
    if low is None and high is None:
        raise InvalidArgumentError(f"{where}: needs a low or a high bound (or both)")
    if low is not None and high is not None and low[0] != high[0]:
        raise InvalidArgumentError(
            f"{where}: its bounds are of two kinds, {low[0]} and {high[0]} (values compare within a kind)"
        )
    kind = (low or high)[0]  # type: ignore[index]
    return Range(
        kind,
        None if low is None else low[1],
        message.low_inclusive,
        None if high is None else high[1],
        message.high_inclusive,
    )


def order_by(keys: Sequence[pb.OrderKey], limits: Limits) -> tuple[OrderKey, ...]:
    """A request's order: (field, descending) per key, each field once."""
    if len(keys) > limits.max_fields:
        raise InvalidArgumentError(
            f"order_by: {len(keys)} keys exceeds the limit max_fields={limits.max_fields}"
        )
    seen: set[str] = set()
    result = []
    for i, key in enumerate(keys):
        field = codec.name(key.field, f"order_by[{i}].field", limits)
        if field in seen:
            raise InvalidArgumentError(f"order_by[{i}].field: {excerpt(field)} is an earlier key already")
        seen.add(field)
        result.append((field, key.descending))
    return tuple(result)


# ---------------------------------------------------------------- back to protobuf (the store)


def _bound_message(kind: str, value: object) -> pb.Value:
    if kind == "double":
        return codec.value_message(FieldValue("double", _pack_double(value)))
    return codec.value_message(FieldValue(kind, value))  # type: ignore[arg-type]


def matcher_message(matcher: Matcher) -> pb.Matcher:
    """The protobuf form of an engine matcher (the inverse of `matchers`' decoding)."""
    if isinstance(matcher, Equal):
        return pb.Matcher(equal=codec.value_message(matcher.value))
    if isinstance(matcher, NotEqual):
        return pb.Matcher(not_equal=codec.value_message(matcher.value))
    if isinstance(matcher, Presence):
        return pb.Matcher(present=matcher.present)
    if isinstance(matcher, OneOf):
        return pb.Matcher(one_of=pb.ValueSet(values=[codec.value_message(v) for v in matcher.values]))
    if isinstance(matcher, Prefix):
        return pb.Matcher(prefix=codec.value_message(FieldValue(matcher.kind, matcher.prefix)))
    if isinstance(matcher, Range):
        message = pb.Range(low_inclusive=matcher.low_inclusive, high_inclusive=matcher.high_inclusive)
        if matcher.low is not None:
            message.low.CopyFrom(_bound_message(matcher.kind, matcher.low))
        if matcher.high is not None:
            message.high.CopyFrom(_bound_message(matcher.kind, matcher.high))
        return pb.Matcher(range=message)
    if isinstance(matcher, All):
        return pb.Matcher(all=pb.MatcherList(matchers=[matcher_message(m) for m in matcher.matchers]))
    raise TypeError(f"no protobuf form for {matcher!r}")
