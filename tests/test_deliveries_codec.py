"""The protocol of takes with ack and delayed writes (service/protocol/deliveries.py): every bad
value is refused naming its field or limit, and a reply's deliveries follow its entries."""

from __future__ import annotations

import math

import pytest

from outrig.service.config import Limits
from outrig.service.engine.model import Delivery, NewEntry, StoredEntry
from outrig.service.exceptions import InvalidArgumentError
from outrig.service.protocol import codec, deliveries
from outrig.v1 import space_pb2 as pb

LIMITS = Limits(max_ack=100.0)


def test_a_take_with_ack_and_its_refusals() -> None:
    assert deliveries.ack_seconds(pb.MatchRequest(), LIMITS, take=True) is None
    assert deliveries.ack_seconds(pb.MatchRequest(ack=2.5), LIMITS, take=True) == 2.5
    for bad, named in [
        (pb.MatchRequest(ack=0.0), "ack: must be finite and > 0"),
        (pb.MatchRequest(ack=-1.0), "ack: must be finite and > 0"),
        (pb.MatchRequest(ack=math.nan), "ack: must be finite"),
        (pb.MatchRequest(ack=math.inf), "ack: must be finite"),
        (pb.MatchRequest(ack=101.0), "max_ack=100.0"),
        (pb.MatchRequest(ack=5.0, transaction=7), "under a transaction"),
        (pb.MatchRequest(max_deliveries=3), "max_deliveries: only a take with"),
    ]:
        with pytest.raises(InvalidArgumentError, match=named):
            deliveries.ack_seconds(bad, LIMITS, take=True)
    with pytest.raises(InvalidArgumentError, match="only Take and TakeMany"):
        deliveries.ack_seconds(pb.MatchRequest(ack=5.0), LIMITS, take=False)


def test_receipts_delays_and_extensions() -> None:
    assert deliveries.receipt(pb.AckRequest(receipt=9)) == 9
    with pytest.raises(InvalidArgumentError, match="receipt: is required"):
        deliveries.receipt(pb.NackRequest())
    assert deliveries.nack_delay(pb.NackRequest()) is None
    assert deliveries.nack_delay(pb.NackRequest(delay=0.0)) == 0.0
    for bad in (-1.0, math.nan, math.inf, 1e12):
        with pytest.raises(InvalidArgumentError, match="delay"):
            deliveries.nack_delay(pb.NackRequest(delay=bad))
    assert deliveries.deadline_seconds(10.0, "seconds", LIMITS) == 10.0
    with pytest.raises(InvalidArgumentError, match=r"seconds: .* max_ack"):
        deliveries.deadline_seconds(1000.0, "seconds", LIMITS)


def test_a_delayed_write() -> None:
    now = 1_000_000.0
    assert deliveries.visible_at(pb.WriteRequest(), now) is None
    assert deliveries.visible_at(pb.WriteRequest(delay=5.0), now) == now + 5.0
    assert deliveries.visible_at(pb.WriteManyRequest(delay=0.0), now) is None
    assert deliveries.visible_at(pb.WriteRequest(visible_at=now + 60), now) == now + 60
    assert deliveries.visible_at(pb.WriteRequest(visible_at=now - 60), now) is None  # past: at once
    for bad, named in [
        (pb.WriteRequest(delay=-1.0), "delay: must be finite and >= 0"),
        (pb.WriteRequest(visible_at=math.nan), "visible_at: must be finite"),
        (pb.WriteRequest(visible_at=now + 1e10), r"visible_at: .* maximum"),
        (pb.WriteRequest(delay=5.0, transaction=3), "delay: a delayed write cannot run under a transaction"),
    ]:
        with pytest.raises(InvalidArgumentError, match=named):
            deliveries.visible_at(bad, now)


def test_a_reply_of_deliveries_decodes_as_entries_then_their_deliveries() -> None:
    entries = [pb.Entry(type_name="Job", fields={"n": pb.Value(int_value=i)}) for i in range(3)]
    found = []
    for i, message in enumerate(entries):
        payload = codec.payload_of(message)
        stored = StoredEntry(i + 1, NewEntry("Job", (), {}, payload, len(payload)), None)
        found.append(Delivery(stored, 1024 + i, i + 1, 1e9 + i, "why" if i == 2 else ""))
    reply = pb.MatchReply.FromString(deliveries.deliveries_reply(found))
    assert list(reply.entries) == entries
    assert [(d.receipt, d.deliveries, d.deadline, d.dead_letter_reason) for d in reply.deliveries] == [
        (1024, 1, 1e9, ""),
        (1025, 2, 1e9 + 1, ""),
        (1026, 3, 1e9 + 2, "why"),
    ]
    assert pb.MatchReply.FromString(deliveries.deliveries_reply([])) == pb.MatchReply()
