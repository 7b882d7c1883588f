"""The console's throughput and latency (transport/console/rates.py) against hand-made readings
and against Prometheus' histogram_quantile rule."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from outrig.service.transport.console.rates import Rates, quantile
from outrig.service.transport.metrics import Metrics


def test_quantile_interpolates_inside_its_bucket() -> None:
    buckets = [(0.1, 50.0), (0.2, 90.0), (0.5, 100.0), (float("inf"), 100.0)]
    assert quantile(0.5, buckets) == 0.1  # the 50th of 100 is the top of the first bucket
    seventieth, top = quantile(0.7, buckets), quantile(0.99, buckets)
    assert seventieth is not None and abs(seventieth - 0.15) < 1e-9  # 20 of the 40 in (0.1, 0.2]
    assert top is not None and abs(top - 0.47) < 1e-9
    assert quantile(0.5, [(0.1, 0.0), (float("inf"), 0.0)]) is None
    assert quantile(0.99, [(0.1, 10.0), (float("inf"), 20.0)]) == 0.1  # in +Inf: its lower bound


def test_rates_are_the_differences_over_the_window() -> None:
    metrics = Metrics()
    now = [100.0]
    rates = Rates(metrics.calls, clock=lambda: now[0])
    for _ in range(10):
        metrics.call("Write", "OK", 0.002)
    assert rates.now() == ([], 0.0)  # one reading: no window yet
    now[0] += 2.0
    for _ in range(30):
        metrics.call("Write", "OK", 0.002)
    for _ in range(4):
        metrics.call("Take", "DEADLINE_EXCEEDED", 1.5)
    (write, take), window = rates.now()
    assert window == 2.0
    assert (write.method, write.per_second, write.failed_per_second) == ("Write", 15.0, 0.0)
    assert write.p50 is not None and 0.001 < write.p50 <= 0.0025  # in the (1 ms, 2.5 ms] bucket
    assert (take.method, take.per_second, take.failed_per_second) == ("Take", 2.0, 2.0)
    assert take.p99 is not None and 1.0 < take.p99 <= 2.5


def test_rates_without_metrics_are_empty() -> None:
    samples: list[Any] = [SimpleNamespace(samples=[])]
    rates = Rates(lambda: samples, clock=iter([0.0, 5.0]).__next__)
    rates.now()
    assert rates.now() == ([], 5.0)
