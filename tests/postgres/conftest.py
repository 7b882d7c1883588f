"""A throwaway PostgreSQL for the session (see tests/postgres_server.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ..postgres_server import PostgresServer, find_bindir, running_postgres


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    bindir = find_bindir()
    if bindir is None:  # pragma: no cover - the machine image has the server binaries
        pytest.fail("no PostgreSQL server binaries (initdb): install postgresql or set OUTRIG_PG_BINDIR")
    with running_postgres(bindir) as server:
        yield server
