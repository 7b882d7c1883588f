"""Calls of a partitioned space that go to several partitions (transport/routing.py decides
which): one call per partition, each renamed and served here or at its owner (the servicer's
`served`), merged (docs/scaling.md has the guarantees).

- read, read_many, count: every partition at once; a blocking read that finds nothing anywhere
  waits on every partition and answers with the first that has a match;
- take, take_many: partitions in turn (each call starting at the next, so none is favoured); with
  an order, the partitions' best matches are read first and taken from where they are; a
  blocking take that finds nothing waits with a blocking *read* on every partition (which takes
  nothing) and, when one finds a match, takes from that partition: no entry is ever taken by two
  partitions' waiters, and a caller that goes away has taken nothing. A take with a request id
  first asks every partition for what that id took before (a retry), with an id made per
  partition, which a partition records only when it takes something;
- write_many across partitions: one write per partition (atomic in each), with the request id
  made per partition ("id~k"), so that a retry finishes what a failure left;
- contents: partitions in turn (with an order: merged by it); notify: one registration per
  partition, merged into one stream (see `Fan.notify`); renew and cancel by the partitions of the
  ids; describe, browse and purge over every partition;
- changes: one feed per partition, merged into one stream whose every cursor holds each
  partition's position (see `Fan.changes`); a durable subscription's ack and delete go to every
  partition, each with its own position.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, NamedTuple

import grpc

from outrig._protocol import error_info, tag, varint
from outrig._routing import value_partition
from outrig.service.config import ServerConfig
from outrig.service.engine.model import StoredEntry
from outrig.service.engine.ordered import in_request_order
from outrig.service.engine.partitions import ID_STRIDE, partition_name, partition_of_id, split_name
from outrig.service.exceptions import CompactedError, DeliveryExpiredError, SubscriptionNotFoundError
from outrig.service.protocol import changes, codec, wire
from outrig.service.protocol.deliveries import DELIVERIES_FIELD, delivery_field, settle_receipts
from outrig.service.transport import handlers
from outrig.service.transport.routing import FanOut, copy_for
from outrig.v1 import space_pb2 as pb

#: One partition's call: (method, request naming the partition, the caller's context) -> reply.
Call = Callable[[str, Any, handlers.Context], Awaitable[Any]]
#: One partition's streaming call (Contents, Notify), likewise: its replies.
Stream = Callable[[str, Any, handlers.Context], AsyncIterator[Any]]

#: Seconds a fan-out notify's follower registrations are leased for (renewed every third of it,
#: or of what the space grants, while their stream lasts).
FOLLOWER_LEASE = 60.0
#: Replies a partition's change feed may have read ahead of the merged stream (then it waits).
CHANGES_AHEAD = 64
#: The tag of WriteManyRequest.entries, to frame an entry's encoding into a partition's request.
_ENTRIES = tag(pb.WriteManyRequest.DESCRIPTOR.fields_by_name["entries"])


def _own(request: Any, k: int) -> str:
    """A request id made for partition k: one server's request log holds ids of every space. A
    long one is shortened to a digest so that the suffix keeps it within MAX_REQUEST_ID."""
    request_id: str = request.request_id
    if len(request_id) > codec.MAX_REQUEST_ID - 5:
        request_id = hashlib.blake2b(request_id.encode(), digest_size=32).hexdigest()
    return f"{request_id}~{k}"


def _payloads(reply: bytes, delivered: dict[int, bytes] | None = None) -> list[bytes]:
    """The entries (their payloads, framed) of an encoded MatchReply or ContentsReply. A take
    with ack's reply has a Delivery per entry too: given `delivered`, each is filed there under
    its entry's payload (by identity), framed as a MatchReply's `deliveries` field."""
    parts = wire.fields(memoryview(reply))
    payloads = [wire.frame(value) for number, value in parts if number == 1 and isinstance(value, memoryview)]
    if delivered is not None:
        extras = [
            bytes(value)
            for number, value in parts
            if number == DELIVERIES_FIELD and isinstance(value, memoryview)
        ]
        for payload, delivery in zip(payloads, extras, strict=True):
            delivered[id(payload)] = delivery_field(delivery)
    return payloads


#: A partitioned space's figures that are its partitions' added up.
_SUMMED = (
    "entries",
    "bytes",
    "waiters",
    "registrations",
    "transactions",
    "locked",
    "expired",
    "in_flight",
    "delayed",
    "redelivered",
    "dead_lettered",
)


def _reply(payloads: Sequence[bytes], delivered: dict[int, bytes] | None) -> bytes:
    """A MatchReply of these payloads (and, for a take with ack, their deliveries, in order)."""
    if delivered is None:
        return wire.entries_reply(payloads)
    return b"".join((*payloads, *(delivered[id(payload)] for payload in payloads)))


def _ordered(payloads: Sequence[bytes], order: Sequence[pb.OrderKey]) -> list[bytes]:
    """Payloads from several partitions in the request's order (ties: as given)."""
    if not order:
        return list(payloads)
    entries = []
    for position, payload in enumerate(payloads):
        stored = StoredEntry(position + 1, codec.stored_entry(bytes(wire.unframed(payload))), None)
        stored.arrival = position + 1  # ties: as given
        entries.append(stored)
    keys = tuple((key.field, key.descending) for key in order)
    return [payloads[stored.id - 1] for stored in in_request_order(entries, keys, True)]


class _Ask(NamedTuple):
    """A fan-out read or take: its method, its request, its partitions, how many it wants."""

    name: str
    request: pb.MatchRequest
    fan: FanOut
    wanted: int
    delivered: dict[int, bytes] | None  # a take with ack: its deliveries, by payload (`_payloads`)


class Fan:
    """Runs `FanOut` calls: each partition's call through `call` (or `stream`), merged."""

    def __init__(self, config: ServerConfig, call: Call, stream: Stream) -> None:
        self._config = config
        self._limits = config.limits
        self._call = call
        self._stream = stream
        self._turn = itertools.count()

    def _names(self, fan: FanOut) -> list[str]:
        return [partition_name(fan.space, k) for k in fan.partitions]

    def _rotated(self, fan: FanOut) -> list[int]:
        ks = list(fan.partitions)
        start = next(self._turn) % len(ks)
        return ks[start:] + ks[:start]

    async def _each(self, name: str, requests: Sequence[Any], context: handlers.Context) -> list[Any]:
        """Every request's call at once; the first failure fails them all."""
        tasks = [asyncio.ensure_future(self._call(name, request, context)) for request in requests]
        try:
            return list(await asyncio.gather(*tasks))
        finally:
            for task in tasks:
                task.cancel()

    # ------------------------------------------------------------------ writes

    async def write_many(
        self, received: handlers.Received[pb.WriteManyRequest], fan: FanOut, context: handlers.Context
    ) -> pb.WriteManyReply:
        request = received.message
        encodings = received.entries
        field, count = fan.partitioning.field, fan.partitioning.count
        groups: dict[int, list[int]] = {}
        for i, entry in enumerate(request.entries):  # each routable: the router checked them
            k = value_partition(entry.fields[field], count)
            assert k is not None
            groups.setdefault(k, []).append(i)
        calls = []
        for k, positions in sorted(groups.items()):
            part = pb.WriteManyRequest(space=partition_name(fan.space, k), transaction=request.transaction)
            if request.HasField("lease"):
                part.lease.CopyFrom(request.lease)
            if request.request_id:
                part.request_id = _own(request, k)
            raw = part.SerializeToString() + b"".join(
                _ENTRIES + varint(len(encodings[i])) + bytes(encodings[i]) for i in positions
            )
            calls.append((positions, handlers.Received(pb.WriteManyRequest.FromString(raw), raw)))
        replies = await self._each("WriteMany", [sub for _, sub in calls], context)
        leases: list[pb.Lease] = [pb.Lease()] * len(request.entries)
        for (positions, _), reply in zip(calls, replies, strict=True):
            for position, lease in zip(positions, reply.leases, strict=True):
                leases[position] = lease
        return pb.WriteManyReply(leases=leases)

    # ------------------------------------------------------------------ reads and takes

    async def match(
        self, name: str, request: pb.MatchRequest, fan: FanOut, context: handlers.Context
    ) -> bytes:
        take = name in ("Take", "TakeMany")
        many = name in ("ReadMany", "TakeMany")
        wanted = codec.max_entries(request, self._limits) if many else 1
        # A take with ack: the partitions' replies carry deliveries, and the reads this runs
        # (to rank or to wait) are plain reads. Its retry needs no replay pass: a partition
        # answers its own request id with its deliveries still pending, and an entry delivered
        # beyond what the caller wants is not lost: it is visible again at its deadline.
        delivered: dict[int, bytes] | None = {} if request.HasField("ack") else None
        if request.settle:  # the checks the servicer makes of one partition's take
            settle_receipts(request, self._limits, request.ack if take and delivered is not None else None)
        if take and request.settle:
            await self._settle(request, fan, context)
            request = copy_for(request, request.space)
            del request.settle[:]
        ask = _Ask(name, request, fan, wanted, delivered)
        timeout = codec.timeout(request, self._limits)
        immediate = request.if_exists or timeout == 0
        if take and request.request_id and delivered is None:
            earlier = await self._each(
                name,
                [
                    copy_for(
                        request, partition_name(fan.space, k), replay_only=True, request_id=_own(request, k)
                    )
                    for k in fan.partitions
                ],
                context,
            )
            found = [payload for reply in earlier for payload in _payloads(reply)]
            if found:
                return wire.entries_reply(_ordered(found, request.order_by))
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        first: int | None = None
        while True:
            ks = self._rotated(fan)
            if first is not None:
                ks.remove(first)
                ks.insert(0, first)
            remaining = None if deadline is None else max(0.0, deadline - loop.time())
            if take:
                found = await self._take_pass(ask, ks, first, remaining, context)
            else:
                found = await self._read_pass(ask, ks, context)
            if found or immediate or remaining == 0.0:
                return _reply(found, delivered)
            woken = await self._wait(request, fan, ks, wanted if not take else 1, remaining, context)
            if woken is None:
                return _reply([], delivered)
            first, payloads = woken
            if not take:
                return wire.entries_reply(payloads[:wanted])

    async def _settle(self, request: pb.MatchRequest, fan: FanOut, context: handlers.Context) -> None:
        """A take's `settle` of receipts of several partitions: before it takes, one batch Ack
        per partition (with a request id made from the take's). Not atomic across partitions: a
        receipt no longer pending fails the take with its DELIVERY_EXPIRED, and the receipts of
        the other partitions stay acknowledged."""
        count = fan.partitioning.count
        groups: dict[int, list[int]] = {}
        for receipt in request.settle:
            k = partition_of_id(receipt)
            if k >= count:
                raise DeliveryExpiredError(f"settle: receipt {receipt} is no delivery of {fan.space!r}")
            groups.setdefault(k, []).append(receipt)
        acks = [
            pb.AckRequest(
                space=partition_name(fan.space, k),
                receipts=receipts,
                request_id=f"{_own(request, k)}s" if request.request_id else "",
            )
            for k, receipts in sorted(groups.items())
        ]
        for reply in await self._each("Ack", acks, context):
            for result in reply.results:
                if result.error_code:
                    raise DeliveryExpiredError(result.error_message)

    async def _read_pass(self, ask: _Ask, ks: list[int], context: handlers.Context) -> list[bytes]:
        name, request, fan, wanted, _ = ask
        replies = await self._each(
            name,
            [copy_for(request, partition_name(fan.space, k), timeout=0.0, if_exists=True) for k in ks],
            context,
        )
        found = [payload for reply in replies for payload in _payloads(reply)]
        return _ordered(found, request.order_by)[:wanted]

    async def _take_pass(
        self, ask: _Ask, ks: list[int], woken: int | None, remaining: float | None, context: handlers.Context
    ) -> list[bytes]:
        """Take up to `wanted` now: partition by partition, or by the order, from where the best
        matches are. The partition `woken` found a match: a take there may wait (up to
        `remaining`) while that match is locked by a transaction, as a take_nowait does."""
        name, request, fan, wanted, delivered = ask

        def sub(k: int, count: int) -> pb.MatchRequest:
            waits = k == woken and remaining is not None
            changes: dict[str, Any] = {"if_exists": True, "timeout": remaining if waits else 0.0}
            if request.request_id:
                changes["request_id"] = _own(request, k)
            if name == "TakeMany":
                changes["max_entries"] = count
            made: pb.MatchRequest = copy_for(request, partition_name(fan.space, k), **changes)
            return made

        if request.order_by:
            looked = await self._each(
                "ReadMany",
                [
                    copy_for(
                        request,
                        partition_name(fan.space, k),
                        timeout=0.0,
                        if_exists=True,
                        max_entries=wanted,
                        request_id="",
                        ack=None,
                        max_deliveries=0,
                    )
                    for k in ks
                ],
                context,
            )
            ranked = [
                (k, payload) for k, reply in zip(ks, looked, strict=True) for payload in _payloads(reply)
            ]
            best = _ordered([payload for _, payload in ranked], request.order_by)[:wanted]
            chosen = {id(payload) for payload in best}
            counts: dict[int, int] = {}
            for k, payload in ranked:
                if id(payload) in chosen:
                    counts[k] = counts.get(k, 0) + 1
            # No more than `wanted` in all: an entry taken beyond them would be lost to the caller.
            order = [k for k in ks if k in counts]
            tasks = [
                asyncio.ensure_future(
                    self._call("TakeMany" if name == "TakeMany" else "Take", sub(k, counts[k]), context)
                )
                for k in order
            ]
            outcomes = await asyncio.gather(*tasks, return_exceptions=True)
            found = [
                payload
                for reply in outcomes
                if isinstance(reply, bytes)
                for payload in _payloads(reply, delivered)
            ]
            failed = [err for err in outcomes if isinstance(err, BaseException)]
            if failed and not found:
                raise failed[0]
            # What was taken is answered even if another partition failed: a take is not undone.
            return _ordered(found, request.order_by)
        found = []
        for k in ks:
            try:
                reply = await self._call(name, sub(k, wanted - len(found)), context)
            except Exception:
                if found:  # answer what was taken rather than lose it to the error
                    return found
                raise
            found.extend(_payloads(reply, delivered))
            if len(found) >= wanted:
                break
        return found

    async def _wait(
        self,
        request: pb.MatchRequest,
        fan: FanOut,
        ks: list[int],
        wanted: int,
        remaining: float | None,
        context: handlers.Context,
    ) -> tuple[int, list[bytes]] | None:
        """Wait with a blocking read on every partition at once: the first partition to find a
        match and what it found; None when the time ran out everywhere. Takes nothing."""
        changes: dict[str, Any] = {
            "if_exists": False,
            "request_id": "",
            "timeout": remaining,
            "max_entries": wanted,
            "ack": None,
            "max_deliveries": 0,
        }
        tasks = {
            asyncio.ensure_future(
                self._call("ReadMany", copy_for(request, partition_name(fan.space, k), **changes), context)
            ): k
            for k in ks
        }
        try:
            pending = set(tasks)
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    payloads = _payloads(task.result())
                    if payloads:
                        return tasks[task], payloads
            return None
        finally:
            for task in tasks:
                task.cancel()

    async def count(self, request: pb.CountRequest, fan: FanOut, context: handlers.Context) -> pb.CountReply:
        replies = await self._each("Count", [copy_for(request, n) for n in self._names(fan)], context)
        return pb.CountReply(count=sum(reply.count for reply in replies))

    # ------------------------------------------------------------------ streams

    async def contents(
        self, request: pb.ContentsRequest, fan: FanOut, context: handlers.Context
    ) -> AsyncIterator[bytes]:
        limit = request.max_entries
        chunk = self._limits.contents_chunk
        if request.order_by:
            found: list[bytes] = []
            for n in self._names(fan):
                async for reply in self._stream("Contents", copy_for(request, n), context):
                    found.extend(_payloads(reply))
            ordered = _ordered(found, request.order_by)
            if limit:
                ordered = ordered[:limit]
            for start in range(0, len(ordered), chunk):
                yield wire.entries_reply(ordered[start : start + chunk])
            return
        sent = 0
        for n in self._names(fan):
            left = limit - sent if limit else 0
            async for reply in self._stream("Contents", copy_for(request, n, max_entries=left), context):
                payloads = _payloads(reply)
                if limit:
                    payloads = payloads[: limit - sent]
                sent += len(payloads)
                if payloads:
                    yield wire.entries_reply(payloads)
                if limit and sent >= limit:
                    return

    async def notify(
        self, request: pb.NotifyRequest, fan: FanOut, context: handlers.Context
    ) -> AsyncIterator[bytes]:
        """One registration per partition, merged into one stream. The first partition's is the
        registration the caller holds (its lease, renewed and cancelled by its id); the others
        (followers) are registered for FOLLOWER_LEASE seconds and renewed by this stream while it
        lasts, so that they end soon after it (a follower left behind by a server's stop expires on
        its own); the merged stream ends when any of them does, the first's lease included.
        Sequence numbers are the merged stream's own, and a gap in a partition's (events it
        dropped) is a gap in them."""
        names = self._names(fan)
        lead = copy_for(request, names[0])
        follow = copy_for(request, names[0])
        follow.lease.seconds = FOLLOWER_LEASE
        streams = [self._stream("Notify", lead, context)] + [
            self._stream("Notify", copy_for(follow, n), context) for n in names[1:]
        ]
        queue: asyncio.Queue[tuple[int, bytes | BaseException | None]] = asyncio.Queue()
        followers: dict[int, pb.Lease] = {}

        async def renew() -> None:
            try:
                await renewing()
            except asyncio.CancelledError:
                raise
            except Exception as err:  # the merged stream ends with it
                await queue.put((0, err))

        async def renewing() -> None:
            while True:
                granted = [
                    lease.granted_seconds for lease in followers.values() if lease.HasField("granted_seconds")
                ]
                await asyncio.sleep(min([FOLLOWER_LEASE, *granted]) / 3)
                for i, lease in list(followers.items()):
                    renewal = pb.LeaseRenewal(id=lease.id)
                    renewal.duration.seconds = FOLLOWER_LEASE
                    reply = await self._call(
                        "RenewLeases", pb.RenewLeasesRequest(space=names[i], renewals=[renewal]), context
                    )
                    if reply.results and reply.results[0].HasField("lease"):
                        followers[i] = reply.results[0].lease

        pumps = [asyncio.ensure_future(_pump(queue, i, stream)) for i, stream in enumerate(streams)]
        pumps.append(asyncio.ensure_future(renew()))
        try:
            last: list[int | None] = [None] * len(streams)
            sequence = 0
            early: list[bytes] = []  # events that came before the lead's registration was sent
            lead_sent = False
            while True:
                i, item = await queue.get()
                if isinstance(item, BaseException):
                    raise item
                if item is None:
                    return  # one partition's registration ended: so does the merged one
                event = wire.event_of(item)
                if event is None:  # a partition's registration: the lead's is the caller's
                    if i > 0:
                        followers[i] = pb.NotifyReply.FromString(item).registration
                    else:
                        lead_sent = True
                        yield item
                        for waiting in early:
                            yield waiting
                        early.clear()
                    continue
                number, entry = event
                before = last[i]
                sequence += 1 if before is None else max(1, number - before)
                last[i] = number
                encoded = wire.event_encoded(sequence, entry)
                if lead_sent:
                    yield encoded
                else:
                    early.append(encoded)
        finally:
            for task in pumps:
                task.cancel()
            await asyncio.gather(*pumps, return_exceptions=True)

    # ------------------------------------------------------------------ changes

    async def changes(
        self, request: pb.ChangesRequest, fan: FanOut, context: handlers.Context
    ) -> AsyncIterator[bytes]:
        """One feed per partition, merged into one stream: a first message with every
        partition's start and oldest positions, then each partition's changes as they come (in
        each partition's order; partitions interleave as they happen), each with the cursor of
        every partition's position after it. A partition compacted for `since` fails the whole
        with the oldest cursor: those partitions' oldest, the others' `since` (each still valid).
        The stream ends when any partition's does. A partition's feed reads at most
        CHANGES_AHEAD replies ahead of the caller, then waits: no queue grows per event."""
        names = self._names(fan)
        since = changes.since(request, names)
        subs = []
        for k, n in enumerate(names):
            sub = copy_for(request, n)
            if since is not None:
                sub.since = changes.encode_cursor((n,), (since[k],))
            subs.append(sub)
        streams = [self._stream("Changes", sub, context) for sub in subs]
        firsts = await asyncio.gather(*(anext(stream) for stream in streams), return_exceptions=True)
        try:
            compacted = {
                k: found
                for k, outcome in enumerate(firsts)
                if (found := _compacted_at(outcome, names[k])) is not None
            }
            for outcome in firsts:
                if isinstance(outcome, BaseException) and not compacted:
                    raise outcome
            if compacted:
                assert since is not None  # a stream from the head is never compacted
                positions = [compacted.get(k, since[k]) for k in range(len(names))]
                k = min(compacted)
                failed = firsts[k]
                said = failed.details() if isinstance(failed, grpc.aio.AioRpcError) else str(failed)
                epoch, oldest = compacted[k]
                raise changes.CompactedCursorError(
                    CompactedError(f"partition {k} of {fan.space!r}: {said}", epoch=epoch, oldest=oldest),
                    changes.encode_cursor(names, positions),
                )
            starts, oldests = [], []
            for k, first in enumerate(firsts):
                assert isinstance(first, bytes)
                reply = pb.ChangesReply.FromString(first)
                (start,) = changes.decode_cursor(reply.cursor, (names[k],), "cursor")
                (oldest_k,) = changes.decode_cursor(reply.oldest, (names[k],), "oldest")
                starts.append(start)
                oldests.append(oldest_k)
        except BaseException:
            for stream in streams:
                with contextlib.suppress(Exception):
                    await stream.aclose()  # type: ignore[attr-defined]
            raise
        yield changes.start_reply(changes.encode_cursor(names, starts), changes.encode_cursor(names, oldests))
        queue: asyncio.Queue[tuple[int, bytes | BaseException | None]] = asyncio.Queue(CHANGES_AHEAD)

        pumps = [asyncio.ensure_future(_pump(queue, k, stream)) for k, stream in enumerate(streams)]
        try:
            positions = starts
            while True:
                k, item = await queue.get()
                if isinstance(item, BaseException):
                    raise item
                if item is None:
                    return  # one partition's feed ended: so does the merged stream
                cursor, _ = changes.reply_parts(item)
                (positions[k],) = changes.decode_cursor(cursor, (names[k],), "cursor")
                yield changes.with_cursor(item, changes.encode_cursor(names, positions))
        finally:
            for task in pumps:
                task.cancel()
            await asyncio.gather(*pumps, return_exceptions=True)

    async def ack_changes(
        self, request: pb.AckChangesRequest, fan: FanOut, context: handlers.Context
    ) -> pb.AckChangesReply:
        """Each partition's subscription acknowledged up to its own position in the cursor."""
        names = self._names(fan)
        positions = changes.decode_cursor(request.cursor, names, "cursor")
        subs = [
            copy_for(request, n, cursor=changes.encode_cursor((n,), (position,)))
            for n, position in zip(names, positions, strict=True)
        ]
        await self._each("AckChanges", subs, context)
        return pb.AckChangesReply()

    async def delete_subscription(
        self, request: pb.DeleteSubscriptionRequest, fan: FanOut, context: handlers.Context
    ) -> pb.DeleteSubscriptionReply:
        """Deleted in every partition that has it; SubscriptionNotFoundError if none has."""
        tasks = [
            asyncio.ensure_future(self._call("DeleteSubscription", copy_for(request, n), context))
            for n in self._names(fan)
        ]
        outcomes = await asyncio.gather(*tasks, return_exceptions=True)
        missing = [o for o in outcomes if _not_found(o)]
        for outcome in outcomes:
            if isinstance(outcome, BaseException) and not _not_found(outcome):
                raise outcome
        if len(missing) == len(outcomes):
            raise SubscriptionNotFoundError(
                f"durable: space {fan.space!r} has no durable subscription {request.durable!r}"
            )
        return pb.DeleteSubscriptionReply()

    # ------------------------------------------------------------------ leases

    async def leases(self, name: str, request: Any, fan: FanOut, context: handlers.Context) -> Any:
        """RenewLeases or CancelLeases of leases of several partitions: one call per partition,
        with its share of the renewals or ids, the results back in the order asked."""
        field = "renewals" if name == "RenewLeases" else "ids"
        items = list(getattr(request, field))
        groups = self._by_partition([item.id if field == "renewals" else item for item in items])
        subs = []
        for k, at in groups:
            sub = type(request)(space=partition_name(fan.space, k))
            getattr(sub, field).extend(items[i] for i in at)
            subs.append(sub)
        reply = pb.RenewLeasesReply() if field == "renewals" else pb.CancelLeasesReply()
        reply.results.extend(await self._results(name, subs, groups, len(items), context))
        return reply

    async def acks(self, request: pb.AckRequest, fan: FanOut, context: handlers.Context) -> pb.AckReply:
        """A batch Ack of receipts of several partitions: one batch per partition (its request
        id made per partition), the results back in the order asked."""
        receipts = list(request.receipts)
        groups = self._by_partition(receipts)
        subs = [
            pb.AckRequest(
                space=partition_name(fan.space, k),
                receipts=[receipts[i] for i in at],
                request_id=_own(request, k) if request.request_id else "",
            )
            for k, at in groups
        ]
        replies = await self._each("Ack", subs, context)
        results: list[pb.AckResult] = [pb.AckResult()] * len(receipts)
        for (_, positions), reply in zip(groups, replies, strict=True):
            for position, result in zip(positions, reply.results, strict=True):
                results[position] = result
        return pb.AckReply(results=results)

    @staticmethod
    def _by_partition(ids: Sequence[int]) -> list[tuple[int, list[int]]]:
        groups: dict[int, list[int]] = {}
        for i, lease_id in enumerate(ids):
            groups.setdefault(partition_of_id(lease_id), []).append(i)
        return sorted(groups.items())

    async def _results(
        self,
        name: str,
        subs: Sequence[Any],
        groups: Sequence[tuple[int, list[int]]],
        total: int,
        context: handlers.Context,
    ) -> list[pb.LeaseResult]:
        replies = await self._each(name, subs, context)
        results: list[pb.LeaseResult] = [pb.LeaseResult()] * total
        for (_, positions), reply in zip(groups, replies, strict=True):
            for position, result in zip(positions, reply.results, strict=True):
                results[position] = result
        return results

    # ------------------------------------------------------------------ inspection (admin)

    async def describe(
        self, request: pb.DescribeSpaceRequest, fan: FanOut, context: handlers.Context
    ) -> pb.DescribeSpaceReply:
        """Every partition's description, added up (types by name; lists cut as one space's are)."""
        replies = await self._each("DescribeSpace", [copy_for(request, n) for n in self._names(fan)], context)
        merged = pb.DescribeSpaceReply(space=fan.space, configuration=replies[0].configuration)
        merged.configuration.dead_letter = split_name(merged.configuration.dead_letter)[0]
        types: dict[str, pb.TypeFigures] = {}
        for reply in replies:
            for name in _SUMMED:
                setattr(merged, name, getattr(merged, name) + getattr(reply, name))
            if reply.HasField("oldest_entry_age"):
                merged.oldest_entry_age = max(merged.oldest_entry_age, reply.oldest_entry_age)
            for figures in reply.types:
                into = types.get(figures.type_name)
                if into is None:
                    types[figures.type_name] = into = pb.TypeFigures(
                        type_name=figures.type_name, supertypes=figures.supertypes
                    )
                into.entries += figures.entries
                into.bytes += figures.bytes
                into.with_subtypes += figures.with_subtypes
                buckets = {index.field: index for index in into.indexes}
                for index in figures.indexes:
                    if index.field in buckets:
                        buckets[index.field].buckets += index.buckets
                    else:
                        into.indexes.add(field=index.field, buckets=index.buckets)
        merged.types.extend(sorted(types.values(), key=lambda figures: figures.type_name))
        merged.waiting.extend(sorted((g for r in replies for g in r.waiting), key=lambda g: -g.count)[:1000])
        merged.registration_list.extend(
            sorted((info for r in replies for info in r.registration_list), key=lambda info: info.id)[:1000]
        )
        merged.transaction_list.extend(
            sorted((info for r in replies for info in r.transaction_list), key=lambda info: info.id)[:1000]
        )
        if all(reply.HasField("change_log") for reply in replies):
            merged.change_log.CopyFrom(
                changes.merged_figures(self._names(fan), [reply.change_log for reply in replies])
            )
        return merged

    async def browse(
        self, request: pb.BrowseRequest, fan: FanOut, context: handlers.Context
    ) -> pb.BrowseReply:
        """A page from one partition at a time, in partition order: a cursor below ID_STRIDE
        names the start of a partition (0: the first), any other is an entry's arrival in the
        partition its residue names (engine/partitions.py)."""
        after = request.after
        k, within = (after, 0) if after < ID_STRIDE else (partition_of_id(after), after)
        while k < fan.partitioning.count:
            reply: pb.BrowseReply = await self._call(
                "Browse", copy_for(request, partition_name(fan.space, k), after=within), context
            )
            if reply.next or reply.entries:
                if not reply.next and k + 1 < fan.partitioning.count:
                    reply.next = k + 1
                return reply
            k, within = k + 1, 0
        return pb.BrowseReply()

    async def purge(self, request: pb.PurgeRequest, fan: FanOut, context: handlers.Context) -> pb.PurgeReply:
        removed = 0
        for n in self._names(fan):  # in turn: a purge is bounded by max_entries over them all
            left = request.max_entries - removed if request.max_entries else 0
            reply: pb.PurgeReply = await self._call("Purge", copy_for(request, n, max_entries=left), context)
            removed += reply.count
            if request.max_entries and removed >= request.max_entries:
                break
        return pb.PurgeReply(count=removed)


async def _pump(
    queue: asyncio.Queue[tuple[int, bytes | BaseException | None]], k: int, stream: AsyncIterator[bytes]
) -> None:
    """Move partition k's replies into a merged stream's queue: each reply, then None at its end,
    or the error it ended with (a full queue holds the partition back)."""
    try:
        async for reply in stream:
            await queue.put((k, reply))
        await queue.put((k, None))
    except asyncio.CancelledError:
        raise
    except BaseException as err:
        await queue.put((k, err))


def _compacted_at(outcome: object, name: str) -> changes.Position | None:
    """The oldest position of the partition `name` a failed first read says (CompactedError,
    here or forwarded from its owner with the ErrorInfo's "oldest"); None for any other outcome."""
    cursor = ""
    if isinstance(outcome, changes.CompactedCursorError):
        cursor = outcome.cursor
    elif isinstance(outcome, grpc.aio.AioRpcError) and outcome.code() == grpc.StatusCode.OUT_OF_RANGE:
        trailing = outcome.trailing_metadata()
        _, metadata = error_info(None if trailing is None else [(key, value) for key, value in trailing])
        cursor = (metadata or {}).get("oldest", "")
    if not cursor:
        return None
    ((epoch, seq),) = changes.decode_cursor(cursor, (name,), "oldest")
    return epoch, seq


def _not_found(outcome: object) -> bool:
    """Whether a partition's DeleteSubscription found no such subscription (here or forwarded)."""
    if isinstance(outcome, SubscriptionNotFoundError):
        return True
    return isinstance(outcome, grpc.aio.AioRpcError) and outcome.code() == grpc.StatusCode.NOT_FOUND
