"""What matchers, order_by and their indexes cost in the pure engine: the "nothing scans" design of
ranges, prefixes and priority queues, measured.

    python bench/matching.py [--quick] [--rounds N]

Measures, in-process with no gRPC (the engine alone, so the ratios isolate its data structures):
  - a range take (priority in [90, 99], the oldest such) and an order_by take (the highest
    priority) among 1,000,000 entries against among 1,000; an equality take beside them, the
    baseline: its ratio is what the memory hierarchy alone costs at that size (a million
    entries do not fit in cache), and each ordered take's ratio is also given over it;
  - a priority take (the highest of 100 levels among 100,000 entries) against an equality take in
    the same space;
  - a write with 10,000 parked non-matching range waiters (one-sided, two-sided beside the value
    or around it with the value in a gap, prefix) against none, and against 10,000 parked
    non-matching equality waiters, the baseline of what parked waiters cost a write at all;
  - memory allocated per ordered-index entry.
Each figure is the median over interleaved rounds; every ratio compares two cases of the same run.
Prints the core count, Python version and load average (at the start and the end: the machine
may be shared). Nothing here is asserted: it reports.
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import statistics
import time
import tracemalloc
from collections.abc import Callable

from outrig.service.engine.clock import FakeClock
from outrig.service.engine.matchers import Matcher, Prefix, Range
from outrig.service.engine.model import NewEntry, Templates, Waiter, make_template
from outrig.service.engine.space import SpaceEngine, SpaceSettings
from outrig.service.engine.values import FieldValue

LEVELS = 100


def _job(i: int) -> NewEntry:
    fields = {
        "priority": FieldValue("int", (i * 7919) % LEVELS),
        "region": FieldValue("string", ("eu", "us", "uk", "ap")[i % 4]),
        "n": FieldValue("int", i),
    }
    return NewEntry("bench.Job", (), fields, None, 40)


def _space(entries: int, clock: FakeClock, indexes: tuple[tuple[str, str], ...] = ()) -> SpaceEngine:
    settings = SpaceSettings(max_entries=10**8, max_bytes=10**12, indexes=indexes)
    space = SpaceEngine("bench", settings, clock)
    batch = 10_000
    for start in range(0, entries, batch):
        space.write([_job(i) for i in range(start, min(start + batch, entries))], 3600.0)
    return space


def _per_op(op: Callable[[int], object], count: int) -> float:
    started = time.perf_counter()
    for i in range(count):
        op(i)
    return (time.perf_counter() - started) / count


def _taker(space: SpaceEngine, templates: Templates) -> Callable[[int], object]:
    """Take one match, then put it back (at the back of the space), keeping the space as it was."""

    def take(i: int) -> object:
        (entry,), _ = space.find_or_conflict(templates, take=True)
        space.restore([entry])
        return entry

    return take


def _query(
    matchers: dict[str, Matcher] | None = None,
    order_by: tuple[tuple[str, bool], ...] = (),
    **fields: FieldValue,
) -> Templates:
    return Templates([make_template("bench.Job", fields, matchers)], order_by)


RANGE = _query({"priority": Range("int", 90, True, 99, True)})
ORDERED = _query(order_by=(("priority", True),))
EQUAL = _query(region=FieldValue("string", "eu"))


def _settle() -> None:
    """Collect what earlier cases left, and keep what is alive now out of later collections: a
    full collection walks every object, so one that a case happened to trigger would charge it
    for the other cases' spaces (the server freezes its own start-up heap too)."""
    gc.unfreeze()
    gc.collect()
    gc.freeze()


def _rounds(cases: dict[str, Callable[[], float]], rounds: int) -> dict[str, float]:
    """The median of each case over `rounds` rounds, the cases interleaved within each round."""
    samples: dict[str, list[float]] = {name: [] for name in cases}
    for case in cases.values():  # a first round unmeasured: it makes the indexes the cases need
        case()
    for _ in range(rounds):
        for name, case in cases.items():
            samples[name].append(case())
    return {name: statistics.median(values) for name, values in samples.items()}


def _row(name: str, low: float, high: float, more: str = "") -> None:
    print(f"{name:<58}{low * 1e6:>9.2f} us{high * 1e6:>9.2f} us{high / low:>8.2f}{more}")


def _load() -> str:
    return "/".join(f"{figure:.2f}" for figure in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes, fewer operations")
    parser.add_argument("--rounds", type=int, default=0, help="interleaved rounds (default 5, quick 3)")
    args = parser.parse_args()
    big, ops = (100_000, 2_000) if args.quick else (1_000_000, 10_000)
    rounds = args.rounds or (3 if args.quick else 5)
    small, mid = 1_000, 100_000
    print(
        f"cores={os.cpu_count()} python={platform.python_version()} rounds={rounds} ops/round={ops}"
        f" load={_load()}"
    )
    clock = FakeClock()

    # Ranges and order_by among few and many entries. The indexes are made by the first take, in
    # the warm-up round.
    spaces = {small: _space(small, clock), big: _space(big, clock)}
    _settle()
    cases: dict[str, Callable[[], float]] = {}
    for size, space in spaces.items():
        for label, query in (("range", RANGE), ("order_by", ORDERED), ("equality", EQUAL)):
            cases[f"{label} {size}"] = lambda s=space, q=query: _per_op(_taker(s, q), ops)  # type: ignore[misc]
    medians = _rounds(cases, rounds)
    print(
        f"{'take, ' + f'{small:,} vs {big:,} entries':<58}{'small':>12}{'large':>12}{'ratio':>8}"
        f"{'/ equality':>12}"
    )
    baseline = medians[f"equality {big}"] / medians[f"equality {small}"]
    for label, what in (
        ("range", "range take (priority in [90, 99], oldest)"),
        ("order_by", "order_by take (highest priority)"),
        ("equality", "equality take (region = eu, oldest): the baseline"),
    ):
        low, high = medians[f"{label} {small}"], medians[f"{label} {big}"]
        _row(what, low, high, f"{high / low / baseline:>12.2f}")

    # The priority queue against an equality take in the same space.
    del spaces, cases
    _settle()
    queue = _space(mid, clock)
    _settle()
    medians = _rounds(
        {
            "priority": lambda q=queue: _per_op(_taker(q, ORDERED), ops),  # type: ignore[misc]
            "equality": lambda q=queue: _per_op(_taker(q, EQUAL), ops),  # type: ignore[misc]
        },
        rounds,
    )
    print(
        f"{f'take among {mid:,} entries of {LEVELS} levels':<58}{'equality':>12}{'priority':>12}{'ratio':>8}"
    )
    _row("highest priority (order_by desc) vs region = eu", medians["equality"], medians["priority"])

    # contents(order_by, max_entries=10): the first 10 candidates of the ordered index, against
    # every candidate in order (what a bounded contents read before it stopped at its bound).
    few = max(1, ops // 200)
    medians = _rounds(
        {
            "bounded": lambda q=queue: _per_op(lambda i: q.first_candidates(ORDERED, 10), ops),  # type: ignore[misc]
            "whole": lambda q=queue: _per_op(lambda i: q.candidates(ORDERED)[:10], few),  # type: ignore[misc]
        },
        rounds,
    )
    print(f"{f'contents order_by, 10 of {mid:,} entries':<58}{'bounded':>12}{'whole':>12}{'ratio':>8}")
    _row("the first 10 candidates vs every candidate in order", medians["bounded"], medians["whole"])

    # Writes with parked range waiters that none of the writes can wake.
    del queue
    _settle()
    new = _job(0)

    def writer(parked: int, make: Callable[[int], Matcher] | None) -> Callable[[], float]:
        space = _space(0, clock)
        for i in range(parked):
            if make is None:  # an equality waiter on a serial number no write has
                template = make_template("bench.Job", {"n": FieldValue("int", -1 - i)})
            else:
                field = "region" if make is _prefix else "priority"
                template = make_template("bench.Job", {}, {field: make(i)})
            space.park(Waiter(space.new_waiter_seq(), (template,), True, lambda entries: True))
        return lambda: _per_op(lambda i: space.write([new], 3600.0), ops)

    def _one_sided(i: int) -> Matcher:
        return Range("int", 1_000 + i, True, None, False)

    def _two_sided(i: int) -> Matcher:
        return Range("int", 1_000 + i, True, 1_010 + i, True)

    def _below(i: int) -> Matcher:
        return Range("int", None, False, -1 - i, True)

    def _gaps(i: int) -> Matcher:  # [15, 25], [-25, -15], [35, 45], ...: the value 0 between them
        middle = 20 * (i // 2 + 1) * (1 if i % 2 else -1)
        return Range("int", middle - 5, True, middle + 5, True)

    def _prefix(i: int) -> Matcher:
        return Prefix("string", f"zz-{i}")

    kinds: dict[str, Callable[[int], Matcher] | None] = {
        "n = -1-i (equality): the baseline": None,
        "GE(1000+i)": _one_sided,
        "[1000+i, 1010+i]": _two_sided,
        "[20j-5, 20j+5], j = +-1, +-2, ...: 0 in a gap": _gaps,
        "LE(-1-i)": _below,
        "Prefix(zz-i)": _prefix,
    }
    write_cases = {"none": writer(0, None)} | {name: writer(10_000, make) for name, make in kinds.items()}
    _settle()  # the parked waiters out of the collections the writes trigger, as the spaces above
    medians = _rounds(write_cases, rounds)
    print(
        f"{'write, 10,000 parked non-matching waiters':<58}{'none':>12}{'parked':>12}{'ratio':>8}"
        f"{'/ equality':>12}"
    )
    equality = medians["n = -1-i (equality): the baseline"]
    for name in kinds:
        _row(f"waiters {name}", medians["none"], medians[name], f"{medians[name] / equality:>12.2f}")

    # Memory: one ordered index over `big` entries, made after the space is filled; what it
    # allocates, traced (resident memory would hide it in what the earlier cases freed).
    del write_cases
    _settle()
    space = _space(big, clock)
    tracemalloc.start()
    space.find_or_conflict(ORDERED, take=False)  # makes the (bench.Job, priority) index
    allocated, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    print(f"memory: {allocated / big:,.0f} bytes allocated per ordered-index entry ({big:,} entries)")
    print(f"load={_load()}")


if __name__ == "__main__":
    main()
