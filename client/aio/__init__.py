"""The asyncio twin of the outrig client.

::

    async with outrig.aio.connect("127.0.0.1:7766", space="jobs") as space:
        lease = await space.write(Task(job="resize"), lease=60.0)
        task = await space.take(Task(job="resize"), timeout=5.0)

Entries, templates, leases durations (`outrig.FOREVER`, `outrig.ANY`), `outrig.Event`, `outrig.Change`,
`outrig.LeaseResult`, `outrig.Returned` and the errors are shared with the blocking client in `outrig`.
"""

from outrig.aio._changes import AsyncChangeStream
from outrig.aio._delivery import AsyncDeliveries, AsyncDelivery, AsyncTaking
from outrig.aio._space import AsyncLease, AsyncNotification, AsyncSpace, AsyncTransaction, connect

__all__ = [
    "AsyncChangeStream",
    "AsyncDeliveries",
    "AsyncDelivery",
    "AsyncLease",
    "AsyncNotification",
    "AsyncSpace",
    "AsyncTaking",
    "AsyncTransaction",
    "connect",
]
