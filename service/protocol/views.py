"""A write_many's entries read through view messages: each entry's type, supertypes and the bytes of
each of its fields, decoded by protobuf in one pass, with no message object per field or entry.

Decoding a WriteManyRequest as outrig.v1 messages makes, for every field of every entry, a Value
message object and its map slot (about 10 us an entry of four fields, most of a write_many's
validation). The views are messages of this module's own (built at import from descriptors, in a
pool of their own: nothing is added to protobuf's default pool) that share the requests' field
numbers: `EntriesView` finds a request's entries, each as its bytes, and `BatchView` reads a
batch's entries, end to end with a separator before each, as one Entry whose type names,
supertypes and fields (each field's encoded map item, a key and a Value, as bytes) are repeated:
three lists for the batch. Identical fields (the same name and value: most of a batch's, as a
rule) are then decoded once per batch (codec.new_entries).

The field numbers are read from outrig.v1's descriptors, as wire.py's: the proto is their one
source.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from outrig._protocol import tag
from outrig.v1 import space_pb2 as pb

_PACKAGE = "outrig.service.views"
_Field = descriptor_pb2.FieldDescriptorProto


def _number(message: Any, name: str) -> int:
    number: int = message.DESCRIPTOR.fields_by_name[name].number
    return number


#: The kinds of Value whose engine form is the value itself (codec.py's `_PLAIN`), read by
#: `values_view`.
PLAIN_KINDS = ("int_value", "string_value", "bool_value", "bytes_value")


def _classes() -> tuple[Any, ...]:
    """The view message classes: (EntriesView, BatchView, ItemsView, ValuesView)."""
    file = descriptor_pb2.FileDescriptorProto(
        name="outrig/service/views.proto", package=_PACKAGE, syntax="proto3"
    )
    # A Write's or WriteMany's entries, each as the bytes it was sent as (wire.ENTRY_FIELD: the
    # same field in both, which wire.py checks).
    raw_entries = file.message_type.add(name="EntriesView")
    raw_entries.field.add(
        name="entries",
        number=_number(pb.WriteManyRequest, "entries"),
        type=_Field.TYPE_BYTES,
        label=_Field.LABEL_REPEATED,
    )
    # A batch's entries end to end, each opened by `BATCH_SEPARATOR`, read as one Entry whose
    # fields are all repeated (`batch_view`).
    batch = file.message_type.add(name="BatchView")
    for name, kind in (("type_name", _Field.TYPE_STRING), ("supertypes", _Field.TYPE_STRING)):
        batch.field.add(name=name, number=_number(pb.Entry, name), type=kind, label=_Field.LABEL_REPEATED)
    batch.field.add(
        name="fields", number=_number(pb.Entry, "fields"), type=_Field.TYPE_BYTES, label=_Field.LABEL_REPEATED
    )
    # A batch's distinct fields (map items), each opened by `ITEM_SEPARATOR`, read as one MapItem
    # whose key and value (as bytes) are repeated; and their Values of plain kinds end to end,
    # read as one Value whose kinds are repeated (`items_view`, `values_view`).
    items = file.message_type.add(name="ItemsView")
    items.field.add(
        name="key", number=_number(pb.MapItem, "key"), type=_Field.TYPE_STRING, label=_Field.LABEL_REPEATED
    )
    items.field.add(
        name="value", number=_number(pb.MapItem, "value"), type=_Field.TYPE_BYTES, label=_Field.LABEL_REPEATED
    )
    values = file.message_type.add(name="ValuesView")
    for name in PLAIN_KINDS:
        field = pb.Value.DESCRIPTOR.fields_by_name[name]
        values.field.add(name=name, number=field.number, type=field.type, label=_Field.LABEL_REPEATED)
    return own_messages(file, "EntriesView", "BatchView", "ItemsView", "ValuesView")


def own_messages(file: descriptor_pb2.FileDescriptorProto, *names: str) -> tuple[Any, ...]:
    """The classes of `file`'s messages `names`, from a descriptor pool of their own: nothing is
    added to protobuf's default pool (this module's views, transport/mux.py's MuxRequest view)."""
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    found = pool.FindMessageTypeByName
    return tuple(message_factory.GetMessageClass(found(f"{file.package}.{name}")) for name in names)


EntriesView, BatchView, ItemsView, ValuesView = _classes()

# A map item is a MapItem on the wire (key = 1, value = 2), as Entry.fields' entries are.
_ITEM: Any = pb.Entry.DESCRIPTOR.fields_by_name["fields"].message_type
if [(f.name, f.number) for f in _ITEM.fields] != [
    (f.name, f.number) for f in pb.MapItem.DESCRIPTOR.fields
] or _ITEM.fields_by_name["value"].message_type is not pb.Value.DESCRIPTOR:
    raise AssertionError("Entry.fields' items are not MapItems on the wire")


#: What opens each entry in a `batch_view`: an empty type name, an empty supertype and an empty
#: field (a map item of no key and no value). None of them is a valid entry's: each entry's own
#: names and fields lie between two of them in their lists, and an entry that sends one itself
#: leaves more of them than entries (`batch_view`'s caller then reads each entry on its own).
BATCH_SEPARATOR = b"".join(
    tag(pb.Entry.DESCRIPTOR.fields_by_name[name]) + b"\x00" for name in ("type_name", "supertypes", "fields")
)


def batch_view(entries: Sequence[bytes | memoryview]) -> Any:
    """Entries' encodings decoded as one `BatchView`, each opened by `BATCH_SEPARATOR`: its
    `type_name`, `supertypes` and `fields` are every entry's, in order, each entry's after a
    separator's empty one. Three lists for a whole batch, where a view message per entry costs
    three containers an entry (its supertypes and fields, 1 us of a write's 3). DecodeError if
    they are not protobuf's."""
    return BatchView.FromString(BATCH_SEPARATOR.join((b"", *entries)))


def entry_encodings(raw: bytes | memoryview) -> list[bytes]:
    """The entries of a Write's or WriteMany's bytes, each as it was sent (a copy: for a small
    request, where a copy costs less than finding them without one, `wire.entry_encodings`).
    DecodeError if they are not protobuf's."""
    return list(EntriesView.FromString(raw).entries)


#: What opens each map item in an `items_view`: an empty key and an empty value, which no valid
#: field has (the same reasoning as `BATCH_SEPARATOR`'s).
ITEM_SEPARATOR = b"".join(
    tag(pb.MapItem.DESCRIPTOR.fields_by_name[name]) + b"\x00" for name in ("key", "value")
)
_OPENINGS = {name: tag(pb.Value.DESCRIPTOR.fields_by_name[name]) for name in PLAIN_KINDS}
if any(len(opening) != 1 for opening in _OPENINGS.values()):
    raise AssertionError("a plain Value kind's tag is not one byte")
#: A plain kind's name by the tag (one byte) that opens a Value of it.
PLAIN_TAGS = {opening[0]: name for name, opening in _OPENINGS.items()}


def items_view(items: Sequence[bytes]) -> Any:
    """Encoded map items decoded as one `ItemsView`, each opened by `ITEM_SEPARATOR`: its `key`
    and `value` lists are every item's, in order, each item's after a separator's empty one.
    DecodeError if they are not protobuf's."""
    return ItemsView.FromString(ITEM_SEPARATOR.join((b"", *items)))


def values_view(values: Sequence[bytes]) -> Any:
    """Encoded Values of plain kinds, end to end, decoded as one `ValuesView`: each kind's list
    holds the values of that kind, in order. DecodeError if they are not protobuf's."""
    return ValuesView.FromString(b"".join(values))


def map_item(item: bytes) -> pb.MapItem:
    """One encoded field of an entry (a `BatchView`'s `fields` item) as its key and Value."""
    return pb.MapItem.FromString(item)
