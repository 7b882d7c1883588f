"""A space's change log, read from a cursor (docs/notifications.md): `Change`, the state of a
change stream that the blocking and asyncio clients share (`ChangeFeedState`: the requests it
sends, the replies it reads, its cursor), and the blocking `ChangeStream`.

A stream starts after its `since` cursor (None: from now), replays what the log holds after it,
then goes on live, as one sequence. Each change carries the cursor after it; the stream's own
`cursor` is the last position read, which also moves past changes that did not match (the server
says so with a cursor-only message), so a resume from it skips them. When the stream breaks with
UNAVAILABLE (a server restart), the client opens it again from that cursor, under the space's
retry policy: nothing is missed and nothing comes twice. A durable stream (``durable=NAME``)
resumes from the subscription's position on the server, which only `ack` moves: what came
after the last ack may come again (at least once).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from outrig._base import Templates, _fill_templates
from outrig._codec import AnyEntry, decode_entry
from outrig._exceptions import InternalError
from outrig._protocol import CHANGE_KIND_NUMBERS
from outrig._streams import ResumableStream
from outrig.v1 import space_pb2 as pb

if TYPE_CHECKING:
    from outrig._sync import Space

__all__ = ["CHANGE_KINDS", "Change", "ChangeFeedState", "ChangeStream"]

#: The kinds of change, in the words `Change.kind` uses.
CHANGE_KINDS: Final = tuple(CHANGE_KIND_NUMBERS)
_KIND_NAMES: Final = {number: name for name, number in CHANGE_KIND_NUMBERS.items()}


@dataclass(frozen=True, slots=True)
class Change:
    """One change of a space's stored set.

    Attributes:
        cursor: the position after this change (an opaque string): a stream opened with
            ``since=cursor`` gets exactly the changes after it.
        kind: ``"write"``, ``"take"``, ``"expire"`` (its lease ran out), ``"cancel"`` (its lease
            was cancelled), ``"purge"`` (an administrator's purge) or ``"dead"`` (moved to the
            dead-letter space).
        entry: the entry as it was.
        at: when the change happened, seconds since the Unix epoch.
        transaction: the id of the transaction whose commit made it; 0: none.
        visible_at: a delayed write's time of visibility (epoch seconds), else None.
    """

    cursor: str
    kind: str
    entry: AnyEntry
    at: float
    transaction: int = 0
    visible_at: float | None = None


def check_changes_args(since: object, kinds: object, durable: object) -> tuple[str | None, list[int], str]:
    """`Space.changes`'s arguments, checked: TypeError or ValueError naming the argument."""
    if since is not None and not isinstance(since, str):
        raise TypeError(f"since must be a cursor (a str) or None, got {type(since).__name__}")
    if durable is not None and not isinstance(durable, str):
        raise TypeError(f"durable must be a subscription name (a str) or None, got {type(durable).__name__}")
    numbers: list[int] = []
    if kinds is not None:
        if isinstance(kinds, str):
            kinds = (kinds,)
        if not isinstance(kinds, Iterable):
            raise TypeError(f"kinds must be an iterable of kinds of change, got {type(kinds).__name__}")
        for kind in kinds:
            number = CHANGE_KIND_NUMBERS.get(kind) if isinstance(kind, str) else None
            if number is None:
                raise ValueError(f"kinds: {kind!r} is no kind of change (one of {', '.join(CHANGE_KINDS)})")
            numbers.append(number)
    return since, numbers, durable or ""


class ChangeFeedState:
    """What a change stream has read and what it sends next, shared by `ChangeStream` and
    `outrig.aio.AsyncChangeStream` (no I/O)."""

    __slots__ = ("cursor", "oldest", "request", "space_name")

    def __init__(self, space_name: str, request: pb.ChangesRequest) -> None:
        self.space_name = space_name
        self.request = request
        #: The last position read ("" until the stream has started).
        self.cursor = ""
        #: The oldest cursor the log held when the stream (last) started.
        self.oldest = ""

    @classmethod
    def of(
        cls,
        space_name: str,
        templates: Templates | None,
        since: object,
        kinds: object,
        durable: object,
    ) -> ChangeFeedState:
        cursor, numbers, name = check_changes_args(since, kinds, durable)
        request = pb.ChangesRequest(space=space_name, kinds=numbers, durable=name)  # type: ignore[arg-type]
        if cursor is not None:
            request.since = cursor
        if templates is not None:
            _fill_templates(request.templates, templates)
        return cls(space_name, request)

    @property
    def durable(self) -> str:
        return self.request.durable

    def started(self, first: pb.ChangesReply | None) -> None:
        """Read a stream's first message: where it starts, and the oldest cursor."""
        if first is None or first.kind or not first.cursor:
            raise InternalError("the changes stream did not start with its cursors")
        self.cursor = first.cursor
        self.oldest = first.oldest

    def read(self, reply: pb.ChangesReply) -> Change | None:
        """A later message: its change (None for a cursor-only one); the cursor moves either way."""
        self.cursor = reply.cursor
        if not reply.kind:
            return None
        kind = _KIND_NAMES.get(reply.kind)
        if kind is None:  # a newer server's kind: shown by its number rather than dropped
            kind = f"kind {int(reply.kind)}"
        return Change(
            reply.cursor,
            kind,
            decode_entry(reply.entry),
            reply.at,
            reply.transaction,
            reply.visible_at if reply.HasField("visible_at") else None,
        )

    def resume_request(self) -> pb.ChangesRequest:
        """The request that opens the stream again after the last position read (a durable
        subscription resumes from its own position on the server)."""
        request = pb.ChangesRequest()
        request.CopyFrom(self.request)
        if self.cursor:
            request.since = self.cursor
        return request

    def ack_request(self, cursor: str | None) -> pb.AckChangesRequest:
        if not self.durable:
            raise ValueError("ack: only a durable stream (changes(durable=NAME)) is acknowledged")
        if cursor is not None and not isinstance(cursor, str):
            raise TypeError(f"cursor must be a str or None, got {type(cursor).__name__}")
        chosen = self.cursor if cursor is None else cursor
        if not chosen:
            raise RuntimeError("ack: the stream has not started: use it in a with block first")
        return pb.AckChangesRequest(space=self.space_name, durable=self.durable, cursor=chosen)


def delete_subscription_request(space_name: str, name: object) -> pb.DeleteSubscriptionRequest:
    if not isinstance(name, str) or not name:
        raise TypeError(f"a durable subscription's name (a non-empty str), got {name!r}")
    return pb.DeleteSubscriptionRequest(space=space_name, durable=name)


class ChangeStream(ResumableStream[Change]):
    """A stream of a space's changes: a context manager, and an iterator of `Change` objects
    (`Space.changes`).

    Entering it opens the stream (retried on `UnavailableError` like any call); iteration waits
    for the next change. When the stream fails with `UnavailableError` later (the server
    restarts), it is opened again from `cursor`, as the space's ``retry_deadline`` allows, and
    goes on. `CompactedError` if the log no longer holds the changes after the cursor.
    """

    _what = "change stream"

    def __init__(self, space: Space, state: ChangeFeedState) -> None:
        super().__init__(space)
        self._state = state

    @property
    def cursor(self) -> str:
        """The last position read: resume from it (``since=``) to miss nothing, see nothing twice."""
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

    def ack(self, cursor: str | None = None) -> None:
        """Move the durable subscription's position forward to `cursor` (default: this stream's
        `cursor`, every change read so far); an older cursor changes nothing. Answered once the
        position is durable. ValueError for a stream that is not durable."""
        request = self._state.ack_request(cursor)
        self._space._call(self._space._ops["AckChanges"], request)

    def close(self) -> None:
        """Stop reading by cancelling the stream (safe to call from another thread); a durable
        subscription is free for another stream then."""
        super().close()
