"""A Mux stream's `outrig-peer` header, against a real server: the secret its metadata presents is
read once, when the stream starts (handlers.StreamContext), and every operation of the stream is
let in or refused by it as a unary call with the same header is (servicer.py's `_admitted`)."""

from __future__ import annotations

import grpc

from outrig._codec import encode_template_into
from outrig.service.transport.peers import PEER_KEY
from outrig.testing import LocalServer
from outrig.v1 import space_pb2 as pb

from ..integration.entries import Task


def _results(address: str, metadata: tuple[tuple[str, str], ...]) -> list[pb.MuxResult]:
    """The results of two Counts sent in one MuxRequest on a stream opened with `metadata`."""
    count = pb.CountRequest(space="s")
    encode_template_into(count.templates.add(), Task())
    request = pb.MuxRequest(ops=[pb.MuxOp(id=1, count=count), pb.MuxOp(id=2, count=count)])
    with grpc.insecure_channel(address) as channel:
        mux = channel.stream_stream(
            "/outrig.v1.Space/Mux",
            request_serializer=pb.MuxRequest.SerializeToString,
            response_deserializer=pb.MuxReply.FromString,
        )
        results: list[pb.MuxResult] = []
        for reply in mux(iter([request]), metadata=metadata):
            results.extend(reply.results)
    return sorted(results, key=lambda result: result.id)


def test_every_operation_of_a_stream_with_a_forged_peer_header_is_refused() -> None:
    with LocalServer() as server:
        forged = _results(server.address, ((PEER_KEY, "guessed"),))
        assert [result.error.code for result in forged] == [grpc.StatusCode.UNAUTHENTICATED.value[0]] * 2
        assert all(PEER_KEY in result.error.message for result in forged)
        # Without the header the same operations are served.
        served = _results(server.address, (("x-other", "1"),))
        assert [(result.WhichOneof("result"), result.count.count) for result in served] == [("count", 0)] * 2
