"""Entry types: type names, supertypes, the registry, and rebuilding entries from the wire."""

from __future__ import annotations

import array
import dataclasses
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt
import pytest
from google.protobuf.message import DecodeError

import outrig
from outrig._codec import decode_entry, encode_entry, encode_template, encode_value
from outrig._entry import entry_info, registered_class
from outrig.v1 import space_pb2 as pb


@dataclass
class Animal(outrig.Entry):
    name: str | None = None


@dataclass
class Mammal(Animal):
    legs: int | None = None


@dataclass
class Dog(Mammal, type_name="zoo.Dog"):
    breed: str | None = None


@dataclass
class Tagged(outrig.Entry):
    tag: str | None = None


@dataclass
class TaggedDog(Dog, Tagged):
    pass


def _name(cls: type) -> str:
    return f"{__name__}.{cls.__qualname__}"


# ---------------------------------------------------------------- type names and supertypes


def test_default_type_name_is_module_and_qualified_name() -> None:
    assert entry_info(Animal).type_name == _name(Animal)
    assert entry_info(Mammal).type_name == _name(Mammal)


def test_explicit_type_name() -> None:
    assert entry_info(Dog).type_name == "zoo.Dog"
    assert registered_class("zoo.Dog") is Dog
    assert encode_entry(Dog()).type_name == "zoo.Dog"


def test_three_level_hierarchy_lists_supertypes_most_derived_first() -> None:
    assert list(encode_entry(Animal()).supertypes) == []
    assert list(encode_entry(Mammal()).supertypes) == [_name(Animal)]
    assert list(encode_entry(Dog()).supertypes) == [_name(Mammal), _name(Animal)]


def test_multiple_inheritance_follows_the_mro() -> None:
    assert list(encode_entry(TaggedDog()).supertypes) == [
        "zoo.Dog",
        _name(Mammal),
        _name(Animal),
        _name(Tagged),
    ]


def test_every_dataclass_field_is_sent_and_none_is_null() -> None:
    message = encode_entry(Dog(name="rex", legs=4))
    assert set(message.fields) == {"name", "legs", "breed"}
    assert message.fields["name"].string_value == "rex"
    assert message.fields["legs"].int_value == 4
    assert message.fields["breed"].WhichOneof("kind") == "null_value"


def test_template_omits_none_fields() -> None:
    message = encode_template(Dog(legs=4))
    assert message.type_name == "zoo.Dog"
    assert set(message.fields) == {"legs"}
    assert encode_template(Dog()).fields == {}


def test_falsy_values_are_not_wildcards() -> None:
    assert set(encode_template(Dog(name="", legs=0)).fields) == {"name", "legs"}


# ---------------------------------------------------------------- decoding


def test_decode_returns_the_most_derived_registered_class() -> None:
    decoded = decode_entry(encode_entry(TaggedDog(name="rex", legs=3, breed="mutt", tag="x")))
    assert type(decoded) is TaggedDog
    assert decoded == TaggedDog(name="rex", legs=3, breed="mutt", tag="x")


def test_missing_fields_decode_as_none_and_unknown_fields_are_dropped() -> None:
    message = pb.Entry(type_name="zoo.Dog", fields={"legs": encode_value(4), "wings": encode_value(2)})
    assert decode_entry(message) == Dog(legs=4)


@dataclass
class Checked(outrig.Entry):
    n: int | None = None
    doubled: int | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        if self.n is not None and self.n < 0:
            raise ValueError("n must be >= 0")
        self.doubled = None if self.n is None else 2 * self.n


def test_decode_sets_fields_without_init_or_post_init() -> None:
    assert decode_entry(encode_entry(Checked(n=2))).doubled == 4  # type: ignore[union-attr]
    wire = pb.Entry(type_name=_name(Checked), fields={"n": encode_value(-1), "doubled": encode_value(7)})
    decoded = decode_entry(wire)
    assert isinstance(decoded, Checked)
    assert (decoded.n, decoded.doubled) == (-1, 7)


@dataclass(frozen=True, slots=True)
class Point(outrig.Entry, type_name="geo.Point"):
    x: float | None = None
    y: float | None = None


def test_frozen_slots_dataclass_keeps_explicit_type_name_and_round_trips() -> None:
    # slots=True rebuilds the class without the class keywords; the name must survive that.
    assert entry_info(Point).type_name == "geo.Point"
    assert registered_class("geo.Point") is Point
    point = Point(1.0, 2.5)
    assert not hasattr(point, "__dict__")
    assert decode_entry(encode_entry(point)) == point


def test_unknown_type_decodes_as_generic_entry() -> None:
    message = pb.Entry(
        type_name="nobody.Knows",
        supertypes=["nobody.Base"],
        fields={"x": encode_value(1), "samples": encode_value(array.array("d", [1.0, 2.0]))},
    )
    decoded = decode_entry(message)
    assert decoded == outrig.GenericEntry(
        "nobody.Knows", ("nobody.Base",), {"samples": array.array("d", [1.0, 2.0]), "x": 1}
    )
    assert isinstance(decoded, outrig.GenericEntry)
    assert list(decoded.fields) == ["samples", "x"]  # sorted, whatever the wire order
    with pytest.raises(dataclasses.FrozenInstanceError):
        decoded.type_name = "x"  # type: ignore[misc]


def test_generic_entry_encodes_as_entry_and_template() -> None:
    generic = outrig.GenericEntry("zoo.Dog", ("a", "b"), {"legs": 4, "breed": None})
    entry = encode_entry(generic)
    assert (entry.type_name, list(entry.supertypes)) == ("zoo.Dog", ["a", "b"])
    assert entry.fields["breed"].WhichOneof("kind") == "null_value"
    assert set(encode_template(generic).fields) == {"legs"}
    # A known type name comes back as its class.
    assert decode_entry(entry) == Dog(legs=4)


# ---------------------------------------------------------------- entries as bytes (outrig.entry_to_bytes)


def test_entry_bytes_are_the_protocol_entry_message_and_round_trip() -> None:
    dog = TaggedDog(name="rex", legs=3, breed="mutt", tag="x")
    data = outrig.entry_to_bytes(dog)
    assert isinstance(data, bytes)
    assert pb.Entry.FromString(data) == encode_entry(dog)  # what a write sends, parsable anywhere
    decoded = outrig.entry_from_bytes(data)
    assert type(decoded) is TaggedDog
    assert decoded == dog
    assert outrig.entry_from_bytes(outrig.entry_to_bytes(Point(1.0, 2.5))) == Point(1.0, 2.5)


def test_equal_entries_give_identical_bytes_whatever_their_field_order() -> None:
    forwards = outrig.GenericEntry("nobody.Knows", (), {"a": 1, "b": {"y": 2, "x": [3]}, "c": None})
    backwards = outrig.GenericEntry("nobody.Knows", (), {"c": None, "b": {"x": [3], "y": 2}, "a": 1})
    assert outrig.entry_to_bytes(forwards) == outrig.entry_to_bytes(backwards)
    # A type with no class here comes back as a GenericEntry, None fields as None.
    assert outrig.entry_from_bytes(outrig.entry_to_bytes(backwards)) == forwards


def test_entry_to_bytes_raises_the_errors_of_a_write() -> None:
    with pytest.raises(ValueError, match=r"field 'legs'.*int64"):
        outrig.entry_to_bytes(Dog(legs=2**63))
    with pytest.raises(TypeError, match=r"expected an outrig\.Entry"):
        outrig.entry_to_bytes(object())  # type: ignore[arg-type]


@pytest.mark.parametrize("data", [b"", b"\xff\xff", pb.Entry(supertypes=["a"]).SerializeToString()])
def test_entry_from_bytes_refuses_bytes_that_are_no_entry(data: bytes) -> None:
    with pytest.raises(ValueError, match=r"not an encoded outrig\.v1\.Entry"):
        outrig.entry_from_bytes(data)


def test_entry_from_bytes_chains_protobufs_error() -> None:
    with pytest.raises(ValueError, match=r"not an encoded outrig\.v1\.Entry") as caught:
        outrig.entry_from_bytes(b"\x0a\x05ab")  # a type name cut short
    assert isinstance(caught.value.__cause__, DecodeError)


# ---------------------------------------------------------------- the registry


def test_two_classes_cannot_share_a_type_name() -> None:
    with pytest.raises(TypeError, match=r"'zoo\.Dog'.*already used by"):

        @dataclass
        class Impostor(outrig.Entry, type_name="zoo.Dog"):
            pass

    assert registered_class("zoo.Dog") is Dog


def test_recreating_the_same_class_replaces_it() -> None:
    def define() -> type[outrig.Entry]:
        @dataclass
        class Local(outrig.Entry, type_name="tests.Recreated"):
            x: int | None = None

        return Local

    first, second = define(), define()
    assert first is not second
    assert registered_class("tests.Recreated") is second
    assert type(decode_entry(encode_entry(first(x=1)))) is second  # type: ignore[call-arg]


def test_type_name_must_be_a_non_empty_string() -> None:
    with pytest.raises(TypeError, match="non-empty str"):

        class Empty(outrig.Entry, type_name=""):
            pass


def test_entry_class_must_be_a_dataclass() -> None:
    class Plain(outrig.Entry):
        pass

    with pytest.raises(TypeError, match="must be a dataclass"):
        encode_entry(Plain())


def test_entry_itself_and_non_entries_are_rejected() -> None:
    with pytest.raises(TypeError, match=r"subclass outrig\.Entry"):
        encode_entry(outrig.Entry())
    with pytest.raises(TypeError, match=r"expected an outrig\.Entry"):
        encode_entry(object())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"expected an outrig\.Entry"):
        encode_template({"job": "x"})  # type: ignore[arg-type]


def test_class_metadata_is_computed_once_per_class() -> None:
    @dataclass
    class Base(outrig.Entry):
        a: int | None = None

    @dataclass
    class Derived(Base):
        b: int | None = None

    derived = entry_info(Derived)  # first, so Base must not inherit Derived's cached info
    assert entry_info(Derived) is derived
    assert "_outrig_info" in Derived.__dict__
    assert entry_info(Base).fields == (("a", False),)
    assert derived.fields == (("a", False), ("b", False))


# ---------------------------------------------------------------- array kinds from annotations


@dataclass
class Annotated(outrig.Entry):
    plain: np.ndarray | None = None
    typed: npt.NDArray[np.float32] | None = None
    nested: list[np.ndarray] | None = None
    stdlib: array.array | None = None
    number: int | None = None


@dataclass
class Unresolvable(outrig.Entry):
    # Names only imported under TYPE_CHECKING cannot be resolved: the text still says ndarray.
    weights: NotImported.ndarray | None = None  # type: ignore[name-defined]  # noqa: F821
    count: NotImported.Count | None = None  # type: ignore[name-defined]  # noqa: F821


def test_fields_annotated_with_ndarray_decode_as_numpy() -> None:
    assert dict(entry_info(Annotated).fields) == {
        "plain": True,
        "typed": True,
        "nested": True,
        "stdlib": False,
        "number": False,
    }
    assert dict(entry_info(Unresolvable).fields) == {"weights": True, "count": False}
