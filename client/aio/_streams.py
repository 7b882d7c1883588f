"""The asyncio twin of `outrig._streams`: `AsyncResumableStream`, what `AsyncNotification` and
`AsyncChangeStream` share (a server stream opened through the space's `_call`, read, opened again
across UNAVAILABLE, and closed, also from another task)."""

from __future__ import annotations

import asyncio
from types import TracebackType
from typing import TYPE_CHECKING, Any, Generic, Self, TypeVar

import grpc.aio
from google.protobuf.message import Message

from outrig._base import rpc_errors
from outrig._exceptions import CallCancelledError, UnavailableError

if TYPE_CHECKING:
    from outrig.aio._space import AsyncSpace

__all__ = ["AsyncResumableStream", "being_cancelled"]

T = TypeVar("T")


class AsyncResumableStream(Generic[T]):
    """An async context manager and async iterator of `T`, read from a server stream; the hooks
    are `outrig._streams.ResumableStream`'s."""

    _what = "stream"

    def __init__(self, space: AsyncSpace) -> None:
        self._space = space
        self._call: Any = None
        self._closed = False
        self._used: str | None = None  # where the stream went (None: home), for `reroute`

    def _method(self, stub: Any) -> Any:
        raise NotImplementedError

    def _first_request(self) -> Message:
        raise NotImplementedError

    def _started(self, first: Any) -> None:
        raise NotImplementedError

    def _resume_request(self) -> Message:
        raise NotImplementedError

    def _resumed(self, first: Any) -> None:
        self._started(first)

    def _item(self, reply: Any) -> T | None:
        raise NotImplementedError

    async def __aenter__(self) -> Self:
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
            raise RuntimeError(f"the {self._what} is closed")
        try:
            self._started(await self._space._call(self._open, self._first_request()))
        except BaseException:
            await self.close()
            raise

    async def _open(self, request: Message) -> Any:
        """Open the stream and return its first message (None if it ended at once)."""
        if self._closed:  # close() from another task while a retry slept
            raise CallCancelledError(f"the {self._what} was closed")
        space = self._space
        self._used = space._connection.route_of(space.name)
        self._call = call = self._method(space._stub)(request)
        try:
            first = await call.read()
        except BaseException:
            call.cancel()
            raise
        return None if first is grpc.aio.EOF else first

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> T:
        await self._start()
        while not self._closed:
            try:
                with rpc_errors:
                    reply = await self._call.read()
            except (CallCancelledError, asyncio.CancelledError):
                # close() from another task cancels the call under us: end quietly, unless it is
                # this task that is being cancelled.
                if self._closed and not being_cancelled():
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
            item = self._item(reply)
            if item is not None:
                return item
        raise StopAsyncIteration

    async def _resume(self) -> None:
        try:
            first = await self._space._call(self._open, self._resume_request())
        except (CallCancelledError, asyncio.CancelledError):
            if self._closed and not being_cancelled():
                return
            raise
        self._resumed(first)

    async def close(self) -> None:
        """Stop reading by cancelling the stream."""
        self._closed = True
        if self._call is not None:
            self._call.cancel()


def being_cancelled() -> bool:
    """Whether the current task is being cancelled (not merely its call)."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0
