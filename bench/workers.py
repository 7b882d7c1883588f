"""`outrig serve --workers 2` with a data dir (durability always): what a forwarded call costs, and
how long a killed worker's spaces are away.

    python bench/workers.py [--quick] [--rounds N] [--pairs N] [--kills N]

a. Forwarded vs direct: one blocking client doing write+take pairs on a space of worker 1,
   through worker 0's own port with `direct=False` (worker 0 forwards each call to worker 1) and
   on worker 1's own port (the baseline), the two interleaved in each round: median latency per
   pair over rounds, and the ratio forwarded / direct.
b. A worker killed: SIGKILL worker 1, then a write on its space through the public port (the
   SDK retrying UNAVAILABLE): the seconds from the kill until that write is acknowledged, which
   is the supervisor's backoff (0.1 s for a first restart), the worker's start and its store's
   recovery, and the SDK's own retry backoff; median over --kills kills, each once the worker
   has served again (kills in a row, so the supervisor's backoff doubles at each: 0.1, 0.2,
   0.4 s, ...).

Prints the core count and the load average (these machines are shared); asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import outrig

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.worker_processes import Workers, start_workers


@dataclass
class Item(outrig.Entry, type_name="bench.WorkerItem"):
    n: int | None = None


def pairs(space: outrig.Space, count: int) -> float:
    """Seconds per write+take pair, over `count` pairs."""
    started = time.perf_counter()
    for n in range(count):
        space.write(Item(n=n))
        assert space.take(Item(n=n), timeout=10) is not None
    return (time.perf_counter() - started) / count


def forwarded_vs_direct(workers: Workers, space_name: str, rounds: int, count: int) -> None:
    forwarded, direct = [], []
    with (
        outrig.connect(workers.addresses[0], space=space_name, direct=False) as through,
        outrig.connect(workers.addresses[1], space=space_name, direct=False) as on_owner,
    ):
        pairs(through, 50)  # warm both paths: channels, the peer link
        pairs(on_owner, 50)
        for _ in range(rounds):
            forwarded.append(pairs(through, count))
            direct.append(pairs(on_owner, count))
    f, d = statistics.median(forwarded), statistics.median(direct)
    print(f"a. write+take pair, {rounds} rounds of {count} pairs (medians)")
    print(f"   direct, on the worker's own port : {d * 1e3:7.3f} ms")
    print(f"   forwarded by the other worker    : {f * 1e3:7.3f} ms   ratio {f / d:.2f}")


def kills(workers: Workers, space_name: str, count: int) -> None:
    away = []
    with outrig.connect(workers.public, space=space_name, direct=False, retry_deadline=60) as space:
        for k in range(count):
            space.write(Item(n=k))
            killed = time.perf_counter()
            os.kill(workers.pids[1], signal.SIGKILL)
            space.write(Item(n=k))
            away.append(time.perf_counter() - killed)
            workers.wait_restarted(1)
        held = space.count(Item())
    print(f"b. worker 1 SIGKILLed {count} times: its space served again after")
    print(f"   median {statistics.median(away):.3f} s; each: {', '.join(f'{a:.2f}' for a in away)} s")
    print("   (kills in a row: the supervisor's backoff doubles from 0.1 s each time)")
    print(f"   acknowledged writes held afterwards: {held} of {2 * count}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    for flag, default in (("--rounds", 5), ("--pairs", 500), ("--kills", 5)):
        parser.add_argument(flag, type=int, default=default)
    parser.add_argument("--quick", action="store_true", help="fewer rounds, pairs and kills")
    args = parser.parse_args()
    rounds, count, kill_count = (3, 100, 2) if args.quick else (args.rounds, args.pairs, args.kills)
    print(f"cores: {os.cpu_count()} (affinity {len(os.sched_getaffinity(0))}); load {os.getloadavg()}")
    with tempfile.TemporaryDirectory(prefix="outrig-bench-workers-") as data:
        workers = start_workers(2, "--data-dir", data)
        try:
            (space_name,) = workers.spaces_of(1, prefix="bench")
            forwarded_vs_direct(workers, space_name, rounds, count)
            kills(workers, space_name, kill_count)
        finally:
            workers.stop()
    print(f"load afterwards {os.getloadavg()}")


if __name__ == "__main__":
    main()
