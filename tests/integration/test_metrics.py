"""Prometheus metrics and JSON logs of a real server process."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path

import pytest

import outrig
from outrig.service.config import ServerConfig
from outrig.testing import LocalServer

from ..conftest import free_port, start_server
from ..polling import scrape, wait_until


@dataclass
class Gauge(outrig.Entry, type_name="metrics.Gauge"):
    n: int | None = None


@dataclass
class SubGauge(Gauge, type_name="metrics.SubGauge"):
    pass


def scrape_text(address: str) -> str:
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=5) as reply:
        return reply.read().decode()


def _scrape_until(address: str, done: Callable[[dict[str, float]], bool], what: str) -> dict[str, float]:
    """The first samples of which `done` holds (failing, saying `what`, after 10 s)."""
    return wait_until(lambda: samples if done(samples := scrape(address)) else None, what=what)


def test_metrics_count_calls_codes_entries_and_commits(tmp_path: Path) -> None:
    metrics = f"127.0.0.1:{free_port()}"
    server = start_server("--data-dir", str(tmp_path / "data"), "--metrics-listen", metrics)
    try:
        with outrig.connect(server.address, space="m", retry_deadline=0) as space:
            space.write_many([Gauge(n=1), SubGauge(n=2), SubGauge(n=3)], lease=600)
            space.write(Gauge(n=4), lease=0.2)
            assert space.take(Gauge(n=1), timeout=0) == Gauge(n=1)
            with pytest.raises(outrig.InvalidArgumentError):
                space.read(Gauge(), timeout=-1)
            txn = space.transaction()
            # The short lease runs out (a server process runs on the real clock); the reaper counts it.
            expired = 'outrig_leases_expired_total{space="m"}'
            samples = _scrape_until(metrics, lambda s: s.get(expired, 0) >= 1, "the 0.2 s lease to be reaped")
            txn.abort()
    finally:
        server.stop()
    assert samples['outrig_requests_total{code="OK",method="WriteMany"}'] == 1
    assert samples['outrig_requests_total{code="OK",method="Write"}'] == 1
    assert samples['outrig_requests_total{code="INVALID_ARGUMENT",method="Read"}'] == 1
    assert samples['outrig_request_seconds_count{method="Take"}'] == 1
    assert samples['outrig_space_entries{space="m"}'] == 2
    assert samples['outrig_entries{space="m",type="metrics.Gauge"}'] == 2  # with its subtype
    assert samples['outrig_entries{space="m",type="metrics.SubGauge"}'] == 2
    assert samples['outrig_transactions{space="m"}'] == 1
    assert samples['outrig_leases_expired_total{space="m"}'] == 1
    assert samples["outrig_store_commit_seconds_count"] >= 3
    assert samples["outrig_store_batch_changes_sum"] >= 5


def test_metrics_count_deliveries_delays_redeliveries_and_dead_letters(tmp_path: Path) -> None:
    metrics = f"127.0.0.1:{free_port()}"
    server = start_server("--data-dir", str(tmp_path / "data"), "--metrics-listen", metrics)
    try:
        with outrig.connect(server.address, space="q", retry_deadline=0) as space:
            space.write_many([Gauge(n=n) for n in range(3)])
            space.write(Gauge(n=9), delay=3600.0)
            held = space.take(Gauge(n=0), timeout=0, ack=600.0)
            returned = space.take(Gauge(n=1), timeout=0, ack=600.0)
            poisoned = space.take(Gauge(n=2), timeout=0, ack=600.0, max_deliveries=1)
            assert held is not None and returned is not None and poisoned is not None
            returned.nack(delay=0.0)
            assert poisoned.nack().dead_letter == "q.dead"
            samples = scrape(metrics)
            held.ack()
    finally:
        server.stop()
    assert samples['outrig_deliveries_in_flight{space="q"}'] == 1
    assert samples['outrig_entries_delayed{space="q"}'] == 1
    assert samples['outrig_redelivered_total{space="q"}'] == 2  # the nack and the one dead-lettered
    assert samples['outrig_dead_lettered_total{space="q"}'] == 1
    assert samples['outrig_space_entries{space="q.dead"}'] == 1


def test_metrics_show_the_mux_streams_and_their_ops_in_flight() -> None:
    metrics = f"127.0.0.1:{free_port()}"
    server = start_server("--in-memory", "--metrics-listen", metrics)
    try:
        with outrig.connect(server.address, space="m", retry_deadline=0) as space:
            space.count(Gauge())  # opens the connection's stream
            with futures.ThreadPoolExecutor(2) as pool:
                takes = [pool.submit(space.take, Gauge(n=n), 30.0) for n in (1, 2)]
                busy = _scrape_until(
                    metrics, lambda s: s["outrig_mux_ops_in_flight"] == 2, "two ops in flight"
                )
                space.write_many([Gauge(n=1), Gauge(n=2)])
                assert all(take.result(timeout=10) is not None for take in takes)
            # An op counts until gRPC has taken its result, which may be a moment after the client
            # has it.
            idle = _scrape_until(metrics, lambda s: s["outrig_mux_ops_in_flight"] == 0, "no op in flight")
        closed = _scrape_until(metrics, lambda s: s["outrig_mux_streams"] == 0, "the stream to close")
    finally:
        server.stop()
    assert (busy["outrig_mux_streams"], busy["outrig_mux_ops_in_flight"]) == (1, 2)
    assert (idle["outrig_mux_streams"], idle["outrig_mux_ops_in_flight"]) == (1, 0)
    assert closed["outrig_mux_streams"] == 0
    assert busy['outrig_requests_total{code="OK",method="Count"}'] == 1  # an op counts as its method


def test_no_metrics_unless_asked_and_json_logs(tmp_path: Path) -> None:
    server = start_server("--log-format", "json", "--log-level", "INFO")
    try:
        with outrig.connect(server.address, space="m", retry_deadline=0) as space:
            space.write(Gauge(n=1))
    finally:
        server.stop()
    lines = [json.loads(line) for line in server.log.read_text().splitlines() if line.startswith("{")]
    assert lines, server.log.read_text()
    assert all({"time", "level", "logger", "message"} <= set(line) for line in lines)
    assert not any("metrics on" in line["message"] for line in lines)


def test_a_stopped_local_server_frees_its_metrics_port() -> None:
    """An embedded server's /metrics thread and port end with it: the same port serves again."""
    metrics = f"127.0.0.1:{free_port()}"
    for _ in range(2):
        with (
            LocalServer(ServerConfig(metrics_listen=metrics)) as server,
            outrig.connect(server.address) as space,
        ):
            space.write(Gauge(n=1))
            assert "outrig_requests_total" in scrape_text(metrics)
    with pytest.raises(urllib.error.URLError, match="refused"):
        scrape_text(metrics)
