"""The asyncio twin of `outrig.Delivery` and of `Space.taking`'s context manager; the state and
the requests are `outrig._delivery`'s."""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import TYPE_CHECKING

from outrig._codec import AnyEntry
from outrig._delivery import BaseDeliveries, BaseDelivery, Returned, settlement
from outrig._exceptions import DeliveryExpiredError, OutrigError
from outrig.v1 import space_pb2 as pb

if TYPE_CHECKING:
    from outrig.aio._space import AsyncSpace

__all__ = ["AsyncDeliveries", "AsyncDelivery", "AsyncTaking"]


class AsyncDelivery(BaseDelivery):
    """One delivery of an entry, from an `AsyncSpace` take with ``ack=``: the twin of
    `outrig.Delivery`, whose `ack`, `nack` and `extend` are coroutines."""

    __slots__ = ("_space",)

    def __init__(self, space: AsyncSpace, entry: AnyEntry, message: pb.Delivery) -> None:
        super().__init__(space.name, entry, message)
        self._space = space

    async def ack(self) -> None:
        """Acknowledge the delivery: its entry is removed for good (see `outrig.Delivery.ack`)."""
        space = self._space
        await space._call(space._ops["Ack"], self._ack_request(space.name, space._request_id()))
        self._settled = True

    async def nack(self, delay: float | None = None) -> Returned:
        """Return the entry, after ``delay`` seconds (None: the space's backoff); see
        `outrig.Delivery.nack`."""
        space = self._space
        reply: pb.NackReply = await space._call(
            space._ops["Nack"], self._nack_request(space.name, delay, space._request_id())
        )
        return self._returned(reply)

    async def extend(self, seconds: float) -> float:
        """Move the deadline to ``seconds`` from now; return it (see `outrig.Delivery.extend`)."""
        space = self._space
        reply: pb.ExtendReply = await space._call(
            space._ops["Extend"], self._extend_request(space.name, seconds, space._request_id())
        )
        return self._extended(reply)


class AsyncTaking:
    """``async with space.taking(template, ack=30.0, timeout=5.0) as delivery:`` (see
    `outrig.Space.taking`): acknowledged when the block ends normally, returned when it raises."""

    __slots__ = ("_delivery", "_take")

    def __init__(self, take: Callable[[], Awaitable[AsyncDelivery | None]]) -> None:
        self._take = take
        self._delivery: AsyncDelivery | None = None

    async def __aenter__(self) -> AsyncDelivery | None:
        self._delivery = await self._take()
        return self._delivery

    async def __aexit__(
        self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None
    ) -> None:
        delivery, settle = self._delivery, settlement(self._delivery, kind)
        if delivery is None or settle is None:
            return
        if settle == "ack":
            await delivery.ack()
        else:  # the block raised: its error goes on whether or not the nack gets through
            with contextlib.suppress(OutrigError):
                await delivery.nack()


class AsyncDeliveries(BaseDeliveries[AsyncDelivery]):
    """``async with space.deliveries(template, ack=30.0, timeout=5.0) as jobs:``
    ``async for delivery in jobs:`` (see `outrig.Space.deliveries`)."""

    __slots__ = ("_take",)

    def __init__(self, take: Callable[[AsyncDelivery | None], Awaitable[AsyncDelivery | None]]) -> None:
        super().__init__()
        self._take = take

    async def __aenter__(self) -> AsyncDeliveries:
        return self

    def __aiter__(self) -> AsyncDeliveries:
        return self

    async def __anext__(self) -> AsyncDelivery:
        if self._done:
            raise StopAsyncIteration
        previous = self._to_settle()
        try:
            delivery = await self._take(previous)
        except DeliveryExpiredError as err:
            self._passed(previous, err)
            delivery = await self._take(None)
        if not self._advanced(delivery):
            raise StopAsyncIteration
        assert delivery is not None
        return delivery

    async def __aexit__(
        self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None
    ) -> None:
        delivery, settle = self._ending(kind)
        if delivery is not None and settle == "ack":
            await delivery.ack()
        elif delivery is not None and settle == "nack":
            with contextlib.suppress(OutrigError):  # the body's error matters more
                await delivery.nack()
