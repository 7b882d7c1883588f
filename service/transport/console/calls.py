"""The console's calls: the servicer's methods, run as a gRPC call would run them.

`ConsoleContext` stands in for a call's gRPC context: its metadata carries the browser's bearer
token (`authorization`), its peer names the browser's address, and it has no TLS identity. A unary
method runs through `SpaceServicer.perform`, a streaming one (Notify) through its wrapper, so the
guard, the policy, forwarding and metrics are those of the API itself.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterable, Mapping
from typing import Any, NoReturn, cast

import grpc

from outrig.service.transport.servicer import Failure, SpaceServicer
from outrig.v1 import space_pb2 as pb

__all__ = ["Caller", "ConsoleContext", "ConsoleError"]

#: Seconds a console call may take (a forwarded one included).
CALL_TIMEOUT = 30.0


class ConsoleError(Exception):
    """A call of the console failed: its gRPC status and message, as an API client would see them."""

    def __init__(self, status: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class ConsoleContext:
    """What the servicer and the guard read of a call's context, for a call the console makes."""

    def __init__(self, token: str | None, peer: str) -> None:
        self._metadata: tuple[tuple[str, str], ...] = (("authorization", f"Bearer {token}"),) if token else ()
        self._peer = peer

    def invocation_metadata(self) -> Iterable[tuple[str, str]]:
        return self._metadata

    def peer(self) -> str:
        return self._peer

    def auth_context(self) -> Mapping[str, Iterable[bytes]]:
        return {}

    def time_remaining(self) -> float:
        return CALL_TIMEOUT

    async def abort(self, code: grpc.StatusCode, details: str = "", trailing_metadata: Any = ()) -> NoReturn:
        raise ConsoleError(code, details)


class Caller:
    """Calls of one browser request: as its user (`token`), from its address (`peer`)."""

    def __init__(self, servicer: SpaceServicer, token: str | None, peer: str) -> None:
        self._servicer = servicer
        self._context = ConsoleContext(token, f"console:{peer}")

    async def unary(self, name: str, request: Any) -> Any:
        """The reply message of the unary method `name`; ConsoleError as the call failed."""
        method = getattr(self._servicer, name).operation
        outcome = await self._servicer.perform(name, method, request, cast(Any, self._context))
        if isinstance(outcome, Failure):
            raise ConsoleError(outcome.status, outcome.message)
        return outcome

    async def notify(self, request: pb.NotifyRequest) -> AsyncIterator[pb.NotifyReply]:
        """The events of a notify registration, after its first message (the registration)."""
        stream: Any = self._servicer.Notify(request, cast(Any, self._context))
        async with contextlib.aclosing(stream):
            first = True
            async for data in stream:
                if first:
                    first = False
                    continue
                yield pb.NotifyReply.FromString(data)
