"""The blocking client: `connect`, `Space`, `Lease` and `Notification`.

Only the I/O lives here; requests, replies and errors are handled by `outrig._base`, which the
asyncio twin in `outrig.aio` shares.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Generator, Iterable, Sequence
from types import TracebackType
from typing import Any, TypeVar, overload

import grpc
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
from outrig._changes import ChangeFeedState, ChangeStream, delete_subscription_request
from outrig._codec import AnyEntry, decode_entries
from outrig._delivery import (
    Deliveries,
    Delivery,
    Settle,
    Taking,
    ack_many_request,
    acked_many,
    check_ack,
    deliveries_of,
    mark_settled,
)
from outrig._exceptions import DeadlineExceededError, OutrigError, UnavailableError, error_from_rpc
from outrig._matchers import OrderBy
from outrig._mux import Mux
from outrig._mux_wire import closed
from outrig._retry import Attempts
from outrig._streams import ResumableStream
from outrig._tls import TLS, channel_credentials, token_metadata
from outrig.v1 import space_pb2 as pb

__all__ = ["Lease", "Notification", "Space", "Transaction", "connect"]

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
) -> Space:
    """Open a connection to an outrig server and return the named space.

    Args:
        target: the server's address, such as ``"127.0.0.1:7766"``.
        space: the space to use; a server creates a space on first use.
        max_message_bytes: the largest message sent or received (default 64 MiB).
        options: further gRPC channel options, as ``(name, value)`` pairs. They win over the
            client's own: the message size limits, and a channel that tries to reconnect every
            0.1 s to 1 s (``grpc.initial_reconnect_backoff_ms``, ``grpc.min_reconnect_backoff_ms``,
            ``grpc.max_reconnect_backoff_ms``) rather than gRPC's 1 s to 120 s.
        retry_deadline: for how many seconds, from its first failure, a call that fails with
            `UnavailableError` (server unreachable, restarting or unable to store) is retried,
            with exponential backoff and full jitter (0.05 s doubling up to 2 s); then the last
            `UnavailableError` is raised. 0 disables retries. See `Space` for what is retried.
        tls: an `outrig.TLS` to connect over TLS (its ``ca`` checks the server; its ``cert`` and
            ``key`` are the client certificate for mutual TLS). None: plaintext.
        token: a bearer token (from ``outrig token issue``), sent with every call; needs ``tls``.
            A server that does not know the caller answers `UnauthenticatedError`, one whose policy
            does not allow the call `PermissionDeniedError`; neither is retried. A failed TLS
            handshake shows up as `UnavailableError` (retried like any unreachable server).
        mux: send the operations over one Mux stream per server (the default), or each as a
            unary call.
        direct: in a tier of servers (``outrig serve --backend postgres``), send each space's
            calls straight to the server that owns it, rather than through ``target``, which
            would forward them (one hop longer). The first call of a space asks ``target`` where
            it lives (`Space.locate`); a space served elsewhere gets a second channel, to its
            owner's address, with the same TLS, token and options. A server that answers
            `NotOwnerError` naming another owner moves the space's calls there before the retry;
            an owner that cannot be reached sends them back to ``target`` (which forwards), which
            is asked again after a second. `Space.target` says where a space's calls go now.
            False: every call goes to ``target``.

    The returned `Space` owns the connection: use it as a context manager, or call
    ``close()``. Connecting is lazy, so an unreachable server shows up at the first call, as
    `UnavailableError` once ``retry_deadline`` has passed.
    """
    check_connect_args(space, retry_deadline)
    credentials = channel_credentials(tls, token)
    if credentials is None:
        all_options = channel_options(max_message_bytes, options)
    else:
        assert tls is not None
        all_options = channel_options(max_message_bytes, [*tls.options(), *options])

    def dial(address: str) -> grpc.Channel:
        if credentials is None:
            return grpc.insecure_channel(address, options=all_options)
        return grpc.secure_channel(address, credentials, options=all_options)

    opened = Space(
        dial(target),
        space,
        owns_channel=True,
        retry_deadline=retry_deadline,
        metadata=token_metadata(token),
        mux=mux,
    )
    opened._route_directly(target, dial if direct else None)
    return opened


class Space(BaseSpace):
    """A named space on an outrig server, with blocking calls.

    Get one from `outrig.connect`, or wrap a channel you made yourself (say, with TLS):
    ``Space(grpc.secure_channel(...), "jobs", retry_deadline=30.0)``. ``close()`` (or leaving the
    ``with`` block) closes the channel only if ``owns_channel`` is true, as it is for `connect`.

    Retries: a call that fails with `UnavailableError` is sent again until ``retry_deadline``
    seconds after its first failure (see `outrig.connect`). Reads, counts, renewals and
    cancellations are safe to repeat. Writes and takes carry a request id, the same for every
    retry of one call, with which the server answers a retry of something it already did with
    the first reply: a write is not stored twice and a take does not remove a second entry.
    A read or take with a timeout waits, over all its attempts, no longer than the timeout.
    `contents` is retried only until its first entries arrive, and a `Notification` whose stream
    breaks reattaches to its registration. `retries` counts the retried attempts.

    Templates: every method that matches takes one template or a list of them, of which any may
    match. A template is an entry whose ``None`` fields are wildcards; it matches entries of its
    type and of its subtypes. Reads return the entry's own (most derived) class, or a
    `GenericEntry` when its type has no class in this process.
    """

    def __enter__(self) -> Space:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    @staticmethod
    def _new_mux(channel: Any, metadata: Sequence[tuple[str, str]]) -> Mux:
        return Mux(channel, metadata)

    def close(self) -> None:
        """Close the connection, if this space owns it: every channel it opened (to the owners
        of its spaces, too). Calls in flight fail."""
        if self._owns_channel:
            for link in self._connection.close():
                if link.mux is not None:
                    link.mux.close()
                link.channel.close()

    def with_space(self, name: str) -> Space:
        """Return the space ``name`` on the same connection (closing it leaves the connection open).

        It shares this space's retry deadline and `retries` counter; its calls are routed to
        its own owner (see ``direct`` in `connect`).
        """
        return self._on_same_connection(name)

    def write(
        self,
        entry: AnyEntry,
        lease: LeaseArg = ANY,
        *,
        delay: float | None = None,
        visible_at: float | None = None,
    ) -> Lease:
        """Store a copy of ``entry`` and return its lease.

        ``lease`` is seconds, `outrig.FOREVER` or `outrig.ANY` (the space's default); the space
        may grant less. If the call fails in transit and its retries run out, the write may or
        may not have happened.

        ``delay`` (seconds from now) or ``visible_at`` (seconds since the Unix epoch, server
        clock) keep the entry invisible to every read, take, count and contents until then, with
        no limit but its lease; then parked takes get it, and notify hears of it. Not under a
        transaction.
        """
        request = self._write_request(entry, lease, delay, visible_at)
        reply: pb.WriteReply = self._call(self._ops["Write"], request)
        return Lease(self, reply.lease)

    def write_many(
        self,
        entries: Iterable[AnyEntry],
        lease: LeaseArg = ANY,
        *,
        delay: float | None = None,
        visible_at: float | None = None,
    ) -> list[Lease]:
        """Store all of ``entries``, or none of them; return their leases, in order. ``delay``
        and ``visible_at`` as for `write`, for every entry."""
        request = self._write_many_request(entries, lease, delay, visible_at)
        reply: pb.WriteManyReply = self._call(self._ops["WriteMany"], request)
        return [Lease(self, message) for message in reply.leases]

    def read(
        self, templates: Templates, timeout: float | None = None, *, order_by: OrderBy = None
    ) -> AnyEntry | None:
        """Return a copy of a matching entry, waiting up to ``timeout`` seconds for one.

        ``timeout=None`` waits without limit. Returns None if nothing matched in time.
        """
        reply: pb.MatchReply = self._call(
            self._ops["Read"], self._match_request(templates, timeout, order_by=order_by)
        )
        return first_entry(reply)

    def read_nowait(self, templates: Templates, *, order_by: OrderBy = None) -> AnyEntry | None:
        """Return a copy of an entry that matches now, or None; never waits.

        An entry locked by another transaction counts as no match; `read_if_exists` waits for
        such locks instead.
        """
        return self.read_if_exists(templates, lock_timeout=0.0, order_by=order_by)

    def read_if_exists(
        self, templates: Templates, *, lock_timeout: float | None, order_by: OrderBy = None
    ) -> AnyEntry | None:
        """Return a copy of an entry that matches now, or None (JavaSpaces ``readIfExists``).

        It waits for no new entry, but if the only matches are locked by other transactions, it
        waits up to ``lock_timeout`` seconds (None: without limit) for those to end.
        """
        request = self._match_request(templates, lock_timeout, if_exists=True, order_by=order_by)
        reply: pb.MatchReply = self._call(self._ops["Read"], request)
        return first_entry(reply)

    @overload
    def take(
        self,
        templates: Templates,
        timeout: float | None = None,
        *,
        order_by: OrderBy = None,
        ack: None = None,
    ) -> AnyEntry | None: ...
    @overload
    def take(
        self,
        templates: Templates,
        timeout: float | None = None,
        *,
        order_by: OrderBy = None,
        ack: float,
        max_deliveries: int = 0,
        settle: Settle = None,
    ) -> Delivery | None: ...
    def take(
        self,
        templates: Templates,
        timeout: float | None = None,
        *,
        order_by: OrderBy = None,
        ack: float | None = None,
        max_deliveries: int = 0,
        settle: Settle = None,
    ) -> AnyEntry | Delivery | None:
        """Remove and return a matching entry, waiting up to ``timeout`` seconds for one.

        ``timeout=None`` waits without limit. Returns None if nothing matched in time. Two takes
        never return the same entry.

        With ``ack`` (seconds, > 0) the entry is delivered, not removed: a `Delivery` is
        returned, and the entry stays in the space, invisible to every other read and take, until
        the delivery is acknowledged (`Delivery.ack`), returned (`Delivery.nack`) or ``ack``
        seconds pass (then it is visible again, in its place in arrival order: a worker that
        died loses nothing). An entry whose delivery ends unacknowledged after ``max_deliveries``
        deliveries (0: the space's setting) goes to the space's dead-letter space. Not under a
        transaction. See docs/work-queues.md.
        """
        request = self._take_request(
            templates, timeout, order_by=order_by, ack=ack, max_deliveries=max_deliveries, settle=settle
        )
        return self._taken_one(request, self._call(self._ops["Take"], request), settle)

    @overload
    def take_nowait(
        self, templates: Templates, *, order_by: OrderBy = None, ack: None = None
    ) -> AnyEntry | None: ...
    @overload
    def take_nowait(
        self,
        templates: Templates,
        *,
        order_by: OrderBy = None,
        ack: float,
        max_deliveries: int = 0,
        settle: Settle = None,
    ) -> Delivery | None: ...
    def take_nowait(
        self,
        templates: Templates,
        *,
        order_by: OrderBy = None,
        ack: float | None = None,
        max_deliveries: int = 0,
        settle: Settle = None,
    ) -> AnyEntry | Delivery | None:
        """Remove and return an entry that matches now, or None; never waits (see `read_nowait`).
        ``ack``: deliver it instead, as `take` does."""
        request = self._take_request(
            templates,
            0.0,
            if_exists=True,
            order_by=order_by,
            ack=ack,
            max_deliveries=max_deliveries,
            settle=settle,
        )
        return self._taken_one(request, self._call(self._ops["Take"], request), settle)

    def take_if_exists(
        self, templates: Templates, *, lock_timeout: float | None, order_by: OrderBy = None
    ) -> AnyEntry | None:
        """Remove and return an entry that matches now, or None (JavaSpaces ``takeIfExists``);
        waits only for other transactions' locks, as `read_if_exists` does."""
        request = self._take_request(templates, lock_timeout, if_exists=True, order_by=order_by)
        reply: pb.MatchReply = self._call(self._ops["Take"], request)
        return first_entry(reply)

    def taking(
        self,
        templates: Templates,
        timeout: float | None = None,
        *,
        ack: float = 30.0,
        order_by: OrderBy = None,
        max_deliveries: int = 0,
    ) -> Taking:
        """Take with an acknowledgement deadline, for the length of a ``with`` block::

            with space.taking(Job(), ack=30.0, timeout=5.0) as delivery:
                if delivery is not None:
                    run(delivery.entry)

        The block gets the `Delivery` (None if nothing matched within ``timeout``). It is
        acknowledged when the block ends normally and returned (`Delivery.nack`, with the
        space's backoff) when it raises; the exception goes on. A block may settle the delivery
        itself, and `Delivery.extend` it for a long job.
        """
        request = self._take_request(
            templates, timeout, order_by=order_by, ack=ack, max_deliveries=max_deliveries
        )

        def take() -> Delivery | None:
            found = self._delivered(self._call(self._ops["Take"], request))
            return found[0] if found else None

        return Taking(take)

    def _delivered(self, reply: pb.MatchReply) -> list[Delivery]:
        return deliveries_of(reply, lambda entry, message: Delivery(self, entry, message))

    def _taken_one(
        self, request: pb.MatchRequest, reply: pb.MatchReply, settle: Settle = None
    ) -> AnyEntry | Delivery | None:
        """A take's entry, or a take with ack's delivery; None if nothing matched in time."""
        if not request.HasField("ack"):
            return first_entry(reply)
        mark_settled(request, settle)
        found = self._delivered(reply)
        return found[0] if found else None

    def read_many(
        self,
        templates: Templates,
        *,
        max_entries: int,
        timeout: float | None = None,
        order_by: OrderBy = None,
    ) -> list[AnyEntry]:
        """Return copies of up to ``max_entries`` matching entries.

        Waits up to ``timeout`` seconds (None: without limit) for at least one; returns an empty
        list if none appeared in time.
        """
        request = self._match_request(templates, timeout, max_entries=max_entries, order_by=order_by)
        reply: pb.MatchReply = self._call(self._ops["ReadMany"], request)
        return decode_entries(reply.entries)

    @overload
    def take_many(
        self,
        templates: Templates,
        *,
        max_entries: int,
        timeout: float | None = None,
        order_by: OrderBy = None,
        ack: None = None,
    ) -> list[AnyEntry]: ...
    @overload
    def take_many(
        self,
        templates: Templates,
        *,
        max_entries: int,
        timeout: float | None = None,
        order_by: OrderBy = None,
        ack: float,
        max_deliveries: int = 0,
        settle: Settle = None,
    ) -> list[Delivery]: ...
    def take_many(
        self,
        templates: Templates,
        *,
        max_entries: int,
        timeout: float | None = None,
        order_by: OrderBy = None,
        ack: float | None = None,
        max_deliveries: int = 0,
        settle: Settle = None,
    ) -> list[AnyEntry] | list[Delivery]:
        """Remove and return up to ``max_entries`` matching entries (at least one if any exist).

        Waits up to ``timeout`` seconds (None: without limit) for at least one; returns an empty
        list if none appeared in time. ``ack``: deliver them instead, as `take` does, and
        return a `Delivery` for each.
        """
        request = self._take_request(
            templates,
            timeout,
            max_entries=max_entries,
            order_by=order_by,
            ack=ack,
            max_deliveries=max_deliveries,
            settle=settle,
        )
        reply: pb.MatchReply = self._call(self._ops["TakeMany"], request)
        if ack is None:
            return decode_entries(reply.entries)
        mark_settled(request, settle)
        return self._delivered(reply)

    def ack_many(self, deliveries: Sequence[Delivery]) -> list[OutrigError | None]:
        """Acknowledge several deliveries of this space (a `take_many`'s list, say) in one call
        and one durable change; return one outcome per delivery, in order: None (acknowledged,
        and marked settled) or the error that left it alone (`DeliveryExpiredError`: its
        delivery had ended), so that one late receipt does not fail the others."""
        deliveries = list(deliveries)
        if not deliveries:
            return []
        request = ack_many_request(self.name, deliveries, self._request_id())
        reply: pb.AckReply = self._call(self._ops["Ack"], request)
        return acked_many(deliveries, reply)

    def deliveries(
        self,
        templates: Templates,
        timeout: float | None = None,
        *,
        ack: float = 30.0,
        order_by: OrderBy = None,
        max_deliveries: int = 0,
    ) -> Deliveries:
        """A worker loop of takes with an acknowledgement deadline, each settling the last::

            with space.deliveries(Job(), ack=30.0, timeout=60.0) as jobs:
                for delivery in jobs:
                    run(delivery.entry)

        Each step takes the next delivery (waiting up to ``timeout`` seconds; the loop ends when
        none came in time, None: it never ends) and, in the same call, acknowledges the one
        before if the body left it unsettled: two calls per job (its write and its take). The
        body may `ack` or `nack` a delivery itself, or `extend` it. When the block ends normally
        its last delivery is acknowledged; when it raises, that delivery is returned (`nack`,
        with the space's backoff) and the exception goes on. A delivery whose deadline passed
        before the next take could settle it is counted in ``late`` (it is delivered again) and
        the loop goes on.
        """
        check_ack(ack, max_deliveries)

        def take(previous: Delivery | None) -> Delivery | None:
            request = self._take_request(
                templates, timeout, order_by=order_by, ack=ack, max_deliveries=max_deliveries, settle=previous
            )
            found = self._delivered(self._call(self._ops["Take"], request))
            mark_settled(request, previous)
            return found[0] if found else None

        return Deliveries(take)

    def contents(
        self, templates: Templates, *, max_entries: int = 0, order_by: OrderBy = None
    ) -> Generator[AnyEntry, None, None]:
        """Iterate over copies of the matching entries (at most ``max_entries``; 0: all).

        The entries stream in as the iteration proceeds; closing the generator early
        (``close()``, or letting it go) cancels the stream. A stream that breaks before its first
        entries arrive is retried; one that breaks later raises `UnavailableError`, since
        starting again would repeat entries.
        """
        # Built here, not in the generator, so that a bad template raises at the call.
        return self._contents(self._contents_request(templates, max_entries, order_by))

    def _contents(self, request: pb.ContentsRequest) -> Generator[AnyEntry, None, None]:
        call, reply = self._call(self._open_contents, request)
        try:
            while reply is not None:
                yield from decode_entries(reply.entries)
                with rpc_errors:
                    reply = next(call, None)
        finally:
            call.cancel()  # a no-op once the stream has ended

    def _open_contents(self, request: pb.ContentsRequest) -> tuple[Any, pb.ContentsReply | None]:
        """Open a contents stream and wait for its first message; `_call` retries this part only."""
        call = self._stub.Contents(request)
        try:
            return call, next(call, None)
        except BaseException:
            call.cancel()
            raise

    def count(self, templates: Templates) -> int:
        """Return how many entries match now."""
        reply: pb.CountReply = self._call(self._ops["Count"], self._count_request(templates))
        return reply.count

    def locate(self) -> Location:
        """Return where this space is served: the address of its owner in a tier of servers (or of
        the server reached, when it is the owner), and whether the server reached is the owner.
        The server asked is always the one given to `connect`, wherever `target` says the
        space's calls go now. Calls through any server of a tier reach the owner anyway
        (forwarded, one hop longer), and `connect`'s ``direct`` routing sends them to it."""
        reply: pb.LocateReply = self._call(
            self._connection.home.ops["Locate"], self._locate_request(), home=True
        )
        return location_of(reply)

    def list_spaces(self) -> list[Placement]:
        """Return every space of the server's tier and its owner, by name (a lone server: its own
        spaces, all ``here``). Needs the ``admin`` action on ``outrig://*`` under a policy."""
        reply: pb.ListSpacesReply = self._call(
            self._connection.home.ops["ListSpaces"], pb.ListSpacesRequest(), home=True
        )
        return placements_of(reply)

    def describe(self) -> SpaceDescription:
        """Return what this space holds: its types (entries, bytes, indexed fields), parked reads
        and takes by template, notify registrations, open transactions, the age of its oldest
        entry and the settings and quotas it runs under. Needs the ``admin`` action on
        ``outrig://SPACE`` under a policy."""
        request = pb.DescribeSpaceRequest(space=self._name)
        reply: pb.DescribeSpaceReply = self._call(self._ops["DescribeSpace"], request)
        return description_of(reply)

    def browse(
        self, templates: Templates | None = None, *, after: int = 0, max_entries: int = 100
    ) -> BrowsePage:
        """Return a page of the entries matching ``templates`` (None: every entry) in arrival order,
        without taking them: at most ``max_entries`` (at most 1,000), after the cursor ``after``
        (the ``next`` of the page before; 0: from the start). A page may hold fewer entries than
        asked while ``next`` is not 0 (a page looks at a bounded number of entries). Needs the
        ``admin`` action on the templates' types."""
        request = self._browse_request(templates, after, max_entries)
        reply: pb.BrowseReply = self._call(self._ops["Browse"], request)
        return browse_page_of(reply)

    def purge(self, templates: Templates, *, dry_run: bool = False, max_entries: int = 0) -> int:
        """Remove the entries matching ``templates`` (at most ``max_entries``; 0: all) and return
        how many were removed; ``dry_run`` only counts them. The server removes a batch at a time
        and serves other calls in between. Needs the ``admin`` action on the templates' types."""
        request = self._purge_request(templates, dry_run, max_entries)
        reply: pb.PurgeReply = self._call(self._ops["Purge"], request)
        return reply.count

    def cancel_registration(self, registration_id: int) -> None:
        """End the notify registration with this id (`describe` lists them), whoever made it.
        `NotFoundError` if the space has none such. Needs the ``admin`` action on the space."""
        self._call(self._ops["CancelRegistration"], self._lease_id_request(registration_id))

    def abort_transaction(self, transaction_id: int) -> None:
        """Abort the transaction with this id (`describe` lists them), whoever began it. Needs the
        ``admin`` action on the space."""
        self._call(self._ops["AbortTransaction"], self._lease_id_request(transaction_id))

    def notify(self, templates: Templates, lease: LeaseArg = ANY) -> Notification:
        """Register for an event each time a matching entry is written.

        Use the result as a context manager; iterate over it for `Event` objects::

            with space.notify(Task(job="resize"), lease=60.0) as events:
                for event in events:
                    ...

        The registration is leased: renew or cancel ``events.lease`` to extend or end it; the
        iteration ends when the lease does. If the stream breaks with `UnavailableError` (say,
        the server restarts), the iteration reattaches to the registration and goes on.
        """
        return Notification(self, self._notify_request(templates, lease))

    def changes(
        self,
        templates: Templates | None = None,
        *,
        since: str | None = None,
        kinds: Iterable[str] | None = None,
        durable: str | None = None,
    ) -> ChangeStream:
        """Stream the space's changes of matching entries, from a cursor, then live.

        Use the result as a context manager; iterate over it for `Change` objects::

            with space.changes(Task(job="resize"), since=cursor, kinds=("write", "take")) as events:
                for change in events:
                    ...  # change.kind, change.entry, change.cursor

        ``since`` is a cursor (a `Change`'s, or a stream's ``.cursor``): the stream first gives
        the changes the space's log holds after it, then each as it happens, with no gap and no
        duplicate between the two; None: from now. ``templates`` (None: every entry) and
        ``kinds`` (``"write"``, ``"take"``, ``"expire"``, ``"cancel"``, ``"purge"``, ``"dead"``;
        None: all) choose the changes. `CompactedError` (its ``.oldest`` the oldest cursor still
        held) when the log no longer holds the changes after ``since``. A broken stream is opened
        again from its last cursor by itself, under the space's retry policy.

        ``durable`` names a durable subscription: the server keeps its position, made at
        ``since`` the first time and moved by `ChangeStream.ack`; a stream attached to it later
        (even after a restart) starts there. At most one stream reads it at once
        (`SubscriptionBusyError`). docs/notifications.md has the guarantees.
        """
        return ChangeStream(self, ChangeFeedState.of(self._name, templates, since, kinds, durable))

    def delete_subscription(self, name: str) -> None:
        """Delete the durable subscription ``name`` of this space (`SubscriptionNotFoundError` if
        it has none such)."""
        self._call(self._ops["DeleteSubscription"], delete_subscription_request(self._name, name))

    def renew_many(self, leases: Sequence[Lease], duration: LeaseArg) -> list[LeaseResult[Lease]]:
        """Renew several leases of this space in one call; return one `LeaseResult` per lease.

        A lease that cannot be renewed (unknown or expired: `NotFoundError`) does not raise: its
        result carries the error. Renewed leases are updated in place.
        """
        leases = list(leases)
        reply: pb.RenewLeasesReply = self._call(
            self._ops["RenewLeases"], self._renew_request(leases, duration)
        )
        return lease_results(leases, reply.results, renewed=True)

    def cancel_many(self, leases: Sequence[Lease]) -> list[LeaseResult[Lease]]:
        """Cancel several leases of this space in one call; return one `LeaseResult` per lease.

        A lease that cannot be cancelled (unknown or expired: `NotFoundError`) does not raise:
        its result carries the error. That includes a lease the call did cancel, if the reply was
        lost and the retry found it gone.
        """
        leases = list(leases)
        reply: pb.CancelLeasesReply = self._call(self._ops["CancelLeases"], self._cancel_request(leases))
        return lease_results(leases, reply.results, renewed=False)

    def transaction(self, lease: LeaseArg = 30.0, *, route: object = None) -> Transaction:
        """Begin a transaction of this space under a lease (seconds, default 30), and return it.

        Use it as a context manager: it commits when the block ends normally and aborts when the
        block raises. Its methods are the space's, acting under the transaction: its writes stay
        invisible to others until it commits, what it reads others may read but not take, and what
        it takes nobody else sees; abort undoes all of it. If the client disappears, the
        transaction aborts when its lease runs out: `Transaction.renew` it for longer work.

        In a partitioned space (docs/scaling.md) a transaction works in one partition: ``route``
        is a value of the space's routing field, and every entry the transaction writes, and every
        template it reads or takes with that names the routing field, must be of that partition
        (`CrossPartitionError` otherwise); a template without the routing field looks in that
        partition only.
        """
        grant: pb.BeginReply = self._call(self._ops["Begin"], self._begin_request(lease, route))
        return Transaction(self, Lease(self, grant.transaction))

    def _call(self, method: Callable[[Request], Reply], request: Request, *, home: bool = False) -> Reply:
        """Make a unary call, retrying it on UNAVAILABLE as long as the retry policy allows.

        Each attempt goes where the space's calls go now (`_Connection`): the first of a space
        asks where it lives first, and a failure moves the route before the retry, which sends
        the same request (its request id, and what remains of a take's timeout)."""
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
                    self._relocate(key)  # a partitioned space's first: then its partition's
                    key = connection.route_key(self._name, request)
                if key != self._name and not getattr(request, "transaction", 0):
                    # A call of one partition names it: the server serves it without routing it
                    # again.
                    request.space = key  # type: ignore[attr-defined]
                used = connection.route_of(key)
            try:
                try:  # rpc_errors, inline: its __enter__ and __exit__ are two calls per call
                    return method(request)
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
                time.sleep(delay)
            except OutrigError as err:
                if not connection.refused(key, used, err):
                    raise

    def _relocate(self, key: str = "") -> None:
        """Ask the home server where this space lives, and route its calls there (`located`).
        No answer (unreachable, too slow) leaves them home, to ask again later; a refusal or an
        older server without Locate, for good."""
        owner: str | None = None
        partitioning: tuple[str, int] | None = None
        again = True
        try:
            with rpc_errors:
                reply = self._connection.home.stub.Locate(self._locate_request(key), timeout=LOCATE_TIMEOUT)
            owner, again, partitioning = owner_of(reply), False, partitioning_of(reply)
        except (UnavailableError, DeadlineExceededError):
            pass
        except OutrigError:
            again = False
        finally:
            self._connection.located(key or self._name, owner, again=again, partitioning=partitioning)


class Lease(BaseLease):
    """A lease granted by a `Space`: on an entry, or on a notify registration.

    Attributes ``id``, ``expires_at`` (epoch seconds, None if forever) and ``duration``
    (granted seconds, None if forever) are read-only and change when the lease is renewed.
    """

    __slots__ = ("_space",)

    def __init__(self, space: Space, message: pb.Lease) -> None:
        super().__init__(space._name, message)  # the attribute, not the property: a call fewer
        self._space = space

    def renew(self, duration: LeaseArg) -> Lease:
        """Extend the lease to ``duration`` seconds from now (or `FOREVER`/`ANY`); return self.

        Raises `NotFoundError` if the lease is unknown or has expired.
        """
        (result,) = self._space.renew_many([self], duration)
        if result.error is not None:
            raise result.error
        return self

    def cancel(self) -> None:
        """End the lease now. Raises `NotFoundError` if it is unknown or has expired."""
        (result,) = self._space.cancel_many([self])
        if result.error is not None:
            raise result.error


class Notification(ResumableStream[Event]):
    """A notify registration: a context manager, and an iterator of `Event` objects.

    Entering it starts the registration and waits for the server to grant its `lease`. Iteration
    ends when the registration's lease ends (expired or cancelled) or after `close`. Events that
    a too-slow consumer missed show as a gap in `Event.sequence`.

    Registering is retried on `UnavailableError` like any call. When the stream fails with
    `UnavailableError` later, the iteration reattaches to the registration (retrying as the
    space's ``retry_deadline`` allows) and goes on. A server that kept the registration across a
    restart numbers its later events from 2^31 higher, a gap that says events may have been
    missed meanwhile. If the registration is gone, `NotFoundError` is raised.
    """

    _what = "notification"

    def __init__(self, space: Space, request: pb.NotifyRequest) -> None:
        super().__init__(space)
        self._request = request
        self._lease: Lease | None = None

    @property
    def lease(self) -> Lease:
        """The registration's lease (available once the notification is entered)."""
        if self._lease is None:
            raise RuntimeError("the notification has not started: use it in a with block first")
        return self._lease

    def _method(self, stub: Any) -> Any:
        return stub.Notify

    def _first_request(self) -> pb.NotifyRequest:
        return self._request

    def _started(self, first: pb.NotifyReply | None) -> None:
        self._lease = Lease(self._space, registration_of(first))

    def _resume_request(self) -> pb.NotifyRequest:
        """Attach a new stream to the registration (NotFoundError if it has ended meanwhile)."""
        return self._space._resume_request(self.lease)

    def _resumed(self, first: pb.NotifyReply | None) -> None:
        self.lease._update(registration_of(first))

    def _item(self, reply: pb.NotifyReply) -> Event:
        return event_of(reply)


class Transaction:
    """An open transaction of one space (see `Space.transaction`).

    ``write``, ``write_many``, ``read``, ``read_nowait``, ``read_if_exists``, ``take``,
    ``take_nowait``, ``take_if_exists``, ``read_many``, ``take_many``, ``contents``, ``count`` and
    ``notify`` behave as the space's own, under the transaction. An operation blocked by another
    transaction's lock waits, up to its timeout, for that transaction to end; ``read_if_exists``
    and ``take_if_exists`` wait only for such locks, and ``*_nowait`` not at all. A notify
    registration made here also hears of this transaction's own writes, and ends with it.
    """

    def __init__(self, space: Space, lease: Lease) -> None:
        self._space = space
        self._under = space._under(lease.id)
        self.lease = lease
        self._ended = False

    @property
    def id(self) -> int:
        """The transaction's id (a lease id of its space)."""
        return self.lease.id

    def __enter__(self) -> Transaction:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._ended:
            return
        if kind is None:
            self.commit()
            return
        # The block's own error matters more; if the abort fails, the lease ends the transaction.
        with contextlib.suppress(OutrigError):
            self.abort()

    def __repr__(self) -> str:
        return f"Transaction(id={self.id}, space={self._space.name!r}, ended={self._ended})"

    def commit(self) -> None:
        """Make the writes visible and the takes final, all together (durably, on a durable server).
        `FailedPreconditionError` if the transaction had aborted (its lease ran out, say)."""
        self._space._call(self._space._ops["Commit"], self._space._end_request(self.id))
        self._ended = True

    def abort(self) -> None:
        """Discard the writes and put back what was taken."""
        self._space._call(self._space._ops["Abort"], self._space._end_request(self.id))
        self._ended = True

    def renew(self, lease: LeaseArg = 30.0) -> Lease:
        """Extend the transaction's lease to ``lease`` seconds from now."""
        return self.lease.renew(lease)

    def write(self, entry: AnyEntry, lease: LeaseArg = ANY) -> Lease:
        return self._under.write(entry, lease)

    def write_many(self, entries: Iterable[AnyEntry], lease: LeaseArg = ANY) -> list[Lease]:
        return self._under.write_many(entries, lease)

    def read(
        self, templates: Templates, timeout: float | None = None, *, order_by: OrderBy = None
    ) -> AnyEntry | None:
        return self._under.read(templates, timeout, order_by=order_by)

    def read_nowait(self, templates: Templates, *, order_by: OrderBy = None) -> AnyEntry | None:
        return self._under.read_nowait(templates, order_by=order_by)

    def read_if_exists(
        self, templates: Templates, *, lock_timeout: float | None, order_by: OrderBy = None
    ) -> AnyEntry | None:
        return self._under.read_if_exists(templates, lock_timeout=lock_timeout, order_by=order_by)

    def take(
        self, templates: Templates, timeout: float | None = None, *, order_by: OrderBy = None
    ) -> AnyEntry | None:
        return self._under.take(templates, timeout, order_by=order_by)

    def take_nowait(self, templates: Templates, *, order_by: OrderBy = None) -> AnyEntry | None:
        return self._under.take_nowait(templates, order_by=order_by)

    def take_if_exists(
        self, templates: Templates, *, lock_timeout: float | None, order_by: OrderBy = None
    ) -> AnyEntry | None:
        return self._under.take_if_exists(templates, lock_timeout=lock_timeout, order_by=order_by)

    def read_many(
        self,
        templates: Templates,
        *,
        max_entries: int,
        timeout: float | None = None,
        order_by: OrderBy = None,
    ) -> list[AnyEntry]:
        return self._under.read_many(templates, max_entries=max_entries, timeout=timeout, order_by=order_by)

    def take_many(
        self,
        templates: Templates,
        *,
        max_entries: int,
        timeout: float | None = None,
        order_by: OrderBy = None,
    ) -> list[AnyEntry]:
        return self._under.take_many(templates, max_entries=max_entries, timeout=timeout, order_by=order_by)

    def contents(
        self, templates: Templates, *, max_entries: int = 0, order_by: OrderBy = None
    ) -> Generator[AnyEntry, None, None]:
        """The matching entries this transaction may read, which it then holds read-locked."""
        return self._under.contents(templates, max_entries=max_entries, order_by=order_by)

    def count(self, templates: Templates) -> int:
        return self._under.count(templates)

    def notify(self, templates: Templates, lease: LeaseArg = ANY) -> Notification:
        return self._under.notify(templates, lease)
