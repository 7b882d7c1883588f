"""What the engine's takes with an acknowledgement deadline cost, against a plain take, in the
pure engine (no gRPC, no store): the share of bench/acks.py's figures that is the engine's.

    python bench/deliveries.py [--quick] [--rounds N] [--operations N]

Cases, each over a FIFO space already holding `--backlog` entries of the type (a queue with a
backlog: each step writes a job and takes the oldest, so the backlog keeps its size), interleaved
within each round in a rotating order:

- take: write a job, take it (the baseline);
- ack: write a job, deliver it (a take with ack), ack it;
- nack: write a job, deliver the oldest, nack it (delay 0: back in its place, the oldest again),
  deliver it again, ack it: a redelivery;
- nack, small backlog: the same with 100 entries behind it: returning an entry to its place must
  not cost a walk of the queue (it did, 1.6 ms at 10,000, before `index._reorder` walked from
  both ends).

Medians of the per-operation time over the rounds; ratios against the take of the same round.
Prints the core count. Asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

from outrig.service.engine import FakeClock, NewEntry, SpaceEngine, SpaceSettings, Template
from outrig.service.engine.space import FOREVER
from outrig.service.engine.values import FieldValue

JOBS = [Template("Job", {})]


def _space(backlog: int) -> SpaceEngine:
    space = SpaceEngine("bench", SpaceSettings(), FakeClock())  # FIFO: each step takes the oldest
    space.write([_job(n) for n in range(backlog)], FOREVER)
    return space


def _job(n: int) -> NewEntry:
    return NewEntry("Job", (), {"n": FieldValue("int", n)}, None, 10)


def _take(space: SpaceEngine) -> None:
    space.write([_job(-1)], FOREVER)
    (_taken,), _ = space.find_or_conflict(JOBS, take=True)


def _ack(space: SpaceEngine) -> None:
    space.write([_job(-1)], FOREVER)
    (delivery,) = space.deliver(JOBS, 1, 30.0)
    space.ack(delivery.receipt)


def _nack(space: SpaceEngine) -> None:
    space.write([_job(-1)], FOREVER)
    (delivery,) = space.deliver(JOBS, 1, 30.0)
    space.nack(delivery.receipt, 0.0)
    (again,) = space.deliver(JOBS, 1, 30.0)
    space.ack(again.receipt)


def _timed(step: Callable[[SpaceEngine], None], space: SpaceEngine, operations: int) -> float:
    started = time.perf_counter()
    for _ in range(operations):
        step(space)
    return (time.perf_counter() - started) / operations


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="2 rounds of 2,000 operations")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--operations", type=int, default=20_000)
    parser.add_argument("--backlog", type=int, default=10_000)
    args = parser.parse_args()
    rounds, operations = (2, 2_000) if args.quick else (args.rounds, args.operations)
    cases: list[tuple[str, Callable[[SpaceEngine], None], int]] = [
        ("take (write, take)", _take, args.backlog),
        ("ack (write, take with ack, ack)", _ack, args.backlog),
        ("nack (write, deliver, nack 0, deliver, ack)", _nack, args.backlog),
        ("nack, a backlog of 100", _nack, 100),
    ]
    spaces = [_space(backlog) for _, _, backlog in cases]
    times: dict[str, list[float]] = {name: [] for name, _, _ in cases}
    ratios: dict[str, list[float]] = {name: [] for name, _, _ in cases}
    for number in range(rounds):
        order = cases[number % len(cases) :] + cases[: number % len(cases)]
        measured = {
            name: _timed(step, spaces[cases.index((name, step, backlog))], operations)
            for name, step, backlog in order
        }
        for name, seconds in measured.items():
            times[name].append(seconds)
            ratios[name].append(seconds / measured[cases[0][0]])
    print(f"cores={os.cpu_count()} rounds={rounds} operations={operations} backlog={args.backlog}")
    for name, _, _ in cases:
        median = statistics.median(times[name]) * 1e6
        print(f"{name:48} {median:8.2f} us  ratio to take {statistics.median(ratios[name]):5.2f}")


if __name__ == "__main__":
    main()
