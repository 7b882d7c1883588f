"""The asyncio twin of `outrig.ChangeStream` (client/_changes.py has the shared state)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from outrig._changes import Change, ChangeFeedState
from outrig.aio._streams import AsyncResumableStream
from outrig.v1 import space_pb2 as pb

if TYPE_CHECKING:
    from outrig.aio._space import AsyncSpace

__all__ = ["AsyncChangeStream"]


class AsyncChangeStream(AsyncResumableStream[Change]):
    """A stream of a space's changes: an async context manager and async iterator of `Change`
    objects (`AsyncSpace.changes`), the twin of `outrig.ChangeStream`: opened when entered,
    opened again from its `cursor` when it fails with `UnavailableError`, as the space's retry
    policy allows."""

    _what = "change stream"

    def __init__(self, space: AsyncSpace, state: ChangeFeedState) -> None:
        super().__init__(space)
        self._state = state

    @property
    def cursor(self) -> str:
        """The last position read (see `outrig.ChangeStream.cursor`)."""
        return self._state.cursor

    @property
    def oldest(self) -> str:
        """The oldest cursor the space's log held when the stream (last) started."""
        return self._state.oldest

    def _method(self, stub: Any) -> Any:
        return stub.Changes

    def _first_request(self) -> pb.ChangesRequest:
        return self._state.request

    def _started(self, first: pb.ChangesReply | None) -> None:
        self._state.started(first)

    def _resume_request(self) -> pb.ChangesRequest:
        return self._state.resume_request()

    def _item(self, reply: pb.ChangesReply) -> Change | None:
        return self._state.read(reply)

    async def ack(self, cursor: str | None = None) -> None:
        """Move the durable subscription's position forward (see `outrig.ChangeStream.ack`)."""
        request = self._state.ack_request(cursor)
        await self._space._call(self._space._ops["AckChanges"], request)
