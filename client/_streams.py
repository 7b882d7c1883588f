"""A server stream of the blocking client that opens itself again across UNAVAILABLE:
`ResumableStream`, what `outrig.Notification` (a notify registration, reattached by its id) and
`outrig.ChangeStream` (a change stream, reopened from its cursor) share. A subclass says which
method it calls, what its first message means and which request resumes it; this class opens the
stream through the space's `_call` (retried, routed), reads it, reattaches when it breaks, and
closes it, also from another thread. Its asyncio twin is `outrig.aio._streams`."""

from __future__ import annotations

from types import TracebackType
from typing import TYPE_CHECKING, Any, Generic, Self, TypeVar

from google.protobuf.message import Message

from outrig._base import rpc_errors
from outrig._exceptions import CallCancelledError, UnavailableError

if TYPE_CHECKING:
    from outrig._sync import Space

__all__ = ["ResumableStream"]

T = TypeVar("T")


class ResumableStream(Generic[T]):
    """A context manager and iterator of `T`, read from a server stream (module docstring)."""

    #: What the stream is, in messages ("the notification is closed").
    _what = "stream"

    def __init__(self, space: Space) -> None:
        self._space = space
        self._call: Any = None
        self._closed = False
        self._used: str | None = None  # where the stream went (None: home), for `reroute`

    # ------------------------------------------------------------------ what a subclass says

    def _method(self, stub: Any) -> Any:
        """The stub's streaming method."""
        raise NotImplementedError

    def _first_request(self) -> Message:
        raise NotImplementedError

    def _started(self, first: Any) -> None:
        """The first message of the stream (None if it ended at once), when it is first opened."""
        raise NotImplementedError

    def _resume_request(self) -> Message:
        raise NotImplementedError

    def _resumed(self, first: Any) -> None:
        """The first message of a stream opened again."""
        self._started(first)

    def _item(self, reply: Any) -> T | None:
        """What a later message carries; None: nothing for the caller (read on)."""
        raise NotImplementedError

    # ------------------------------------------------------------------ the stream

    def __enter__(self) -> Self:
        self._start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _start(self) -> None:
        if self._call is not None:
            return
        if self._closed:
            raise RuntimeError(f"the {self._what} is closed")
        try:
            self._started(self._space._call(self._open, self._first_request()))
        except BaseException:
            self.close()
            raise

    def _open(self, request: Message) -> Any:
        """Open the stream and return its first message (None if it ended at once)."""
        space = self._space
        self._used = space._connection.route_of(space.name)
        self._call = call = self._method(space._stub)(request)
        if self._closed:  # close() from another thread may have cancelled the previous call only
            call.cancel()
        try:
            return next(call, None)
        except BaseException:
            call.cancel()
            raise

    def __iter__(self) -> Self:
        return self

    def __next__(self) -> T:
        self._start()
        while not self._closed:
            try:
                with rpc_errors:
                    reply = next(self._call, None)
            except CallCancelledError:
                if self._closed:  # close() from another thread ends the iteration quietly
                    break
                raise
            except UnavailableError as err:
                self._space._connection.reroute(self._space.name, self._used, err)
                if not self._space._may_reattach():
                    raise
                self._resume()
                continue
            if reply is None:
                break
            item = self._item(reply)
            if item is not None:
                return item
        raise StopIteration

    def _resume(self) -> None:
        """Open the stream again (retried as a call is, within the retry policy)."""
        try:
            first = self._space._call(self._open, self._resume_request())
        except CallCancelledError:
            if self._closed:
                return
            raise
        self._resumed(first)

    def close(self) -> None:
        """Stop reading by cancelling the stream (safe to call from another thread)."""
        self._closed = True
        if self._call is not None:
            self._call.cancel()
