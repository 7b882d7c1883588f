"""Prometheus metrics, served on their own port (`outrig serve --metrics-listen HOST:PORT`).

What a request costs here is two dictionary lookups and a counter and a histogram update, on
children made once per method; without `--metrics-listen` nothing is recorded at all. What a
space holds (entries per type, parked waiters, registrations, transactions, expired leases) is
read from the backend when Prometheus scrapes, never kept up to date per request.

| metric | type | labels |
|---|---|---|
| `outrig_requests_total` | counter | method, code |
| `outrig_request_seconds` | histogram | method |
| `outrig_entries` | gauge | space, type (entries of that type or a subtype) |
| `outrig_space_entries`, `outrig_space_bytes` | gauge | space |
| `outrig_waiters`, `outrig_registrations`, `outrig_transactions` | gauge | space |
| `outrig_leases_expired_total` | counter | space |
| `outrig_deliveries_in_flight`, `outrig_entries_delayed` | gauge | space (pending; hidden till a time) |
| `outrig_redelivered_total`, `outrig_dead_lettered_total` | counter | space (unacked ends; dead letters) |
| `outrig_store_commit_seconds` | histogram | (the embedded store's group commits) |
| `outrig_store_batch_changes` | histogram | (records per group commit) |
| `outrig_policy_denials_total` | counter | action |
| `outrig_mux_streams`, `outrig_mux_ops_in_flight` | gauge | (open Mux streams; their ops not yet answered) |
| `outrig_routed_calls_total` | counter | method, how (forwarded, or redirected: NOT_OWNER) |
| `outrig_tier_spaces_owned`, `outrig_tier_serving` | gauge | (spaces owned; 1 while it can serve) |
| `outrig_tier_claims_total`, `outrig_tier_load_seconds_total` | counter | (claims; their loads' seconds) |
| `outrig_tier_spaces_dropped_total` | counter | reason (fenced, renewal, unreachable, moved) |

The tier's figures (a `--backend postgres` server only) are read from the backend at a scrape.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from outrig.service.backends.base import SpaceFigures, TierFigures

__all__ = ["Metrics"]

log = logging.getLogger("outrig.service")

_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


class _SpacesCollector(Collector):
    def __init__(self, figures: Callable[[], Mapping[str, SpaceFigures]]) -> None:
        self._figures = figures

    def collect(self) -> Iterable[Any]:
        try:
            spaces = self._figures()
        except Exception as err:  # a scrape must not break on a backend that cannot answer now
            log.warning("metrics: could not read the spaces' figures: %s", err)
            return
        gauges = {
            name: GaugeMetricFamily(f"outrig_{name}", text, labels=["space"])
            for name, text in (
                ("space_entries", "Entries in the space"),
                ("space_bytes", "Bytes of the entries in the space"),
                ("waiters", "Blocked reads and takes parked in the space"),
                ("registrations", "Notify registrations of the space"),
                ("transactions", "Open transactions of the space"),
                ("space_max_entries", "The space's quota of entries (max_entries)"),
                ("space_max_bytes", "The space's quota of bytes (max_bytes)"),
                ("deliveries_in_flight", "Entries delivered (taken with an ack deadline), not yet settled"),
                ("entries_delayed", "Entries hidden until a time (delayed writes, delayed nacks)"),
            )
        }
        per_type = GaugeMetricFamily(
            "outrig_entries", "Entries of a type or its subtypes", labels=["space", "type"]
        )
        expired = CounterMetricFamily("outrig_leases_expired", "Leases expired", labels=["space"])
        redelivered = CounterMetricFamily(
            "outrig_redelivered", "Deliveries that ended unacknowledged (nack or deadline)", labels=["space"]
        )
        dead_lettered = CounterMetricFamily(
            "outrig_dead_lettered", "Entries moved to the dead-letter space", labels=["space"]
        )
        for space, figures in spaces.items():
            gauges["space_entries"].add_metric([space], figures.entries)
            gauges["space_bytes"].add_metric([space], figures.bytes)
            gauges["waiters"].add_metric([space], figures.waiters)
            gauges["registrations"].add_metric([space], figures.registrations)
            gauges["transactions"].add_metric([space], figures.transactions)
            if figures.max_entries:
                gauges["space_max_entries"].add_metric([space], figures.max_entries)
            if figures.max_bytes:
                gauges["space_max_bytes"].add_metric([space], figures.max_bytes)
            expired.add_metric([space], figures.expired)
            gauges["deliveries_in_flight"].add_metric([space], figures.in_flight)
            gauges["entries_delayed"].add_metric([space], figures.delayed)
            redelivered.add_metric([space], figures.redelivered)
            dead_lettered.add_metric([space], figures.dead_lettered)
            for type_name, count in figures.types.items():
                per_type.add_metric([space, type_name], count)
        yield from gauges.values()
        yield per_type
        yield expired
        yield redelivered
        yield dead_lettered


class _StreamsCollector(Collector):
    """The Mux streams open now and their operations in flight, read at each scrape."""

    def __init__(self, figures: Callable[[], tuple[int, int]]) -> None:
        self._figures = figures

    def collect(self) -> Iterable[GaugeMetricFamily]:
        streams, in_flight = self._figures()
        yield GaugeMetricFamily("outrig_mux_streams", "Open Mux streams", value=streams)
        yield GaugeMetricFamily(
            "outrig_mux_ops_in_flight", "Operations of the Mux streams not yet answered", value=in_flight
        )


class _TierCollector(Collector):
    def __init__(self, figures: Callable[[], TierFigures | None]) -> None:
        self._figures = figures

    def collect(self) -> Iterable[Any]:
        figures = self._figures()
        if figures is None:  # a lone server: no tier
            return
        yield GaugeMetricFamily("outrig_tier_spaces_owned", "Spaces this server owns", value=figures.owned)
        yield GaugeMetricFamily(
            "outrig_tier_serving",
            "1 while this server can serve (its database link works)",
            value=figures.serving,
        )
        yield CounterMetricFamily("outrig_tier_claims", "Spaces this server claimed", value=figures.claims)
        yield CounterMetricFamily(
            "outrig_tier_load_seconds", "Seconds spent loading the spaces claimed", value=figures.load_seconds
        )
        dropped = CounterMetricFamily(
            "outrig_tier_spaces_dropped", "Spaces this server stopped serving, by why", labels=["reason"]
        )
        for reason in ("fenced", "renewal", "unreachable", "moved"):
            dropped.add_metric([reason], figures.dropped.get(reason, 0))
        yield dropped


class Metrics:
    """The server's metrics, in a registry of their own."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self._requests = Counter(
            "outrig_requests", "Calls by method and gRPC status", ["method", "code"], registry=self.registry
        )
        self._latency = Histogram(
            "outrig_request_seconds",
            "Time in the server per call (a stream: until it ends)",
            ["method"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self._denials = Counter(
            "outrig_policy_denials", "Calls the policy refused, by action", ["action"], registry=self.registry
        )
        self._commit = Histogram(
            "outrig_store_commit_seconds", "Group commits of the embedded store", registry=self.registry
        )
        self._batch = Histogram(
            "outrig_store_batch_changes",
            "Records per group commit of the embedded store",
            buckets=_BATCH_BUCKETS,
            registry=self.registry,
        )
        self._routed = Counter(
            "outrig_routed_calls",
            "Calls on a space another server owns: forwarded to it, or redirected (NOT_OWNER)",
            ["method", "how"],
            registry=self.registry,
        )
        self._children: dict[tuple[str, str], Any] = {}
        self._timers: dict[str, Any] = {}
        self._http: Any = None  # the HTTP server `serve` started, until `close`

    def watch_spaces(self, figures: Callable[[], Mapping[str, SpaceFigures]]) -> None:
        """Read the spaces' figures from `figures` at each scrape."""
        self.registry.register(_SpacesCollector(figures))

    def watch_streams(self, figures: Callable[[], tuple[int, int]]) -> None:
        """Read (open Mux streams, their operations in flight) from `figures` at each scrape."""
        self.registry.register(_StreamsCollector(figures))

    def watch_tier(self, figures: Callable[[], TierFigures | None]) -> None:
        """Read a tier server's ownership figures from `figures` at each scrape."""
        self.registry.register(_TierCollector(figures))

    def routed(self, method: str, how: str) -> None:
        """A call on a space another server owns was "forwarded" or "redirected"."""
        self._routed.labels(method, how).inc()

    def call(self, method: str, code: str, seconds: float) -> None:
        """One call ended with `code` (a gRPC status name) after `seconds`."""
        counter = self._children.get((method, code))
        if counter is None:
            counter = self._children[(method, code)] = self._requests.labels(method, code)
        counter.inc()
        timer = self._timers.get(method)
        if timer is None:
            timer = self._timers[method] = self._latency.labels(method)
        timer.observe(seconds)

    def calls(self) -> list[Any]:
        """The request counter's and latency histogram's metric families now (the console reads
        its throughput and latency from them)."""
        return [*self._requests.collect(), *self._latency.collect()]

    def denied(self, action: str) -> None:
        self._denials.labels(action).inc()

    def committed(self, seconds: float, changes: int) -> None:
        self._commit.observe(seconds)
        self._batch.observe(changes)

    def serve(self, listen: str) -> None:
        """Serve /metrics on HOST:PORT, from a thread of prometheus_client's, until `close`."""
        host, _, port = listen.rpartition(":")
        address = host.strip("[]") or "0.0.0.0"
        self._http, _ = start_http_server(int(port), addr=address, registry=self.registry)

    def close(self) -> None:
        """Stop serving /metrics and free its port (a server embedded in an application, or a
        LocalServer, must not leave its thread and port behind when it stops)."""
        http, self._http = self._http, None
        if http is not None:
            http.shutdown()
            http.server_close()
