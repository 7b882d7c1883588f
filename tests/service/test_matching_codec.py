"""The codec's matchers: decoded from protobuf with the field at fault named, and encoded back
for the store (a durable notify registration's templates) into templates that match the same."""

from __future__ import annotations

import math

import pytest

from outrig.service.config import Limits
from outrig.service.engine import NewEntry, StoredEntry
from outrig.service.exceptions import InvalidArgumentError
from outrig.service.protocol import codec
from outrig.v1 import space_pb2 as pb

from ..field_values import value

LIMITS = Limits()


def v(x: object) -> pb.Value:
    return codec.value_message(value(x))


MATCHERS = {
    "range": pb.Matcher(range=pb.Range(low=v(2), low_inclusive=True, high=v(5))),
    "double range": pb.Matcher(range=pb.Range(low=v(-math.inf), high=v(0.5), high_inclusive=True)),
    "prefix": pb.Matcher(prefix=v("é")),
    "bytes prefix": pb.Matcher(prefix=v(b"\xff")),
    "one_of": pb.Matcher(one_of=pb.ValueSet(values=[v(1), v("1"), v(1.0)])),
    "not": pb.Matcher(not_equal=v(3)),
    "present": pb.Matcher(present=True),
    "missing": pb.Matcher(present=False),
    "all": pb.Matcher(all=pb.MatcherList(matchers=[pb.Matcher(present=True), pb.Matcher(not_equal=v(4))])),
}
SAMPLES = [1, 2, 3, 4, 5, 1.0, 0.5, -0.0, math.nan, "1", "é", "éa", b"\xff\x00", b"a", True, None]


def _entry(x: object) -> StoredEntry:
    fields = {} if x is None else {"f": value(x)}
    return StoredEntry(1, NewEntry("T", (), fields, None, 1), None)


@pytest.mark.parametrize("name", sorted(MATCHERS))
def test_a_stored_template_matches_what_it_matched(name: str) -> None:
    (decoded,) = codec.templates([pb.Template(type_name="T", matchers={"f": MATCHERS[name]})], LIMITS)
    (stored,) = codec.stored_templates(codec.templates_bytes([decoded]))
    verdicts = [decoded.matches(_entry(x)) for x in SAMPLES]
    assert [stored.matches(_entry(x)) for x in SAMPLES] == verdicts
    assert any(verdicts) and not all(verdicts)  # each sample set tells the matcher apart


def test_an_equality_matcher_is_a_plain_field() -> None:
    (decoded,) = codec.templates([pb.Template(type_name="T", matchers={"f": pb.Matcher(equal=v(7))})], LIMITS)
    assert decoded.fields == (("f", value(7)),) and decoded.matchers == ()


@pytest.mark.parametrize(
    ("matcher", "says"),
    [
        (pb.Matcher(), "templates[0].matchers['f']: no matcher set"),
        (pb.Matcher(range=pb.Range()), "templates[0].matchers['f'].range: needs a low or a high bound"),
        (
            pb.Matcher(range=pb.Range(low=pb.Value(list_value=pb.ListValue(items=[v(1)])))),
            "templates[0].matchers['f'].range.low: a range compares",
        ),
        (pb.Matcher(range=pb.Range(high=v(math.nan))), "templates[0].matchers['f'].range.high: NaN"),
        (pb.Matcher(range=pb.Range(low=v(1), high=v("2"))), "bounds are of two kinds, int and string"),
        (
            pb.Matcher(prefix=v(1.5)),
            "templates[0].matchers['f'].prefix: a prefix is a string or bytes, got double",
        ),
        (pb.Matcher(one_of=pb.ValueSet()), "templates[0].matchers['f'].one_of.values: must not be empty"),
        (
            pb.Matcher(equal=pb.Value(null_value=pb.Null())),
            "templates[0].matchers['f'].equal: null is no value",
        ),
        (pb.Matcher(not_equal=pb.Value()), "templates[0].matchers['f'].not_equal: no value set"),
        (pb.Matcher(all=pb.MatcherList()), "templates[0].matchers['f'].all.matchers: must not be empty"),
    ],
)
def test_bad_matchers_name_the_field(matcher: pb.Matcher, says: str) -> None:
    with pytest.raises(InvalidArgumentError, match=None) as caught:
        codec.templates([pb.Template(type_name="T", matchers={"f": matcher})], LIMITS)
    assert says in str(caught.value)


def test_limits_on_matchers_and_order_keys() -> None:
    small = Limits(max_fields=2, max_batch=2)
    many = {name: pb.Matcher(present=True) for name in "abc"}
    with pytest.raises(
        InvalidArgumentError, match=r"templates\[0\].matchers: 3 matchers exceeds the limit max_fields=2"
    ):
        codec.templates([pb.Template(type_name="T", matchers=many)], small)
    three = pb.Matcher(one_of=pb.ValueSet(values=[v(1), v(2), v(3)]))
    with pytest.raises(InvalidArgumentError, match="3 values exceeds the limit max_batch=2"):
        codec.templates([pb.Template(type_name="T", matchers={"f": three})], small)
    keys = [pb.OrderKey(field=name) for name in "abc"]
    with pytest.raises(InvalidArgumentError, match="order_by: 3 keys exceeds the limit max_fields=2"):
        codec.templates([pb.Template(type_name="T")], small, keys)
    with pytest.raises(InvalidArgumentError, match=r"templates\[0\].matchers\[''\]: must not be empty"):
        codec.templates([pb.Template(type_name="T", matchers={"": pb.Matcher(present=True)})], LIMITS)
