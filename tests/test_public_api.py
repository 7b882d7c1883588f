"""The SDK's public surface, pinned: a name added to or dropped from `outrig` or `outrig.aio` is a
decision, taken here on purpose (and in the CHANGELOG), never by accident."""

from __future__ import annotations

import importlib
import inspect
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import outrig
import outrig.aio

ROOT = Path(__file__).resolve().parent.parent

OUTRIG = {
    # connecting and the space
    "connect", "Space", "Lease", "Notification", "Transaction", "Event", "LeaseResult", "TLS",
    "Location", "Placement",
    # the admin API's results (Space.describe, Space.browse)
    "SpaceDescription", "TypeFigures", "WaiterGroup", "RegistrationInfo", "TransactionInfo",
    "SpaceConfiguration", "BrowsePage", "BrowsedEntry",
    "ANY", "FOREVER", "channel_options",
    # entries
    "Entry", "GenericEntry", "entry_to_bytes", "entry_from_bytes",
    # matchers in templates, and order_by's keys
    "Matcher", "Range", "GT", "GE", "LT", "LE", "Prefix", "OneOf", "Not", "Present", "Missing", "All",
    "OrderKey", "asc", "desc",
    # errors: the root, one class per gRPC status, and the domain classes beneath them
    "OutrigError", "CallCancelledError", "UnknownStatusError", "InvalidArgumentError",
    "DeadlineExceededError", "NotFoundError", "AlreadyExistsError", "PermissionDeniedError",
    "ResourceExhaustedError", "FailedPreconditionError", "AbortedError", "OutOfRangeError",
    "UnimplementedError", "InternalError", "UnavailableError", "DataLossError",
    "UnauthenticatedError", "LeaseNotFoundError", "TransactionNotFoundError", "QuotaExceededError",
    "TypeConflictError", "TransactionAbortedError", "RequestConflictError", "RegistrationBusyError",
    "ShuttingDownError", "StoreUnavailableError", "NotOwnerError", "NoOtherServerError",
    "RoutingValueError", "CrossPartitionError", "DeliveryExpiredError",
    # takes with an acknowledgement deadline (docs/work-queues.md)
    "Delivery", "Returned", "Taking", "Deliveries",
    # the change log (docs/notifications.md)
    "Change", "ChangeStream", "ChangeLogFigures", "SubscriptionInfo", "CompactedError",
    "SubscriptionBusyError", "SubscriptionNotFoundError",
    "__version__",
}  # fmt: skip
AIO = {
    "connect", "AsyncSpace", "AsyncLease", "AsyncNotification", "AsyncTransaction", "AsyncDelivery",
    "AsyncTaking", "AsyncChangeStream", "AsyncDeliveries",
}  # fmt: skip


def test_outrig_exports_exactly_its_public_names() -> None:
    assert set(outrig.__all__) == OUTRIG
    assert len(outrig.__all__) == len(OUTRIG)  # no name twice
    assert all(hasattr(outrig, name) for name in outrig.__all__)


def test_import_outrig_imports_no_sdk_module_until_a_name_is_used() -> None:
    # PEP 562: `outrig serve` imports `outrig` (the package of outrig.service) before it may start
    # itself again on tcmalloc, and a program that needs one name pays for that name's modules.
    code = (
        "import sys, outrig; before = sorted(m for m in sys.modules if m.startswith(('outrig.', 'grpc')));"
        " outrig.Entry; entry = 'outrig._entry' in sys.modules and 'outrig._sync' not in sys.modules;"
        " outrig.aio.connect; print(before, entry, 'outrig.aio._space' in sys.modules)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.split() == ["[]", "True", "True"]


def test_each_name_is_its_modules_own() -> None:
    for name in outrig.__all__:
        if name != "__version__":
            value = getattr(outrig, name)
            home = importlib.import_module(outrig._WHERE[name])
            assert getattr(home, name) is value, name
    assert outrig.aio is importlib.import_module("outrig.aio")
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        outrig.nothing  # noqa: B018


def test_outrig_aio_exports_exactly_its_public_names() -> None:
    assert set(outrig.aio.__all__) == AIO
    assert all(hasattr(outrig.aio, name) for name in outrig.aio.__all__)


def test_domain_errors_subclass_their_status_class() -> None:
    parents = {
        outrig.LeaseNotFoundError: outrig.NotFoundError,
        outrig.TransactionNotFoundError: outrig.LeaseNotFoundError,
        outrig.QuotaExceededError: outrig.ResourceExhaustedError,
        outrig.TypeConflictError: outrig.FailedPreconditionError,
        outrig.TransactionAbortedError: outrig.FailedPreconditionError,
        outrig.RequestConflictError: outrig.FailedPreconditionError,
        outrig.RegistrationBusyError: outrig.FailedPreconditionError,
        outrig.ShuttingDownError: outrig.UnavailableError,
        outrig.StoreUnavailableError: outrig.UnavailableError,
        outrig.NotOwnerError: outrig.StoreUnavailableError,
        outrig.NoOtherServerError: outrig.FailedPreconditionError,
        outrig.DeliveryExpiredError: outrig.FailedPreconditionError,
        outrig.CompactedError: outrig.OutOfRangeError,
        outrig.SubscriptionBusyError: outrig.FailedPreconditionError,
        outrig.SubscriptionNotFoundError: outrig.NotFoundError,
    }
    for cls, parent in parents.items():
        assert cls.__bases__ == (parent,), cls
        assert cls.code == parent.code


@pytest.mark.parametrize(
    "space", [outrig.Space, outrig.aio.AsyncSpace, outrig.Transaction, outrig.aio.AsyncTransaction]
)
def test_nowait_never_waits_and_if_exists_names_its_lock_wait(space: type) -> None:
    for name in ("read_nowait", "take_nowait"):
        parameters = inspect.signature(getattr(space, name)).parameters
        # A space's take_nowait may deliver (ack=); a transaction's may not (not under one).
        acked = (
            ["ack", "max_deliveries", "settle"]
            if name == "take_nowait" and "Transaction" not in space.__name__
            else []
        )
        assert list(parameters) == ["self", "templates", "order_by", *acked], name
        for keyword in ("order_by", *acked):
            assert parameters[keyword].kind is inspect.Parameter.KEYWORD_ONLY, name
    for name in ("read_if_exists", "take_if_exists"):
        parameter = inspect.signature(getattr(space, name)).parameters["lock_timeout"]
        assert parameter.kind is inspect.Parameter.KEYWORD_ONLY, name


def test_the_sdk_contract_covers_every_sdk_module() -> None:
    """The import-linter contract 'the SDK never imports the server' lists its source modules by
    name; a new module of the SDK must be listed there too, or it would go unchecked."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    (contract,) = [
        c for c in config["tool"]["importlinter"]["contracts"] if c["name"].startswith("the SDK never")
    ]
    modules = {f"outrig.{p.stem}" for p in (ROOT / "client").glob("*.py")} - {
        "outrig.__init__",
        "outrig.__main__",  # runs the server's CLI, on purpose
        "outrig.testing",  # starts an in-process server, on purpose
    }
    modules |= {"outrig.aio", "outrig.v1"}
    assert set(contract["source_modules"]) == modules
