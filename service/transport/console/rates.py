"""Throughput and latency for the console, from the server's own metrics (transport/metrics.py):
calls a second and latency quantiles per method over the last window, from the differences
between two readings of the request counter and latency histogram."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["MethodRate", "Rates", "quantile"]

#: The shortest window a rate is computed over (seconds); readings closer together share one.
MIN_WINDOW = 1.0


@dataclass(frozen=True, slots=True)
class MethodRate:
    method: str
    per_second: float
    failed_per_second: float
    p50: float | None
    p99: float | None


@dataclass
class _Reading:
    at: float
    calls: dict[str, float]  # method -> calls so far
    failed: dict[str, float]  # method -> calls not OK so far
    buckets: dict[str, list[tuple[float, float]]]  # method -> (upper bound, cumulative count)


def quantile(q: float, buckets: list[tuple[float, float]]) -> float | None:
    """The q-quantile of a cumulative histogram's (upper bound, count) buckets, interpolated in
    its bucket as Prometheus' histogram_quantile does; None without observations."""
    ordered = sorted(buckets)
    if not ordered or ordered[-1][1] <= 0:
        return None
    rank = q * ordered[-1][1]
    lower, below = 0.0, 0.0
    for upper, count in ordered:
        if count >= rank:
            if math.isinf(upper):
                return lower
            inside = count - below
            return lower + (upper - lower) * ((rank - below) / inside if inside else 1.0)
        lower, below = upper, count
    return lower


def _read(samples: Iterable[Any], at: float) -> _Reading:
    reading = _Reading(at, {}, {}, {})
    for family in samples:
        for sample in family.samples:
            labels: Mapping[str, str] = sample.labels
            method = labels.get("method", "?")
            if sample.name == "outrig_requests_total":
                reading.calls[method] = reading.calls.get(method, 0.0) + sample.value
                if labels.get("code") != "OK":
                    reading.failed[method] = reading.failed.get(method, 0.0) + sample.value
            elif sample.name == "outrig_request_seconds_bucket":
                reading.buckets.setdefault(method, []).append((float(labels["le"]), sample.value))
    return reading


class Rates:
    """Readings of `samples` (the metric families of calls), and the rates between the last two."""

    def __init__(
        self, samples: Callable[[], Iterable[Any]], clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._samples = samples
        self._clock = clock
        self._before: _Reading | None = None
        self._last: _Reading | None = None

    def now(self) -> tuple[list[MethodRate], float]:
        """Each method's rates over the window, busiest first, and the window's seconds (0: the
        first reading, no window yet)."""
        reading = _read(self._samples(), self._clock())
        if self._last is None or reading.at - self._last.at >= MIN_WINDOW:
            self._before, self._last = self._last, reading
        before = self._before
        if before is None:
            return [], 0.0
        window = reading.at - before.at
        rates = []
        for method, calls in reading.calls.items():
            done = calls - before.calls.get(method, 0.0)
            failed = reading.failed.get(method, 0.0) - before.failed.get(method, 0.0)
            earlier = dict(before.buckets.get(method, []))
            deltas = [
                (upper, count - earlier.get(upper, 0.0)) for upper, count in reading.buckets.get(method, [])
            ]
            rates.append(
                MethodRate(
                    method, done / window, failed / window, quantile(0.5, deltas), quantile(0.99, deltas)
                )
            )
        rates.sort(key=lambda rate: (-rate.per_second, rate.method))
        return rates, window
