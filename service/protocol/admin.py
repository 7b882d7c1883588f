"""The admin API's messages (DescribeSpace, Browse, Purge) <-> engine objects, without gRPC.

The requests are checked here as codec.py checks the others: a page beyond `MAX_PAGE` or a purge
without a template is an `InvalidArgumentError` naming the field and the limit.
"""

from __future__ import annotations

from collections.abc import Sequence

from outrig.service.config import Limits
from outrig.service.engine.inspection import SpaceDescription
from outrig.service.engine.model import StoredEntry, Template
from outrig.service.exceptions import InvalidArgumentError
from outrig.service.protocol import changes, codec
from outrig.v1 import space_pb2 as pb

__all__ = [
    "DEFAULT_PAGE",
    "MAX_PAGE",
    "browse_reply",
    "describe_reply",
    "page_size",
    "purge_limit",
    "templates",
]

#: Entries a Browse page holds when the request says 0, and at most.
DEFAULT_PAGE = 100
MAX_PAGE = 1000


def templates(messages: Sequence[pb.Template], limits: Limits) -> tuple[Template, ...]:
    """A Browse's templates: none means every entry."""
    return codec.templates(messages, limits) if messages else ()


def page_size(request: pb.BrowseRequest) -> int:
    if request.max_entries > MAX_PAGE:
        raise InvalidArgumentError(
            f"max_entries: {request.max_entries} exceeds the limit of a page, {MAX_PAGE} "
            "(browse further pages with the reply's `next` as `after`)"
        )
    return request.max_entries or DEFAULT_PAGE


def purge_limit(request: pb.PurgeRequest) -> int:
    if not request.templates:
        raise InvalidArgumentError(
            "templates: a purge needs at least one template (a template of a type and no field "
            "purges every entry of the type)"
        )
    return int(request.max_entries)


def _template(template: Template) -> pb.Template:
    message = pb.Template(type_name=template.type_name)
    for name, value in template.fields:
        message.fields[name].CopyFrom(codec.value_message(value))
    return message


def _seconds(expires_at: float | None) -> float:
    return 0.0 if expires_at is None else expires_at


def describe_reply(description: SpaceDescription) -> pb.DescribeSpaceReply:
    d = description
    reply = pb.DescribeSpaceReply(
        space=d.space,
        entries=d.entries,
        bytes=d.bytes,
        waiters=d.waiters,
        registrations=d.registrations,
        transactions=d.transactions,
        locked=d.locked,
        expired=d.expired,
        in_flight=d.in_flight,
        delayed=d.delayed,
        redelivered=d.redelivered,
        dead_lettered=d.dead_lettered,
    )
    for view in d.types:
        figures = reply.types.add(
            type_name=view.type_name,
            supertypes=view.supertypes,
            entries=view.entries,
            bytes=view.bytes,
            with_subtypes=view.with_subtypes,
        )
        for field_name, buckets in sorted(view.indexes.items()):
            figures.indexes.add(field=field_name, buckets=buckets)
    for group in d.waiting:
        reply.waiting.add(
            templates=[_template(t) for t in group.templates],
            take=group.take,
            count=group.count,
            transactional=group.transactional,
        )
    for registration in d.registration_list:
        reply.registration_list.add(
            id=registration.id,
            templates=[_template(t) for t in registration.templates],
            expires_at=_seconds(registration.expires_at),
            sequence=registration.sequence,
            transaction=registration.transaction,
        )
    for txn in d.transaction_list:
        reply.transaction_list.add(
            id=txn.id,
            expires_at=_seconds(txn.expires_at),
            written=txn.written,
            taken=txn.taken,
            read_locked=txn.read_locked,
            waiters=txn.waiters,
        )
    if d.oldest_entry_age is not None:
        reply.oldest_entry_age = d.oldest_entry_age
    settings = d.settings
    configuration = reply.configuration
    configuration.fifo = settings.fifo
    configuration.max_entries = settings.max_entries
    configuration.max_bytes = settings.max_bytes
    configuration.max_registrations = d.max_registrations
    if settings.default_lease != float("inf"):
        configuration.default_lease = settings.default_lease
    if settings.max_lease != float("inf"):
        configuration.max_lease = settings.max_lease
    configuration.max_deliveries = settings.max_deliveries
    configuration.dead_letter = d.dead_letter
    if d.changes is not None:
        reply.change_log.CopyFrom(changes.change_log_figures(d.space, d.changes))
    return reply


def browse_reply(entries: Sequence[StoredEntry], cursor: int) -> pb.BrowseReply:
    reply = pb.BrowseReply(next=cursor)
    for stored in entries:
        item = reply.entries.add(
            id=stored.id,
            expires_at=_seconds(stored.expires_at),
            locked=stored.lock is not None,
            deliveries=stored.deliveries,
        )
        item.entry.MergeFromString(bytes(codec.entry_bytes(stored.payload)))
        hidden_until = stored.hidden_until
        if hidden_until is None:
            continue
        if stored.receipt is None:  # a delayed write, or a delivery returned with a delay
            item.visible_at = hidden_until
        else:  # a pending delivery
            item.delivery.receipt = stored.receipt
            item.delivery.deliveries = stored.deliveries
            item.delivery.deadline = hidden_until
            item.delivery.dead_letter_reason = stored.dead_letter_reason
    return reply
