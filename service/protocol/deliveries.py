"""The protocol of takes with an acknowledgement deadline and of delayed writes
(docs/work-queues.md): a request's `ack`, `max_deliveries`, receipts (a take's `settle`, a batch
Ack's), Nack delay, Extend seconds
and a write's `delay` / `visible_at`, checked and turned into engine values; and a reply's
deliveries, encoded after its entries.

Every check names the field, and a limit by its setting (`max_ack`, `max_receipts`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from outrig._protocol import tag, varint
from outrig.service.config import Limits
from outrig.service.engine.deliveries import check_ack_seconds, check_delay
from outrig.service.engine.leases import MAX_LEASE_SECONDS
from outrig.service.engine.model import Delivery
from outrig.service.exceptions import InvalidArgumentError
from outrig.v1 import space_pb2 as pb

#: MatchReply.deliveries: its field number, and the tag before each Delivery.
DELIVERIES_FIELD = pb.MatchReply.DESCRIPTOR.fields_by_name["deliveries"].number
_DELIVERIES = tag(pb.MatchReply.DESCRIPTOR.fields_by_name["deliveries"])


def ack_seconds(request: pb.MatchRequest, limits: Limits, *, take: bool) -> float | None:
    """A take's acknowledgement deadline in seconds; None: a plain take (or a read)."""
    if not request.HasField("ack"):
        if request.max_deliveries:
            raise InvalidArgumentError(
                "max_deliveries: only a take with an acknowledgement deadline (ack) counts deliveries"
            )
        return None
    if not take:
        raise InvalidArgumentError("ack: only Take and TakeMany take with an acknowledgement deadline")
    if request.transaction:
        raise InvalidArgumentError(
            "ack: a take with an acknowledgement deadline cannot run under a transaction "
            "(the transaction's lease is its deadline already)"
        )
    return deadline_seconds(request.ack, "ack", limits)


def deadline_seconds(seconds: float, field: str, limits: Limits) -> float:
    """A delivery's deadline from now (a take's `ack`, an Extend's `seconds`)."""
    check_ack_seconds(seconds, field)
    if seconds > limits.max_ack:
        raise InvalidArgumentError(
            f"{field}: {seconds} s exceeds the limit max_ack={limits.max_ack} s "
            "(extend a pending delivery for longer work)"
        )
    return seconds


def settle_receipts(request: pb.MatchRequest, limits: Limits, ack: float | None) -> list[int]:
    """The receipts a take acknowledges before it takes (its `settle`), at most max_receipts."""
    if not request.settle:
        return []
    if ack is None:
        raise InvalidArgumentError(
            "settle: only a take with an acknowledgement deadline (ack) settles earlier deliveries"
        )
    return _receipts(request.settle, "settle", limits)


def ack_receipts(request: pb.AckRequest, limits: Limits) -> list[int] | None:
    """A batch Ack's receipts; None: an Ack of the one `receipt`."""
    if not request.receipts:
        return None
    if request.receipt:
        raise InvalidArgumentError("receipts: give an Ack's receipt or its receipts, not both")
    return _receipts(request.receipts, "receipts", limits)


def _receipts(given: Sequence[int], field: str, limits: Limits) -> list[int]:
    if len(given) > limits.max_receipts:
        raise InvalidArgumentError(
            f"{field}: {len(given)} receipts exceed the limit max_receipts={limits.max_receipts}"
        )
    if 0 in given:
        raise InvalidArgumentError(f"{field}: 0 is no receipt (a Delivery's receipt, from a take with ack)")
    return list(given)


def receipt(request: pb.AckRequest | pb.NackRequest | pb.ExtendRequest) -> int:
    if not request.receipt:
        raise InvalidArgumentError("receipt: is required (a Delivery's receipt, from a take with ack)")
    return int(request.receipt)


def nack_delay(request: pb.NackRequest) -> float | None:
    """Seconds until a returned entry is visible again; None: the space's backoff."""
    if not request.HasField("delay"):
        return None
    return _delay(request.delay, "delay")


def _delay(seconds: float, field: str) -> float:
    check_delay(seconds, field)
    if seconds > MAX_LEASE_SECONDS:
        raise InvalidArgumentError(f"{field}: {seconds} s exceeds the maximum of {MAX_LEASE_SECONDS} s")
    return seconds


def visible_at(request: pb.WriteRequest | pb.WriteManyRequest, now: float) -> float | None:
    """When a write's entries become visible (epoch seconds); None: at once."""
    which = request.WhichOneof("visibility")
    if which is None:
        return None
    if request.transaction:
        raise InvalidArgumentError(
            f"{which}: a delayed write cannot run under a transaction (its entries become visible at commit)"
        )
    if which == "delay":
        seconds = _delay(request.delay, "delay")
        return now + seconds if seconds else None
    at = request.visible_at
    if not math.isfinite(at) or at < 0:
        raise InvalidArgumentError(f"visible_at: must be finite seconds since the Unix epoch, got {at}")
    if at - now > MAX_LEASE_SECONDS:
        raise InvalidArgumentError(
            f"visible_at: {at} is more than the maximum of {MAX_LEASE_SECONDS} s from now"
        )
    return at if at > now else None


def delivery_message(delivery: Delivery) -> pb.Delivery:
    return pb.Delivery(
        receipt=delivery.receipt,
        deliveries=delivery.deliveries,
        deadline=delivery.deadline,
        dead_letter_reason=delivery.dead_letter_reason,
    )


def deliveries_reply(deliveries: Sequence[Delivery]) -> bytes:
    """A MatchReply of these deliveries: their entries (the payloads as they are), then one
    Delivery each, in the same order."""
    parts: list[bytes] = [delivery.entry.payload for delivery in deliveries]  # type: ignore[misc]  # bytes
    parts += (delivery_field(delivery_message(delivery).SerializeToString()) for delivery in deliveries)
    return b"".join(parts)


def delivery_field(encoded: bytes) -> bytes:
    """An encoded Delivery framed as a MatchReply's `deliveries` field (a fan-out merge keeps
    each with its entry)."""
    return _DELIVERIES + varint(len(encoded)) + encoded
