"""The pure space engine: matching, indexes, waiters, leases, notify registrations, transactions.

Plain Python with no gRPC and no I/O. The gRPC servicer converts protobuf to these objects and
back; the embedded backend drives one `SpaceEngine` per named space from the asyncio loop.
"""

from outrig.service.engine.clock import Clock, FakeClock, SystemClock
from outrig.service.engine.leases import MAX_LEASE_SECONDS
from outrig.service.engine.model import (
    LeaseGrant,
    NewEntry,
    Registration,
    StoredEntry,
    Template,
    Transaction,
    TransactionOutcome,
    Waiter,
)
from outrig.service.engine.space import SpaceEngine, SpaceSettings
from outrig.service.engine.values import FieldValue

__all__ = [
    "MAX_LEASE_SECONDS",
    "Clock",
    "FakeClock",
    "FieldValue",
    "LeaseGrant",
    "NewEntry",
    "Registration",
    "SpaceEngine",
    "SpaceSettings",
    "StoredEntry",
    "SystemClock",
    "Template",
    "Transaction",
    "TransactionOutcome",
    "Waiter",
]
