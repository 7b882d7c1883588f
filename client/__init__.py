"""outrig: a JavaSpaces-style tuple space served over gRPC. This is its Python client.

::

    from dataclasses import dataclass
    import outrig

    @dataclass
    class Task(outrig.Entry):
        job: str | None = None
        n: int | None = None

    with outrig.connect("127.0.0.1:7766", space="default") as space:
        lease = space.write(Task(job="resize", n=1), lease=60.0)
        task = space.take(Task(job="resize"), timeout=5.0)  # None if nothing came in 5 s
        with space.taking(Task(job="resize"), ack=30.0, timeout=5.0) as delivery:
            ...  # acknowledged at the end of the block; returned to the space if it raises

The asyncio twin is `outrig.aio`. Every error a call raises is an `OutrigError`. A call that
fails because the server is unreachable or restarting is retried for up to ``retry_deadline``
seconds (an argument of `connect`, 30 by default) before it raises `UnavailableError`; writes and
takes are not done twice. `Space.retries` counts the retried attempts.

`entry_to_bytes` and `entry_from_bytes` turn an entry into its protocol encoding and back, for
entries kept outside a space. `channel_options` are `connect`'s gRPC channel options, for a
program that makes its own channel and wraps it in a `Space`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from outrig import aio as aio
    from outrig._admin import (
        BrowsedEntry,
        BrowsePage,
        ChangeLogFigures,
        RegistrationInfo,
        SpaceConfiguration,
        SpaceDescription,
        SubscriptionInfo,
        TransactionInfo,
        TypeFigures,
        WaiterGroup,
    )
    from outrig._base import ANY, FOREVER, Event, LeaseResult, Location, Placement, channel_options
    from outrig._changes import Change, ChangeStream
    from outrig._codec import entry_from_bytes, entry_to_bytes
    from outrig._delivery import Deliveries, Delivery, Returned, Taking
    from outrig._entry import Entry, GenericEntry
    from outrig._exceptions import (
        AbortedError,
        AlreadyExistsError,
        CallCancelledError,
        CompactedError,
        CrossPartitionError,
        DataLossError,
        DeadlineExceededError,
        DeliveryExpiredError,
        FailedPreconditionError,
        InternalError,
        InvalidArgumentError,
        LeaseNotFoundError,
        NoOtherServerError,
        NotFoundError,
        NotOwnerError,
        OutOfRangeError,
        OutrigError,
        PermissionDeniedError,
        QuotaExceededError,
        RegistrationBusyError,
        RequestConflictError,
        ResourceExhaustedError,
        RoutingValueError,
        ShuttingDownError,
        StoreUnavailableError,
        SubscriptionBusyError,
        SubscriptionNotFoundError,
        TransactionAbortedError,
        TransactionNotFoundError,
        TypeConflictError,
        UnauthenticatedError,
        UnavailableError,
        UnimplementedError,
        UnknownStatusError,
    )
    from outrig._matchers import (
        GE,
        GT,
        LE,
        LT,
        All,
        Matcher,
        Missing,
        Not,
        OneOf,
        OrderKey,
        Prefix,
        Present,
        Range,
        asc,
        desc,
    )
    from outrig._sync import Lease, Notification, Space, Transaction, connect
    from outrig._tls import TLS

# `import outrig` imports none of the SDK's modules (nor gRPC): each public name is imported from
# its module the first time it is used (PEP 562), so that a program that only needs a part (the
# `outrig` command's `serve`, which may start itself again on another allocator at once) does not
# pay for the whole client first. `from outrig import X` and `outrig.X` work as ever.
_MODULES: dict[str, tuple[str, ...]] = {
    "outrig._admin": (
        "BrowsedEntry",
        "BrowsePage",
        "ChangeLogFigures",
        "RegistrationInfo",
        "SpaceConfiguration",
        "SpaceDescription",
        "SubscriptionInfo",
        "TransactionInfo",
        "TypeFigures",
        "WaiterGroup",
    ),
    "outrig._base": ("ANY", "FOREVER", "Event", "LeaseResult", "Location", "Placement", "channel_options"),
    "outrig._changes": ("Change", "ChangeStream"),
    "outrig._codec": ("entry_from_bytes", "entry_to_bytes"),
    "outrig._delivery": ("Deliveries", "Delivery", "Returned", "Taking"),
    "outrig._entry": ("Entry", "GenericEntry"),
    "outrig._exceptions": (
        "AbortedError",
        "AlreadyExistsError",
        "CallCancelledError",
        "CompactedError",
        "CrossPartitionError",
        "DataLossError",
        "DeadlineExceededError",
        "DeliveryExpiredError",
        "FailedPreconditionError",
        "InternalError",
        "InvalidArgumentError",
        "LeaseNotFoundError",
        "NoOtherServerError",
        "NotFoundError",
        "NotOwnerError",
        "OutOfRangeError",
        "OutrigError",
        "PermissionDeniedError",
        "QuotaExceededError",
        "RegistrationBusyError",
        "RequestConflictError",
        "ResourceExhaustedError",
        "RoutingValueError",
        "ShuttingDownError",
        "StoreUnavailableError",
        "SubscriptionBusyError",
        "SubscriptionNotFoundError",
        "TransactionAbortedError",
        "TransactionNotFoundError",
        "TypeConflictError",
        "UnauthenticatedError",
        "UnavailableError",
        "UnimplementedError",
        "UnknownStatusError",
    ),
    "outrig._matchers": (
        "GE",
        "GT",
        "LE",
        "LT",
        "All",
        "Matcher",
        "Missing",
        "Not",
        "OneOf",
        "OrderKey",
        "Prefix",
        "Present",
        "Range",
        "asc",
        "desc",
    ),
    "outrig._sync": ("Lease", "Notification", "Space", "Transaction", "connect"),
    "outrig._tls": ("TLS",),
}
_WHERE = {name: module for module, names in _MODULES.items() for name in names}


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("outrig")
    except PackageNotFoundError:  # running from a source tree that is not installed
        return "0+unknown"


def __getattr__(name: str) -> Any:
    if name == "aio":  # `import outrig` makes `outrig.aio` available
        value: Any = importlib.import_module("outrig.aio")
    elif name == "__version__":
        value = _version()
    elif name in _WHERE:
        value = getattr(importlib.import_module(_WHERE[name]), name)
    else:
        raise AttributeError(f"module 'outrig' has no attribute {name!r}")
    globals()[name] = value  # once: later uses find it without this call
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__, "aio"})


__all__ = [
    "ANY",
    "FOREVER",
    "GE",
    "GT",
    "LE",
    "LT",
    "TLS",
    "AbortedError",
    "All",
    "AlreadyExistsError",
    "BrowsePage",
    "BrowsedEntry",
    "CallCancelledError",
    "Change",
    "ChangeLogFigures",
    "ChangeStream",
    "CompactedError",
    "CrossPartitionError",
    "DataLossError",
    "DeadlineExceededError",
    "Deliveries",
    "Delivery",
    "DeliveryExpiredError",
    "Entry",
    "Event",
    "FailedPreconditionError",
    "GenericEntry",
    "InternalError",
    "InvalidArgumentError",
    "Lease",
    "LeaseNotFoundError",
    "LeaseResult",
    "Location",
    "Matcher",
    "Missing",
    "NoOtherServerError",
    "Not",
    "NotFoundError",
    "NotOwnerError",
    "Notification",
    "OneOf",
    "OrderKey",
    "OutOfRangeError",
    "OutrigError",
    "PermissionDeniedError",
    "Placement",
    "Prefix",
    "Present",
    "QuotaExceededError",
    "Range",
    "RegistrationBusyError",
    "RegistrationInfo",
    "RequestConflictError",
    "ResourceExhaustedError",
    "Returned",
    "RoutingValueError",
    "ShuttingDownError",
    "Space",
    "SpaceConfiguration",
    "SpaceDescription",
    "StoreUnavailableError",
    "SubscriptionBusyError",
    "SubscriptionInfo",
    "SubscriptionNotFoundError",
    "Taking",
    "Transaction",
    "TransactionAbortedError",
    "TransactionInfo",
    "TransactionNotFoundError",
    "TypeConflictError",
    "TypeFigures",
    "UnauthenticatedError",
    "UnavailableError",
    "UnimplementedError",
    "UnknownStatusError",
    "WaiterGroup",
    "__version__",
    "asc",
    "channel_options",
    "connect",
    "desc",
    "entry_from_bytes",
    "entry_to_bytes",
]
