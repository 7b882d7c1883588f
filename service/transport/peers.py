"""Calls forwarded to the other servers of a tier: one grpc.aio channel per peer address, kept
for as long as the server runs (`Peers.close` at its stop).

A call that reaches a server which does not serve its space (`SpaceBackend.locate` names another
address) is made again, as the same method with the same request bytes, on the server that does:
`Peers.unary` and `Peers.stream` (Contents, Notify). The forwarded call presents the tier's secret
in the `outrig-peer` metadata (`PEER_KEY`), which tells the owner that the forwarding server has
checked the caller's credentials and grants already (docs/security.md, "Forwarded calls"), and that
the call is not to be forwarded again. Replies cross as the local method would return them: the
encoded bytes for a method whose reply carries entries (the owner built them around the stored
payloads), else the reply message. A forwarded call ends as the owner ended it (its status,
message and ErrorInfo: the servicer's `Failure.forwarded`), and is cancelled when the caller's is:
a unary call is awaited by the task that serves the caller's, which gRPC cancels; a stream is
cancelled by the servicer when the caller's ends first.

The channels speak TLS when the server does (security.settings.peer_credentials), else plaintext.
"""

from __future__ import annotations

from typing import Any

import grpc

from outrig._protocol import Method
from outrig.service.config import ServerConfig
from outrig.service.security.settings import peer_credentials
from outrig.service.transport import handlers

#: The metadata key of a forwarded call: the tier's secret (`SpaceBackend.peer_secret`).
PEER_KEY = "outrig-peer"


def request_bytes(request: Any) -> bytes:
    """A decoded request as the bytes to forward: a `handlers.Received`'s own (as they arrived),
    else the message serialized."""
    if isinstance(request, handlers.Received):
        return bytes(request.raw)
    encoded: bytes = request.SerializeToString()
    return encoded


class Peers:
    """The channels to this server's peers, made on first use, one per address."""

    def __init__(self, config: ServerConfig) -> None:
        self._credentials = peer_credentials(config)
        limit = config.max_message_bytes
        self._options = [
            ("grpc.max_receive_message_length", limit),
            ("grpc.max_send_message_length", limit),
            # A peer that restarts is called again soon after, not after gRPC's back-off of up to
            # 120 s (the SDK's channels reconnect alike: outrig._base.channel_options).
            ("grpc.initial_reconnect_backoff_ms", 100),
            ("grpc.min_reconnect_backoff_ms", 100),
            ("grpc.max_reconnect_backoff_ms", 1000),
        ]
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._callables: dict[tuple[str, str], Any] = {}
        self._closed = False

    def channel(self, address: str) -> grpc.aio.Channel:
        """The channel to `address` ("host:port"), made on first use."""
        channel = self._channels.get(address)
        if channel is None:
            if self._closed:
                raise RuntimeError("peers: closed (the server is stopping)")
            if self._credentials is None:
                channel = grpc.aio.insecure_channel(address, options=self._options)
            else:
                channel = grpc.aio.secure_channel(address, self._credentials, options=self._options)
            self._channels[address] = channel
        return channel

    def _callable(self, address: str, method: Method) -> Any:
        key = (address, method.name)
        found = self._callables.get(key)
        if found is None:
            channel = self.channel(address)
            # Requests go as bytes; an encoded reply stays bytes, any other is parsed.
            reply = None if handlers.answers_encoded(method) else method.reply.FromString
            make = channel.unary_stream if method.streaming else channel.unary_unary
            found = make(method.path, request_serializer=None, response_deserializer=reply)
            self._callables[key] = found
        return found

    async def unary(
        self, address: str, method: Method, request: Any, secret: str, timeout: float | None
    ) -> Any:
        """Forward a unary call to `address`: its reply (bytes or message), or grpc.aio.AioRpcError
        as the owner ended it. Cancelling the awaiting task cancels the call."""
        call = self._callable(address, method)
        return await call(request_bytes(request), metadata=((PEER_KEY, secret),), timeout=timeout)

    def stream(self, address: str, method: Method, request: Any, secret: str, timeout: float | None) -> Any:
        """Forward a server-streaming call to `address`: the call, to iterate for its replies (its
        error, grpc.aio.AioRpcError, as the owner ended it), and to cancel when the caller's ends
        first (the servicer's `streaming` wrapper does, in a `finally`)."""
        return self._callable(address, method)(
            request_bytes(request), metadata=((PEER_KEY, secret),), timeout=timeout
        )

    async def close(self) -> None:
        """Close every channel (at the server's stop): calls still on them end CANCELLED."""
        self._closed = True
        channels, self._channels = list(self._channels.values()), {}
        self._callables.clear()
        for channel in channels:
            await channel.close()
