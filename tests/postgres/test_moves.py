"""Spaces moving between the servers of a tier, with real server processes on a real PostgreSQL:
an operator's `outrig move` and `outrig drain`, and a server that joins getting its share
(rebalancing); nothing is lost or done twice on the way, and the clients' retries carry them."""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest

import outrig

from ..conftest import start_server
from ..polling import scrape, wait_until
from ..postgres_server import PostgresServer
from .test_servers import Job, drained

LEASE = "1.5"


@pytest.fixture
def database(postgres: PostgresServer) -> str:
    return postgres.dsn(postgres.new_database("m"))


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "outrig.service", *args], capture_output=True, text=True, timeout=120
    )


def owners(address: str) -> dict[str, str]:
    with outrig.connect(address, retry_deadline=10) as space:
        return {p.space: p.address for p in space.list_spaces() if p.expires_in is not None}


def test_move_hands_a_space_over_and_its_clients_follow(database: str) -> None:
    a = start_server("--backend", "postgres", "--dsn", database, "--owner-lease", LEASE)
    b = start_server("--backend", "postgres", "--dsn", database, "--owner-lease", LEASE)
    try:
        with outrig.connect(a.address, space="jobs", direct=False, retry_deadline=30) as through_a:
            through_a.write_many([Job(n=i) for i in range(50)])
            assert owners(a.address)["jobs"] == a.address
            got: list[object] = []
            blocked = threading.Thread(target=lambda: got.append(through_a.take(Job(n=999), timeout=60)))
            blocked.start()
            moved = cli("move", "jobs", "--to", b.address, "--address", a.address)
            assert moved.returncode == 0, moved.stderr
            assert moved.stdout.strip() == f"jobs -> {b.address}"
            wait_until(lambda: owners(a.address).get("jobs") == b.address, what="b owns jobs")
            through_a.write(Job(n=999))  # forwarded to b; the blocked take, retried into b, gets it
            blocked.join(60)
            assert got == [Job(n=999)]
            assert drained(through_a) == list(range(50))  # each entry once, none lost
    finally:
        a.stop()
        b.stop()


def test_drain_moves_every_space_away_and_move_refuses_bad_targets(database: str) -> None:
    a = start_server("--backend", "postgres", "--dsn", database, "--owner-lease", LEASE)
    try:
        for name in ("s1", "s2", "s3"):
            with outrig.connect(a.address, space=name) as space:
                space.write(Job(n=1))
        alone = cli("drain", "--address", a.address)
        assert alone.returncode == 2 and "NO_OTHER_SERVER" in alone.stderr
        b = start_server("--backend", "postgres", "--dsn", database, "--owner-lease", LEASE)
        try:
            unknown = cli("move", "s1", "--to", "nowhere:1", "--address", b.address)  # forwarded to a
            assert (
                unknown.returncode == 2
                and "INVALID_ARGUMENT" in unknown.stderr
                and "nowhere:1" in unknown.stderr
            )
            drained = cli("drain", "--address", a.address)
            assert drained.returncode == 0, drained.stderr
            assert sorted(drained.stdout.splitlines()[:-1]) == [f"s{i} -> {b.address}" for i in (1, 2, 3)]
            wait_until(lambda: set(owners(b.address).values()) == {b.address}, what="b owning all three")
            a.stop()
            for name in ("s1", "s2", "s3"):
                with outrig.connect(b.address, space=name, retry_deadline=30) as space:
                    assert space.take_nowait(Job()) == Job(n=1)
        finally:
            b.stop()
    finally:
        a.stop()


def test_a_server_that_joins_gets_its_share(database: str) -> None:
    a = start_server("--backend", "postgres", "--dsn", database, "--owner-lease", LEASE)
    try:
        names = [f"r{i}" for i in range(4)]
        for name in names:
            with outrig.connect(a.address, space=name) as space:
                space.write_many([Job(n=i) for i in range(10)])
        b = start_server("--backend", "postgres", "--dsn", database, "--owner-lease", LEASE)
        try:
            wait_until(
                lambda: sorted(owners(a.address).values()).count(b.address) >= 1,
                timeout=60,
                what="a space moved to the new server",
            )
            placed = owners(a.address)
            assert sorted(placed) == names
            for name in names:
                with outrig.connect(a.address, space=name, retry_deadline=30) as space:
                    assert drained(space) == list(range(10)), name
        finally:
            b.stop()
    finally:
        a.stop()


def test_move_on_a_lone_server_is_refused() -> None:
    lone = start_server()
    try:
        refused = cli("move", "jobs", "--address", lone.address)
        assert refused.returncode == 2
        assert "FAILED_PRECONDITION (NO_OTHER_SERVER)" in refused.stderr
    finally:
        lone.stop()


def test_a_client_routed_to_the_owner_follows_a_move(database: str) -> None:
    """The SDK marks the calls it routes to an owner other than the server it was given
    (`outrig-direct`): the old owner redirects them (NOT_OWNER naming the new one) instead of
    forwarding each for ever."""
    a = start_server("--backend", "postgres", "--dsn", database, "--owner-lease", LEASE)
    b = start_server("--backend", "postgres", "--dsn", database, "--owner-lease", LEASE)
    try:
        with outrig.connect(a.address, space="routed") as claim:
            claim.write(Job(n=1))  # a claims it
        with outrig.connect(b.address, space="routed", retry_deadline=30) as space:
            space.write(Job(n=2))
            assert space.target == a.address  # given b, the SDK talks to the owner, a
            moved = cli("move", "routed", "--to", b.address, "--address", a.address)
            assert moved.returncode == 0, moved.stderr
            space.write(Job(n=3))  # sent to a, redirected to b, retried there
            assert space.target == b.address
            assert drained(space) == [1, 2, 3]
    finally:
        a.stop()
        b.stop()


def test_a_tiers_servers_report_claims_routing_and_moves_in_their_metrics(database: str) -> None:
    a = start_server("--backend", "postgres", "--dsn", database, "--owner-lease", LEASE, metrics=True)
    b = start_server("--backend", "postgres", "--dsn", database, "--owner-lease", LEASE, metrics=True)
    try:
        assert a.metrics is not None and b.metrics is not None
        with outrig.connect(a.address, space="counted") as claim:
            claim.write(Job(n=1))  # a claims it
        with outrig.connect(b.address, space="counted", direct=False) as through_b:
            through_b.write(Job(n=2))  # forwarded by b to a
        metrics_a, metrics_b = a.metrics, b.metrics
        at_a = wait_until(
            lambda: s if (s := scrape(metrics_a))["outrig_tier_claims_total"] >= 1 else None,
            what="a's claim in its metrics",
        )
        assert at_a["outrig_tier_spaces_owned"] == 1 and at_a["outrig_tier_serving"] == 1
        assert at_a["outrig_tier_load_seconds_total"] > 0
        at_b = scrape(metrics_b)
        assert at_b['outrig_routed_calls_total{how="forwarded",method="Write"}'] >= 1
        assert at_b["outrig_tier_spaces_owned"] == 0 and at_b["outrig_tier_claims_total"] == 0
        moved = cli("move", "counted", "--to", b.address, "--address", a.address)
        assert moved.returncode == 0, moved.stderr
        with outrig.connect(b.address, space="counted") as space:
            assert drained(space) == [1, 2]
        assert scrape(metrics_a)['outrig_tier_spaces_dropped_total{reason="moved"}'] == 1
        at_b = scrape(metrics_b)
        assert at_b["outrig_tier_claims_total"] == 1 and at_b["outrig_tier_spaces_owned"] == 1
        assert at_b['outrig_tier_spaces_dropped_total{reason="fenced"}'] == 0
    finally:
        a.stop()
        b.stop()


def test_a_lone_server_has_no_tier_metrics() -> None:
    lone = start_server(metrics=True)
    try:
        assert lone.metrics is not None
        with outrig.connect(lone.address, space="alone") as space:
            space.write(Job(n=1))
        assert not [
            name for name in scrape(lone.metrics) if name.startswith(("outrig_tier_", "outrig_routed_"))
        ]
    finally:
        lone.stop()
