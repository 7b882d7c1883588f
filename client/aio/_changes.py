"""The asyncio twin of `outrig.ChangeStream` (client/_changes.py has the shared state)."""

from __future__ import annotations

import asyncio
from types import TracebackType
from typing import TYPE_CHECKING, Any

import grpc.aio

from outrig._base import rpc_errors
from outrig._changes import Change, ChangeFeedState
from outrig._exceptions import CallCancelledError, UnavailableError
from outrig.v1 import space_pb2 as pb

if TYPE_CHECKING:
    from outrig.aio._space import AsyncSpace

__all__ = ["AsyncChangeStream"]


class AsyncChangeStream:
    """A stream of a space's changes: an async context manager and async iterator of `Change`
    objects (`AsyncSpace.changes`), the twin of `outrig.ChangeStream`: opened when entered,
    opened again from its `cursor` when it fails with `UnavailableError`, as the space's retry
    policy allows."""

    def __init__(self, space: AsyncSpace, state: ChangeFeedState) -> None:
        self._space = space
        self._state = state
        self._call: Any = None
        self._closed = False
        self._used: str | None = None  # where the stream went (None: home), for `reroute`

    @property
    def cursor(self) -> str:
        """The last position read (see `outrig.ChangeStream.cursor`)."""
        return self._state.cursor

    @property
    def oldest(self) -> str:
        """The oldest cursor the space's log held when the stream (last) started."""
        return self._state.oldest

    async def __aenter__(self) -> AsyncChangeStream:
        await self._start()
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def _start(self) -> None:
        if self._call is not None:
            return
        if self._closed:
            raise RuntimeError("the change stream is closed")
        try:
            self._state.started(await self._space._call(self._open, self._state.request))
        except BaseException:
            await self.close()
            raise

    async def _open(self, request: pb.ChangesRequest) -> pb.ChangesReply | None:
        """Open a Changes stream and return its first message, which carries its cursors."""
        if self._closed:  # close() from another task while a retry slept
            raise CallCancelledError("the change stream was closed")
        space = self._space
        self._used = space._connection.route_of(space.name)
        self._call = call = space._stub.Changes(request)
        try:
            first = await call.read()
        except BaseException:
            call.cancel()
            raise
        return None if first is grpc.aio.EOF else first

    def __aiter__(self) -> AsyncChangeStream:
        return self

    async def __anext__(self) -> Change:
        await self._start()
        while not self._closed:
            try:
                with rpc_errors:
                    reply = await self._call.read()
            except (CallCancelledError, asyncio.CancelledError):
                if self._closed and not _being_cancelled():
                    break
                raise
            except UnavailableError as err:
                self._space._connection.reroute(self._space.name, self._used, err)
                if not self._space._may_reattach():
                    raise
                await self._resume()
                continue
            if reply is grpc.aio.EOF:
                break
            change = self._state.read(reply)
            if change is not None:
                return change
        raise StopAsyncIteration

    async def _resume(self) -> None:
        try:
            first = await self._space._call(self._open, self._state.resume_request())
        except (CallCancelledError, asyncio.CancelledError):
            if self._closed and not _being_cancelled():
                return
            raise
        self._state.started(first)

    async def ack(self, cursor: str | None = None) -> None:
        """Move the durable subscription's position forward (see `outrig.ChangeStream.ack`)."""
        request = self._state.ack_request(cursor)
        await self._space._call(self._space._ops["AckChanges"], request)

    async def close(self) -> None:
        """Stop reading by cancelling the stream."""
        self._closed = True
        if self._call is not None:
            self._call.cancel()


def _being_cancelled() -> bool:
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0
