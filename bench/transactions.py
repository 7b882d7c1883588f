"""What a transaction costs: a write+take pair on its own vs inside a transaction, through the
blocking SDK, in memory and durable.

    python bench/transactions.py [--quick] [--seconds S] [--rounds N]

One client loops on one of two steps against a fresh `outrig serve` per run:

- plain: write an entry, take it back (2 calls, 2 changes);
- transaction: begin, write an entry, take it back, commit (4 calls, 1 change to the store at
  commit, since the write and the take cancel out inside the transaction).

Each server is in memory (``--in-memory``) or durable (``--data-dir``, ``--durability always``).
Runs are interleaved (the order rotates each round); figures are medians over rounds x 2 runs, with
min and max. The ratios are transaction / plain at equal durability: how many transactional
pairs per plain pair. Prints the core count and load average. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from servers import start_outrig_with

import outrig


@dataclass
class Job(outrig.Entry, type_name="bench.TxnJob"):
    n: int | None = None


def _plain(space: outrig.Space, n: int) -> None:
    space.write(Job(n=n))
    space.take(Job(n=n), timeout=0)


def _transactional(space: outrig.Space, n: int) -> None:
    with space.transaction() as txn:
        txn.write(Job(n=n))
        txn.take(Job(n=n), timeout=0)


STEPS = {"plain": _plain, "transaction": _transactional}


def _run(workdir: Path, durable: bool, step: str, seconds: float) -> float:
    flags = ["--data-dir", str(workdir / "data")] if durable else ["--in-memory"]
    server = start_outrig_with(workdir, *flags, "--log-level", "WARNING", name=f"outrig-{step}")
    try:
        with outrig.connect(server.address, space="bench") as space:
            work = STEPS[step]
            for n in range(50):  # warm-up
                work(space, n)
            done, started = 0, time.perf_counter()
            while time.perf_counter() - started < seconds:
                work(space, done)
                done += 1
            return done / (time.perf_counter() - started)
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="1 round of 1 s runs")
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    seconds, rounds = (1.0, 1) if args.quick else (args.seconds, args.rounds)
    cases = [(durable, step) for durable in (False, True) for step in STEPS]
    print(f"cores={os.cpu_count()} load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    results: dict[tuple[bool, str], list[float]] = {case: [] for case in cases}
    with tempfile.TemporaryDirectory(prefix="outrig-bench-txn-") as root:
        for round_number in range(rounds):
            order = cases[round_number % len(cases) :] + cases[: round_number % len(cases)]
            for _ in range(2):
                for durable, step in order:
                    workdir = Path(tempfile.mkdtemp(dir=root))
                    results[(durable, step)].append(_run(workdir, durable, step, seconds))
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"{rounds} rounds x 2 runs of {seconds:g} s, 1 client, pairs per second")
    print()
    print("| server | step | pairs/s (median) | min | max |")
    print("|---|---|---|---|---|")
    medians = {}
    for durable, step in cases:
        values = results[(durable, step)]
        medians[(durable, step)] = statistics.median(values)
        kind = "durable" if durable else "in memory"
        print(
            f"| {kind} | {step} | {medians[(durable, step)]:,.0f} | {min(values):,.0f} | {max(values):,.0f} |"
        )
    print()
    print(
        "ratios: "
        f"in_memory={medians[(False, 'transaction')] / medians[(False, 'plain')]:.2f} "
        f"durable={medians[(True, 'transaction')] / medians[(True, 'plain')]:.2f}"
    )


if __name__ == "__main__":
    main()
