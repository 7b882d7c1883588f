"""The backends the conformance suite runs against: every `SpaceBackend` must pass it.

To add one, append a factory to BACKENDS: an async context manager that takes the server
configuration, the clock to use and the test's fixture request (through which it asks for what it
needs of the session, such as the `postgres` server, only when it runs), and yields a started
backend that it closes on exit. The tests see only the `SpaceBackend` protocol, the `clock` they
may advance, and the names below.
"""

from __future__ import annotations

import dataclasses
import tempfile
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from outrig.service.backends.base import SpaceBackend
from outrig.service.backends.embedded.backend import EmbeddedBackend
from outrig.service.backends.memory.backend import MemoryBackend
from outrig.service.config import Limits, ServerConfig
from outrig.service.engine import FakeClock, SpaceSettings

from ..postgres_server import PostgresServer

BackendFactory = Callable[
    [ServerConfig, FakeClock, pytest.FixtureRequest], AbstractAsyncContextManager[SpaceBackend]
]

QUOTA_MAX_ENTRIES = 3
QUOTA_MAX_BYTES = 1000
DEFAULT_LEASE = 3600.0

# Spaces with small quotas, one per test that needs them (a fresh name each: a shared store must
# not carry one test's entries into another's quota).
_RUN = uuid.uuid4().hex[:8]
_QUOTA_SPACES = [f"quota-{_RUN}-{i}" for i in range(16)]
_quota_spaces_left = list(_QUOTA_SPACES)

CONFIG = ServerConfig(
    reap_interval=0.01,  # real seconds between reaper passes; lease times follow the fake clock
    limits=Limits(contents_chunk=4),
    space_defaults=SpaceSettings(fifo=True, default_lease=DEFAULT_LEASE),
    spaces={
        name: SpaceSettings(max_entries=QUOTA_MAX_ENTRIES, max_bytes=QUOTA_MAX_BYTES)
        for name in _QUOTA_SPACES
    },
)


@asynccontextmanager
async def embedded(
    config: ServerConfig, clock: FakeClock, request: pytest.FixtureRequest
) -> AsyncIterator[SpaceBackend]:
    backend = EmbeddedBackend(config, clock=clock)
    await backend.start()
    try:
        yield backend
    finally:
        await backend.close()
        await backend.shutdown()


@asynccontextmanager
async def embedded_durable(
    config: ServerConfig, clock: FakeClock, request: pytest.FixtureRequest
) -> AsyncIterator[SpaceBackend]:
    """The embedded backend recording every change in a real SQLite store (group commit, always)."""
    with tempfile.TemporaryDirectory(prefix="outrig-conformance-") as data_dir:
        durable = dataclasses.replace(config, data_dir=Path(data_dir))
        async with embedded(durable, clock, request) as backend:
            yield backend


def _memory_parked_waiters(backend: MemoryBackend, space: str) -> int:
    engine = backend._spaces.get(space)  # not yet served (the postgres backend loads it first): 0
    return 0 if engine is None else engine.statistics().waiters


# How to count a space's parked reads and takes, for backends that can tell: the protocol has no
# such call, but "a cancelled or timed-out call leaves no waiter behind" deserves a check.
# The memory backend's subclasses (embedded, postgres) all can.
PARKED_WAITERS: dict[type, Callable[[Any, str], int]] = {MemoryBackend: _memory_parked_waiters}


@asynccontextmanager
async def postgresql(
    config: ServerConfig, clock: FakeClock, request: pytest.FixtureRequest
) -> AsyncIterator[SpaceBackend]:
    """The PostgreSQL backend on a fresh database of the session's throwaway server (the
    `postgres` fixture of tests/conftest.py, which stops it at the session's end)."""

    from outrig.service.backends.postgres.backend import PostgresBackend

    server: PostgresServer = request.getfixturevalue("postgres")
    backend = PostgresBackend(config, server.dsn(server.new_database("c")), clock)
    await backend.start()
    try:
        yield backend
    finally:
        await backend.close()
        await backend.shutdown()


BACKENDS: list[object] = [
    pytest.param(embedded, id="embedded"),
    pytest.param(embedded_durable, id="embedded-durable"),
    pytest.param(postgresql, id="postgres-owner"),
]


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture(params=BACKENDS)
async def backend(request: pytest.FixtureRequest, clock: FakeClock) -> AsyncIterator[SpaceBackend]:
    factory: BackendFactory = request.param
    async with factory(CONFIG, clock, request) as started:
        yield started


@pytest.fixture
def space() -> str:
    """A fresh space per test: a shared store (a database) never mixes two tests' entries."""
    return f"c-{uuid.uuid4().hex[:12]}"


class QuotaSpace(NamedTuple):
    name: str
    max_entries: int
    max_bytes: int


@pytest.fixture
def quota_space() -> QuotaSpace:
    """A fresh space with small quotas."""
    assert _quota_spaces_left, "add names to _QUOTA_SPACES: more tests use quota spaces"
    return QuotaSpace(_quota_spaces_left.pop(), QUOTA_MAX_ENTRIES, QUOTA_MAX_BYTES)


@pytest.fixture
def default_lease() -> float:
    """What the spaces grant for Lease.ANY."""
    return DEFAULT_LEASE


@pytest.fixture
def parked_waiters(backend: SpaceBackend) -> Callable[[str], int | None]:
    """How many reads and takes wait in a space; None when the backend cannot tell."""
    probe = next((PARKED_WAITERS[cls] for cls in type(backend).__mro__ if cls in PARKED_WAITERS), None)
    return lambda space: None if probe is None else probe(backend, space)
