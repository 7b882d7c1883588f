"""A write_many's entries read through view messages: each entry's type, supertypes and the bytes of
each of its fields, decoded by protobuf in one pass over the request, with no message object per
field.

Decoding a WriteManyRequest as outrig.v1 messages makes, for every field of every entry, a Value
message object and its map slot (about 10 us an entry of four fields, most of a write_many's
validation). The views are messages of this module's own (built at import from descriptors, in a
pool of their own: nothing is added to protobuf's default pool) that share the requests' field
numbers, so that protobuf decodes the same bytes as `WriteManyView`: each entry an `EntryView`
whose `fields` are the encoded map items (a key and a Value) as bytes. Identical fields (the same
name and value: most of a batch's, as a rule) are then decoded once per batch (codec.new_entries).

The field numbers are read from outrig.v1's descriptors, as wire.py's: the proto is their one
source.
"""

from __future__ import annotations

from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from outrig.v1 import space_pb2 as pb

_PACKAGE = "outrig.service.views"
_Field = descriptor_pb2.FieldDescriptorProto


def _number(message: Any, name: str) -> int:
    number: int = message.DESCRIPTOR.fields_by_name[name].number
    return number


def _classes() -> tuple[Any, ...]:
    """The view message classes: (EntryView, WriteManyView, EntriesView)."""
    file = descriptor_pb2.FileDescriptorProto(
        name="outrig/service/views.proto", package=_PACKAGE, syntax="proto3"
    )
    entry = file.message_type.add(name="EntryView")
    entry.field.add(
        name="type_name",
        number=_number(pb.Entry, "type_name"),
        type=_Field.TYPE_STRING,
        label=_Field.LABEL_OPTIONAL,
    )
    entry.field.add(
        name="supertypes",
        number=_number(pb.Entry, "supertypes"),
        type=_Field.TYPE_STRING,
        label=_Field.LABEL_REPEATED,
    )
    # A map<string, Value> is on the wire a repeated message of key = 1, value = 2: as bytes here.
    entry.field.add(
        name="fields", number=_number(pb.Entry, "fields"), type=_Field.TYPE_BYTES, label=_Field.LABEL_REPEATED
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
    request = file.message_type.add(name="WriteManyView")
    request.field.add(
        name="entries",
        number=_number(pb.WriteManyRequest, "entries"),
        type=_Field.TYPE_MESSAGE,
        type_name=f".{_PACKAGE}.EntryView",
        label=_Field.LABEL_REPEATED,
    )
    return own_messages(file, "EntryView", "WriteManyView", "EntriesView")


def own_messages(file: descriptor_pb2.FileDescriptorProto, *names: str) -> tuple[Any, ...]:
    """The classes of `file`'s messages `names`, from a descriptor pool of their own: nothing is
    added to protobuf's default pool (this module's views, transport/mux.py's MuxRequest view)."""
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    found = pool.FindMessageTypeByName
    return tuple(message_factory.GetMessageClass(found(f"{file.package}.{name}")) for name in names)


EntryView, WriteManyView, EntriesView = _classes()

# A map item is a MapItem on the wire (key = 1, value = 2), as Entry.fields' entries are.
_ITEM: Any = pb.Entry.DESCRIPTOR.fields_by_name["fields"].message_type
if [(f.name, f.number) for f in _ITEM.fields] != [
    (f.name, f.number) for f in pb.MapItem.DESCRIPTOR.fields
] or _ITEM.fields_by_name["value"].message_type is not pb.Value.DESCRIPTOR:
    raise AssertionError("Entry.fields' items are not MapItems on the wire")


def write_many_view(raw: bytes | memoryview) -> Any:
    """A WriteManyRequest's bytes decoded as a `WriteManyView` (its other fields left unknown).
    DecodeError if they are not protobuf's."""
    return WriteManyView.FromString(raw)


def entry_encodings(raw: bytes | memoryview) -> list[bytes]:
    """The entries of a Write's or WriteMany's bytes, each as it was sent (a copy: for a small
    request, where a copy costs less than finding them without one, `wire.entry_encodings`).
    DecodeError if they are not protobuf's."""
    return list(EntriesView.FromString(raw).entries)


def map_item(item: bytes) -> pb.MapItem:
    """One encoded field of an entry (an `EntryView`'s `fields` item) as its key and Value."""
    return pb.MapItem.FromString(item)
