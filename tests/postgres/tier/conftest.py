"""The SDK's behaviour suites (tests/integration/test_sdk_sync.py, test_sdk_async.py and
test_transactions.py, collected again by the modules here) run again through a tier of two
postgres servers, with every call sent to a server that owns none of the spaces (it is draining,
so each new space is claimed by the other):

- `forwarded`: the SDK with `direct=False`, so the receiving server forwards every call to the
  owner: the forwarding path, as a load balancer or a client in another language uses it;
- `direct`: the SDK as it comes, which asks the server it was given where each space lives and
  talks to the owner: the direct path.

The suites' `server` is, here, the receiving server's address with the owner's metrics (where
blocked calls park). Tests that start servers of their own (`LocalServer`) run as they do there.
"""

from __future__ import annotations

import dataclasses
import functools
import subprocess
import sys
from collections.abc import Iterator

import pytest

import outrig
import outrig.aio

from ...conftest import ServerProcess, start_server
from ...postgres_server import PostgresServer


def drained_pair(
    postgres: PostgresServer, prefix: str, *, metrics: bool = False
) -> tuple[ServerProcess, ServerProcess]:
    """Two servers of a tier on a fresh database: (owner, receiver), the receiver drained, so that
    the owner claims every space; tests/postgres/test_admin_tier.py uses it too."""
    flags = ("--backend", "postgres", "--dsn", postgres.dsn(postgres.new_database(prefix)))
    owner = start_server(*flags, metrics=metrics)
    receiver = start_server(*flags, metrics=metrics)
    drained = subprocess.run(
        [sys.executable, "-m", "outrig.service", "drain", "--address", receiver.address],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if drained.returncode != 0:
        receiver.stop()
        owner.stop()
    assert drained.returncode == 0, drained.stderr
    return owner, receiver


@pytest.fixture(scope="module", params=["forwarded", "direct"])
def server(request: pytest.FixtureRequest, postgres: PostgresServer) -> Iterator[ServerProcess]:
    owner, receiver = drained_pair(postgres, "k", metrics=True)
    try:
        with pytest.MonkeyPatch.context() as patch:
            if request.param == "forwarded":
                patch.setattr(outrig, "connect", functools.partial(outrig.connect, direct=False))
                patch.setattr(outrig.aio, "connect", functools.partial(outrig.aio.connect, direct=False))
            yield dataclasses.replace(receiver, metrics=owner.metrics)
        # Every space the suite made is the owner's: each call went through the other server.
        with outrig.connect(owner.address, direct=False) as asked:
            placed = {p.address for p in asked.list_spaces() if p.expires_in is not None}
        assert placed == {owner.address}, placed
    finally:
        receiver.stop()
        owner.stop()
