"""The asyncio client: `connect`, `AsyncSpace`, `AsyncLease` and `AsyncNotification`.

The twin of `outrig._sync`, differing only in the I/O; requests, replies and errors are handled
by `outrig._base`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterable, Sequence
from types import TracebackType
from typing import Any, TypeVar, overload

import grpc
import grpc.aio
from google.protobuf.message import Message

from outrig._admin import BrowsePage, SpaceDescription, browse_page_of, description_of
from outrig._base import (
    ANY,
    DEFAULT_MAX_MESSAGE_BYTES,
    DEFAULT_RETRY_DEADLINE,
    LOCATE_TIMEOUT,
    BaseLease,
    BaseSpace,
    Event,
    LeaseArg,
    LeaseResult,
    Location,
    Placement,
    Templates,
    channel_options,
    check_connect_args,
    event_of,
    first_entry,
    lease_results,
    location_of,
    owner_of,
    partitioning_of,
    placements_of,
    registration_of,
    rpc_errors,
)
from outrig._changes import ChangeFeedState, delete_subscription_request
from outrig._codec import AnyEntry, decode_entries
from outrig._delivery import Settle, ack_many_request, acked_many, check_ack, deliveries_of, mark_settled
from outrig._exceptions import DeadlineExceededError, OutrigError, UnavailableError, error_from_rpc
from outrig._matchers import OrderBy
from outrig._mux_wire import closed
from outrig._retry import Attempts
from outrig._tls import TLS, channel_credentials, token_metadata
from outrig.aio._changes import AsyncChangeStream
from outrig.aio._delivery import AsyncDeliveries, AsyncDelivery, AsyncTaking
from outrig.aio._mux import AsyncMux
from outrig.aio._streams import AsyncResumableStream
from outrig.v1 import space_pb2 as pb

__all__ = ["AsyncLease", "AsyncNotification", "AsyncSpace", "connect"]

Request = TypeVar("Request", bound=Message)
Reply = TypeVar("Reply")


def connect(
    target: str,
    *,
    space: str = "default",
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    options: Iterable[tuple[str, Any]] = (),
    retry_deadline: float = DEFAULT_RETRY_DEADLINE,
    tls: TLS | None = None,
    token: str | None = None,
    mux: bool = True,
    direct: bool = True,
) -> AsyncSpace:
    """Open an asyncio connection to an outrig server and return the named space.

    Call it from a running event loop. The arguments are those of `outrig.connect`, including
    ``tls`` and ``token`` (an `outrig.TLS` and a bearer token), ``mux``, ``direct`` (send each
    space's calls straight to its owner in a tier of servers) and ``retry_deadline``: for how
    many seconds from its first failure a call that fails with `UnavailableError` is retried
    (0: never). Use the result with ``async with``, or ``await space.close()`` when done.
    """
    check_connect_args(space, retry_deadline)
    credentials = channel_credentials(tls, token)
    if credentials is None:
        all_options = channel_options(max_message_bytes, options)
    else:
        assert tls is not None
        all_options = channel_options(max_message_bytes, [*tls.options(), *options])

    def dial(address: str) -> grpc.aio.Channel:
        if credentials is None:
            return grpc.aio.insecure_channel(address, options=all_options)
        return grpc.aio.secure_channel(address, credentials, options=all_options)

    opened = AsyncSpace(
        dial(target),
        space,
        owns_channel=True,
        retry_deadline=retry_deadline,
        metadata=token_metadata(token),
        mux=mux,
    )
    opened._route_directly(target, dial if direct else None)
    return opened


class AsyncSpace(BaseSpace):
    """A named space on an outrig server, with asyncio calls: the twin of `outrig.Space`.

    Every method is awaited, except `contents` (``async for``) and `notify` (``async with``).
    ``AsyncSpace(grpc.aio.secure_channel(...), "jobs")`` wraps a channel you made yourself.
    Calls that fail with `UnavailableError` are retried as `outrig.Space` describes, and
    `retries` counts the retried attempts.
    """

    async def __aenter__(self) -> AsyncSpace:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    @staticmethod
    def _new_mux(channel: Any, metadata: Sequence[tuple[str, str]]) -> AsyncMux:
        return AsyncMux(channel, metadata)

    async def close(self) -> None:
        """Close the connection, if this space owns it: every channel it opened (to the owners
        of its spaces, too). Calls in flight are cancelled."""
        if self._owns_channel:
            for link in self._connection.close():
                if link.mux is not None:
                    link.mux.close()
                await link.channel.close()

    def with_space(self, name: str) -> AsyncSpace:
        """Return the space ``name`` on the same connection (closing it leaves the connection open).

        It shares this space's retry deadline and `retries` counter; its calls are routed to
        its own owner (see ``direct`` in `outrig.connect`).
        """
        return self._on_same_connection(name)

    async def write(
        self,
        entry: AnyEntry,
        lease: LeaseArg = ANY,
        *,
        delay: float | None = None,
        visible_at: float | None = None,
    ) -> AsyncLease:
        """Store a copy of ``entry`` and return its lease; see `outrig.Space.write` (and its
        ``delay`` and ``visible_at``)."""
        request = self._write_request(entry, lease, delay, visible_at)
        reply: pb.WriteReply = await self._call(self._ops["Write"], request)
        return AsyncLease(self, reply.lease)

    async def write_many(
        self,
        entries: Iterable[AnyEntry],
        lease: LeaseArg = ANY,
        *,
        delay: float | None = None,
        visible_at: float | None = None,
    ) -> list[AsyncLease]:
        """Store all of ``entries``, or none of them; return their leases, in order."""
        request = self._write_many_request(entries, lease, delay, visible_at)
        reply: pb.WriteManyReply = await self._call(self._ops["WriteMany"], request)
        return [AsyncLease(self, message) for message in reply.leases]

    async def read(
        self, templates: Templates, timeout: float | None = None, *, order_by: OrderBy = None
    ) -> AnyEntry | None:
        """Return a copy of a matching entry, waiting up to ``timeout`` seconds (None: no limit).

        Returns None if nothing matched in time.
        """
        reply: pb.MatchReply = await self._call(
            self._ops["Read"], self._match_request(templates, timeout, order_by=order_by)
        )
        return first_entry(reply)

    async def read_nowait(self, templates: Templates, *, order_by: OrderBy = None) -> AnyEntry | None:
        """Return a copy of an entry that matches now, or None; never waits (see
        `outrig.Space.read_nowait`)."""
        return await self.read_if_exists(templates, lock_timeout=0.0, order_by=order_by)

    async def read_if_exists(
        self, templates: Templates, *, lock_timeout: float | None, order_by: OrderBy = None
    ) -> AnyEntry | None:
        """Return a copy of an entry that matches now, or None, waiting only for other
        transactions' locks (see `outrig.Space.read_if_exists`)."""
        request = self._match_request(templates, lock_timeout, if_exists=True, order_by=order_by)
        reply: pb.MatchReply = await self._call(self._ops["Read"], request)
        return first_entry(reply)

    @overload
    async def take(
        self,
        templates: Templates,
        timeout: float | None = None,
        *,
        order_by: OrderBy = None,
        ack: None = None,
    ) -> AnyEntry | None: ...
    @overload
    async def take(
        self,
        templates: Templates,
        timeout: float | None = None,
        *,
        order_by: OrderBy = None,
        ack: float,
        max_deliveries: int = 0,
        settle: Settle = None,
    ) -> AsyncDelivery | None: ...
    async def take(
        self,
        templates: Templates,
        timeout: float | None = None,
        *,
        order_by: OrderBy = None,
        ack: float | None = None,
        max_deliveries: int = 0,
        settle: Settle = None,
    ) -> AnyEntry | AsyncDelivery | None:
        """Remove and return a matching entry, waiting up to ``timeout`` seconds (None: no limit).

        Returns None if nothing matched in time. ``ack``: deliver it instead, and return an
        `AsyncDelivery` (see `outrig.Space.take`).
        """
        request = self._take_request(
            templates, timeout, order_by=order_by, ack=ack, max_deliveries=max_deliveries, settle=settle
        )
        return self._taken_one(request, await self._call(self._ops["Take"], request), settle)

    @overload
    async def take_nowait(
        self, templates: Templates, *, order_by: OrderBy = None, ack: None = None
    ) -> AnyEntry | None: ...
    @overload
    async def take_nowait(
        self,
        templates: Templates,
        *,
        order_by: OrderBy = None,
        ack: float,
        max_deliveries: int = 0,
        settle: Settle = None,
    ) -> AsyncDelivery | None: ...
    async def take_nowait(
        self,
        templates: Templates,
        *,
        order_by: OrderBy = None,
        ack: float | None = None,
        max_deliveries: int = 0,
        settle: Settle = None,
    ) -> AnyEntry | AsyncDelivery | None:
        """Remove and return an entry that matches now, or None; never waits. ``ack``: deliver it."""
        request = self._take_request(
            templates,
            0.0,
            if_exists=True,
            order_by=order_by,
            ack=ack,
            max_deliveries=max_deliveries,
            settle=settle,
        )
        return self._taken_one(request, await self._call(self._ops["Take"], request), settle)

    async def take_if_exists(
        self, templates: Templates, *, lock_timeout: float | None, order_by: OrderBy = None
    ) -> AnyEntry | None:
        """Remove and return an entry that matches now, or None, waiting only for other
        transactions' locks (see `outrig.Space.take_if_exists`)."""
        request = self._take_request(templates, lock_timeout, if_exists=True, order_by=order_by)
        reply: pb.MatchReply = await self._call(self._ops["Take"], request)
        return first_entry(reply)

    def taking(
        self,
        templates: Templates,
        timeout: float | None = None,
        *,
        ack: float = 30.0,
        order_by: OrderBy = None,
        max_deliveries: int = 0,
    ) -> AsyncTaking:
        """Take with an acknowledgement deadline for the length of an ``async with`` block: the
        `AsyncDelivery` (or None on timeout) is acknowledged when the block ends normally and
        returned when it raises; see `outrig.Space.taking`."""
        request = self._take_request(
            templates, timeout, order_by=order_by, ack=ack, max_deliveries=max_deliveries
        )

        async def take() -> AsyncDelivery | None:
            found = self._delivered(await self._call(self._ops["Take"], request))
            return found[0] if found else None

        return AsyncTaking(take)

    def _delivered(self, reply: pb.MatchReply) -> list[AsyncDelivery]:
        return deliveries_of(reply, lambda entry, message: AsyncDelivery(self, entry, message))

    def _taken_one(
        self, request: pb.MatchRequest, reply: pb.MatchReply, settle: Settle = None
    ) -> AnyEntry | AsyncDelivery | None:
        if not request.HasField("ack"):
            return first_entry(reply)
        mark_settled(request, settle)
        found = self._delivered(reply)
        return found[0] if found else None

    async def read_many(
        self,
        templates: Templates,
        *,
        max_entries: int,
        timeout: float | None = None,
        order_by: OrderBy = None,
    ) -> list[AnyEntry]:
        """Return copies of up to ``max_entries`` matching entries; see `outrig.Space.read_many`."""
        request = self._match_request(templates, timeout, max_entries=max_entries, order_by=order_by)
        reply: pb.MatchReply = await self._call(self._ops["ReadMany"], request)
        return decode_entries(reply.entries)

    @overload
    async def take_many(
        self,
        templates: Templates,
        *,
        max_entries: int,
        timeout: float | None = None,
        order_by: OrderBy = None,
        ack: None = None,
    ) -> list[AnyEntry]: ...
    @overload
    async def take_many(
        self,
        templates: Templates,
        *,
        max_entries: int,
        timeout: float | None = None,
        order_by: OrderBy = None,
        ack: float,
        max_deliveries: int = 0,
        settle: Settle = None,
    ) -> list[AsyncDelivery]: ...
    async def take_many(
        self,
        templates: Templates,
        *,
        max_entries: int,
        timeout: float | None = None,
        order_by: OrderBy = None,
        ack: float | None = None,
        max_deliveries: int = 0,
        settle: Settle = None,
    ) -> list[AnyEntry] | list[AsyncDelivery]:
        """Remove and return up to ``max_entries`` matching entries; see `outrig.Space.take_many`
        (and its ``ack``)."""
        request = self._take_request(
            templates,
            timeout,
            max_entries=max_entries,
            order_by=order_by,
            ack=ack,
            max_deliveries=max_deliveries,
            settle=settle,
        )
        reply: pb.MatchReply = await self._call(self._ops["TakeMany"], request)
        if ack is None:
            return decode_entries(reply.entries)
        mark_settled(request, settle)
        return self._delivered(reply)

    async def ack_many(self, deliveries: Sequence[AsyncDelivery]) -> list[OutrigError | None]:
        """Acknowledge several deliveries in one call; per-delivery errors are returned, not
        raised (see `outrig.Space.ack_many`)."""
        deliveries = list(deliveries)
        if not deliveries:
            return []
        reply = await self._call(
            self._ops["Ack"], ack_many_request(self.name, deliveries, self._request_id())
        )
        return acked_many(deliveries, reply)

    def deliveries(
        self,
        templates: Templates,
        timeout: float | None = None,
        *,
        ack: float = 30.0,
        order_by: OrderBy = None,
        max_deliveries: int = 0,
    ) -> AsyncDeliveries:
        """A worker loop of takes with an acknowledgement deadline, each settling the delivery
        before it: ``async with space.deliveries(Job(), ack=30.0, timeout=60.0) as jobs:`` then
        ``async for delivery in jobs:``; see `outrig.Space.deliveries`."""
        check_ack(ack, max_deliveries)

        async def take(previous: AsyncDelivery | None) -> AsyncDelivery | None:
            request = self._take_request(
                templates, timeout, order_by=order_by, ack=ack, max_deliveries=max_deliveries, settle=previous
            )
            found = self._delivered(await self._call(self._ops["Take"], request))
            mark_settled(request, previous)
            return found[0] if found else None

        return AsyncDeliveries(take)

    def contents(
        self, templates: Templates, *, max_entries: int = 0, order_by: OrderBy = None
    ) -> AsyncGenerator[AnyEntry, None]:
        """Iterate (``async for``) over copies of the matching entries (at most ``max_entries``; 0: all).

        Closing the iterator early (``aclose()``) cancels the stream. As with `outrig.Space.contents`,
        only a stream that breaks before its first entries arrive is retried.
        """
        # Built here, not in the generator, so that a bad template raises at the call.
        return self._contents(self._contents_request(templates, max_entries, order_by))

    async def _contents(self, request: pb.ContentsRequest) -> AsyncGenerator[AnyEntry, None]:
        call, reply = await self._call(self._open_contents, request)
        try:
            while reply is not grpc.aio.EOF:
                for entry in decode_entries(reply.entries):
                    yield entry
                with rpc_errors:
                    reply = await call.read()
        finally:
            call.cancel()  # a no-op once the stream has ended

    async def _open_contents(self, request: pb.ContentsRequest) -> tuple[Any, Any]:
        """Open a contents stream and wait for its first message (or EOF); `_call` retries this part."""
        call = self._stub.Contents(request)
        try:
            return call, await call.read()
        except BaseException:
            call.cancel()
            raise

    async def count(self, templates: Templates) -> int:
        """Return how many entries match now."""
        reply: pb.CountReply = await self._call(self._ops["Count"], self._count_request(templates))
        return reply.count

    async def locate(self) -> Location:
        """Return where this space is served: the address of its owner in a tier of servers (or of
        the server reached, when it is the owner), and whether the server reached is the owner.
        The server asked is always the one given to `connect`, wherever `target` says the
        space's calls go now. Calls through any server of a tier reach the owner anyway
        (forwarded, one hop longer), and `connect`'s ``direct`` routing sends them to it."""
        reply: pb.LocateReply = await self._call(
            self._connection.home.ops["Locate"], self._locate_request(), home=True
        )
        return location_of(reply)

    async def list_spaces(self) -> list[Placement]:
        """Return every space of the server's tier and its owner, by name (a lone server: its own
        spaces, all ``here``). Needs the ``admin`` action on ``outrig://*`` under a policy."""
        reply: pb.ListSpacesReply = await self._call(
            self._connection.home.ops["ListSpaces"], pb.ListSpacesRequest(), home=True
        )
        return placements_of(reply)

    async def describe(self) -> SpaceDescription:
        """What this space holds; see `outrig.Space.describe`."""
        request = pb.DescribeSpaceRequest(space=self._name)
        reply: pb.DescribeSpaceReply = await self._call(self._ops["DescribeSpace"], request)
        return description_of(reply)

    async def browse(
        self, templates: Templates | None = None, *, after: int = 0, max_entries: int = 100
    ) -> BrowsePage:
        """A page of the matching entries, none taken; see `outrig.Space.browse`."""
        request = self._browse_request(templates, after, max_entries)
        reply: pb.BrowseReply = await self._call(self._ops["Browse"], request)
        return browse_page_of(reply)

    async def purge(self, templates: Templates, *, dry_run: bool = False, max_entries: int = 0) -> int:
        """Remove (or count) the matching entries; see `outrig.Space.purge`."""
        request = self._purge_request(templates, dry_run, max_entries)
        reply: pb.PurgeReply = await self._call(self._ops["Purge"], request)
        return reply.count

    async def cancel_registration(self, registration_id: int) -> None:
        """End a notify registration by id; see `outrig.Space.cancel_registration`."""
        await self._call(self._ops["CancelRegistration"], self._lease_id_request(registration_id))

    async def abort_transaction(self, transaction_id: int) -> None:
        """Abort a transaction by id; see `outrig.Space.abort_transaction`."""
        await self._call(self._ops["AbortTransaction"], self._lease_id_request(transaction_id))

    def notify(self, templates: Templates, lease: LeaseArg = ANY) -> AsyncNotification:
        """Register for an event each time a matching entry is written::

            async with space.notify(Task(job="resize"), lease=60.0) as events:
                async for event in events:
                    ...

        See `outrig.Space.notify`.
        """
        return AsyncNotification(self, self._notify_request(templates, lease))

    def changes(
        self,
        templates: Templates | None = None,
        *,
        since: str | None = None,
        kinds: Iterable[str] | None = None,
        durable: str | None = None,
    ) -> AsyncChangeStream:
        """Stream the space's changes of matching entries from a cursor, then live::

            async with space.changes(Task(), since=cursor) as events:
                async for change in events:
                    ...

        See `outrig.Space.changes`.
        """
        return AsyncChangeStream(self, ChangeFeedState.of(self._name, templates, since, kinds, durable))

    async def delete_subscription(self, name: str) -> None:
        """Delete a durable subscription; see `outrig.Space.delete_subscription`."""
        await self._call(self._ops["DeleteSubscription"], delete_subscription_request(self._name, name))

    async def renew_many(
        self, leases: Sequence[AsyncLease], duration: LeaseArg
    ) -> list[LeaseResult[AsyncLease]]:
        """Renew several leases in one call; per-lease errors are returned, not raised.

        See `outrig.Space.renew_many`.
        """
        leases = list(leases)
        request = self._renew_request(leases, duration)
        reply: pb.RenewLeasesReply = await self._call(self._ops["RenewLeases"], request)
        return lease_results(leases, reply.results, renewed=True)

    async def cancel_many(self, leases: Sequence[AsyncLease]) -> list[LeaseResult[AsyncLease]]:
        """Cancel several leases in one call; per-lease errors are returned, not raised.

        See `outrig.Space.cancel_many`.
        """
        leases = list(leases)
        reply: pb.CancelLeasesReply = await self._call(
            self._ops["CancelLeases"], self._cancel_request(leases)
        )
        return lease_results(leases, reply.results, renewed=False)

    def transaction(self, lease: LeaseArg = 30.0, *, route: object = None) -> AsyncTransaction:
        """A transaction of this space under a lease (seconds, default 30); see
        `outrig.Space.transaction` (and its ``route``, for a partitioned space). It begins when
        entered (``async with``) or awaited."""
        return AsyncTransaction(self, lease, route)

    async def _call(
        self, method: Callable[[Request], Awaitable[Reply]], request: Request, *, home: bool = False
    ) -> Reply:
        """Make a unary call, retrying it on UNAVAILABLE as long as the retry policy allows; each
        attempt goes where the space's calls go now (see `outrig.Space._call`)."""
        # The retry schedule is made at the first failure, from when the call began: a call that
        # succeeds at once (nearly all) needs none.
        started = time.monotonic()
        attempts: Attempts[Request] | None = None
        connection = self._connection
        while True:
            if connection.closed:  # _check_open, inline
                raise closed()
            if attempts is not None:
                request = attempts.request  # what remains of a take's timeout
            key, used = self._name, None
            if not home and not connection.settled_home(key):  # else nothing to route
                key = connection.route_key(self._name, request)
                while connection.locate_due(key):
                    await self._relocate(key)  # a partitioned space's first: then its partition's
                    key = connection.route_key(self._name, request)
                if key != self._name and not getattr(request, "transaction", 0):
                    # A call of one partition names it: the server serves it without routing it
                    # again.
                    request.space = key  # type: ignore[attr-defined]
                used = connection.route_of(key)
            try:
                try:  # rpc_errors, inline: its __enter__ and __exit__ are two calls per call
                    return await method(request)
                except grpc.RpcError as err:
                    raise error_from_rpc(err) from err
            except UnavailableError as err:
                if not home:
                    connection.reroute(key, used, err)
                if attempts is None:
                    attempts = self._attempts(request, started)
                delay = attempts.backoff()
                if delay is None:
                    raise
                await asyncio.sleep(delay)
            except OutrigError as err:
                if not connection.refused(key, used, err):
                    raise

    async def _relocate(self, key: str = "") -> None:
        """Ask the home server where this space (or its partition) lives (see
        `outrig.Space._relocate`)."""
        owner: str | None = None
        partitioning: tuple[str, int] | None = None
        again = True
        try:
            with rpc_errors:
                reply = await self._connection.home.stub.Locate(
                    self._locate_request(key), timeout=LOCATE_TIMEOUT
                )
            owner, again, partitioning = owner_of(reply), False, partitioning_of(reply)
        except (UnavailableError, DeadlineExceededError):
            pass
        except OutrigError:
            again = False
        finally:
            self._connection.located(key or self._name, owner, again=again, partitioning=partitioning)


class AsyncLease(BaseLease):
    """A lease granted by an `AsyncSpace`; the twin of `outrig.Lease`, with awaited calls."""

    __slots__ = ("_space",)

    def __init__(self, space: AsyncSpace, message: pb.Lease) -> None:
        super().__init__(space._name, message)  # the attribute, not the property: a call fewer
        self._space = space

    async def renew(self, duration: LeaseArg) -> AsyncLease:
        """Extend the lease to ``duration`` seconds from now (or `FOREVER`/`ANY`); return self.

        Raises `NotFoundError` if the lease is unknown or has expired.
        """
        (result,) = await self._space.renew_many([self], duration)
        if result.error is not None:
            raise result.error
        return self

    async def cancel(self) -> None:
        """End the lease now. Raises `NotFoundError` if it is unknown or has expired."""
        (result,) = await self._space.cancel_many([self])
        if result.error is not None:
            raise result.error


class AsyncNotification(AsyncResumableStream[Event]):
    """A notify registration: an async context manager and async iterator of `Event` objects.

    The twin of `outrig.Notification`: entering it waits for the registration's `lease`, the
    iteration ends when that lease ends or after `close`, and registering and a stream that fails
    with `UnavailableError` are retried as there.
    """

    _what = "notification"

    def __init__(self, space: AsyncSpace, request: pb.NotifyRequest) -> None:
        super().__init__(space)
        self._request = request
        self._lease: AsyncLease | None = None

    @property
    def lease(self) -> AsyncLease:
        """The registration's lease (available once the notification is entered)."""
        if self._lease is None:
            raise RuntimeError("the notification has not started: use it in an async with block first")
        return self._lease

    def _method(self, stub: Any) -> Any:
        return stub.Notify

    def _first_request(self) -> pb.NotifyRequest:
        return self._request

    def _started(self, first: pb.NotifyReply | None) -> None:
        self._lease = AsyncLease(self._space, registration_of(first))

    def _resume_request(self) -> pb.NotifyRequest:
        """Attach a new stream to the registration (NotFoundError if it has ended meanwhile)."""
        return self._space._resume_request(self.lease)

    def _resumed(self, first: pb.NotifyReply | None) -> None:
        self.lease._update(registration_of(first))

    def _item(self, reply: pb.NotifyReply) -> Event:
        return event_of(reply)


class AsyncTransaction:
    """An open transaction of one space: the asyncio twin of `outrig.Transaction`.

    ``async with space.transaction(lease=30.0) as txn:`` begins it, commits it when the block
    ends normally and aborts it when the block raises; ``txn = await space.transaction()``
    begins it for explicit ``commit()`` or ``abort()``.
    """

    def __init__(self, space: AsyncSpace, lease: LeaseArg, route: object = None) -> None:
        self._space = space
        self._lease_arg = lease
        self._route = route
        self._under: AsyncSpace | None = None
        self._lease: AsyncLease | None = None
        self._ended = False

    async def _begin(self) -> AsyncTransaction:
        if self._lease is None:
            reply: pb.BeginReply = await self._space._call(
                self._space._ops["Begin"], self._space._begin_request(self._lease_arg, self._route)
            )
            self._lease = AsyncLease(self._space, reply.transaction)
            self._under = self._space._under(self._lease.id)
        return self

    def __await__(self) -> Any:
        return self._begin().__await__()

    async def __aenter__(self) -> AsyncTransaction:
        return await self._begin()

    async def __aexit__(
        self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._ended or self._lease is None:
            return
        if kind is None:
            await self.commit()
            return
        # The block's own error matters more; if the abort fails, the lease ends the transaction.
        with contextlib.suppress(OutrigError):
            await self.abort()

    @property
    def lease(self) -> AsyncLease:
        """The transaction's lease (once begun)."""
        if self._lease is None:
            raise RuntimeError("the transaction has not begun: use `async with` or await it first")
        return self._lease

    @property
    def id(self) -> int:
        return self.lease.id

    def _view(self) -> AsyncSpace:
        if self._under is None:
            raise RuntimeError("the transaction has not begun: use `async with` or await it first")
        return self._under

    def __repr__(self) -> str:
        state = "not begun" if self._lease is None else f"id={self._lease.id}, ended={self._ended}"
        return f"AsyncTransaction({state}, space={self._space.name!r})"

    async def commit(self) -> None:
        """See `outrig.Transaction.commit`."""
        await self._space._call(self._space._ops["Commit"], self._space._end_request(self.id))
        self._ended = True

    async def abort(self) -> None:
        """See `outrig.Transaction.abort`."""
        await self._space._call(self._space._ops["Abort"], self._space._end_request(self.id))
        self._ended = True

    async def renew(self, lease: LeaseArg = 30.0) -> AsyncLease:
        return await self.lease.renew(lease)

    async def write(self, entry: AnyEntry, lease: LeaseArg = ANY) -> AsyncLease:
        return await self._view().write(entry, lease)

    async def write_many(self, entries: Iterable[AnyEntry], lease: LeaseArg = ANY) -> list[AsyncLease]:
        return await self._view().write_many(entries, lease)

    async def read(
        self, templates: Templates, timeout: float | None = None, *, order_by: OrderBy = None
    ) -> AnyEntry | None:
        return await self._view().read(templates, timeout, order_by=order_by)

    async def read_nowait(self, templates: Templates, *, order_by: OrderBy = None) -> AnyEntry | None:
        return await self._view().read_nowait(templates, order_by=order_by)

    async def read_if_exists(
        self, templates: Templates, *, lock_timeout: float | None, order_by: OrderBy = None
    ) -> AnyEntry | None:
        return await self._view().read_if_exists(templates, lock_timeout=lock_timeout, order_by=order_by)

    async def take(
        self, templates: Templates, timeout: float | None = None, *, order_by: OrderBy = None
    ) -> AnyEntry | None:
        return await self._view().take(templates, timeout, order_by=order_by)

    async def take_nowait(self, templates: Templates, *, order_by: OrderBy = None) -> AnyEntry | None:
        return await self._view().take_nowait(templates, order_by=order_by)

    async def take_if_exists(
        self, templates: Templates, *, lock_timeout: float | None, order_by: OrderBy = None
    ) -> AnyEntry | None:
        return await self._view().take_if_exists(templates, lock_timeout=lock_timeout, order_by=order_by)

    async def read_many(
        self,
        templates: Templates,
        *,
        max_entries: int,
        timeout: float | None = None,
        order_by: OrderBy = None,
    ) -> list[AnyEntry]:
        return await self._view().read_many(
            templates, max_entries=max_entries, timeout=timeout, order_by=order_by
        )

    async def take_many(
        self,
        templates: Templates,
        *,
        max_entries: int,
        timeout: float | None = None,
        order_by: OrderBy = None,
    ) -> list[AnyEntry]:
        return await self._view().take_many(
            templates, max_entries=max_entries, timeout=timeout, order_by=order_by
        )

    def contents(
        self, templates: Templates, *, max_entries: int = 0, order_by: OrderBy = None
    ) -> AsyncGenerator[AnyEntry, None]:
        return self._view().contents(templates, max_entries=max_entries, order_by=order_by)

    async def count(self, templates: Templates) -> int:
        return await self._view().count(templates)

    def notify(self, templates: Templates, lease: LeaseArg = ANY) -> AsyncNotification:
        return self._view().notify(templates, lease)
