"""Partitioned spaces (docs/scaling.md): every core, what fan-out costs, and the blocking take's
claim protocol.

    python bench/partitions.py [--quick] [--part a|b|c] [--rounds N] [--entries N] [--seconds S]
                               [--clients N] [--one-worker] [--pin] [--rate R] [--slot S]

a. Every core: one space in P partitions by "region", served in memory by `outrig serve
   --workers W`: P = 1, 2 and 4 on W = 1 (partitioning alone: the CPU per pair should stay
   flat), and P = 2 on W = 2 against P = 2 on W = 1 (the issue's comparison) and P = 4 on W = 2.
   --clients client processes, each with 10 asyncio tasks per worker (the SDK routing each pair
   to its partition's worker over one Mux stream per worker, so each stream carries 10 in flight,
   as one worker's does), do write+take pairs with routing values spread, for --seconds a round:
   pairs/s, and the CPU seconds per pair of the server processes (each worker, and their sum)
   and of the clients, from /proc; rounds interleaved, medians. With --pin the servers run on the
   first core and the clients on the others, so that the clients' load does not change what the
   servers' CPU per pair measures (--one-worker: the one-worker rows only). "paired" is the median
   of each round's ratio to that round's W1P1. --rate R caps the offered load at R pairs/s in all
   (each task paces its pairs), so that every shape is measured at the same load, and so with the
   same operations per Mux message, whatever the SDK's own cost per call: at full speed the
   clients (on the servers' cores, or on the one core left by --pin) set how full the server's
   messages are, and a client that costs more per call sends emptier ones.
   --slot S: the one-worker shapes P = 1, 2 and 4 served at once, the client processes driving
   one at a time and switching every S seconds, together; each server's CPU is read at every
   slot's end (/proc's schedstat), and what it used in its own slots is its CPU per pair. What
   else the machine runs (other processes on its cores) then weighs on every shape alike, slot
   by slot, rather than on whichever one a round measures at the time (--rate applies too).

b. Fan-out latency: one in-memory server holding a space in P = 1 (unpartitioned: the baseline),
   2 and 4 partitions by "region", each with --entries entries spread over 64 regions. One
   blocking client times read_nowait of a template without the routing field (a match in every
   partition), read_nowait of one that matches nothing (every partition looked at), count of the
   space, and, as the routed case, read_nowait naming a region (one partition). Median and p99
   per call, and the ratio to P = 1, rounds interleaved.
c. The blocking take without the routing field: 10 takers, each on its own connection, wait with
   take(Job(), timeout) on a space of P = 1 or 4; one writer writes --entries entries one at a time,
   each stamped with its write time, after all takers are parked (the server's parked reads are
   polled). Wake-up latency: from the write's call to the take's return (same machine, monotonic
   clock), median and p99; and the check that every entry was taken exactly once.

bench/workers.py measures a forwarded call between workers and a killed worker's time away. Rounds
are interleaved, figures are medians over
rounds; prints the core count and load average: server and clients share this machine's cores.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from servers import ServerProcess, start_outrig_with

import outrig
import outrig.aio
from outrig._codec import encode_value
from outrig._routing import value_partition

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
_WORKER_LINE = re.compile(r"outrig worker (\d+) listening on (\S+): pid (\d+)")

REGIONS = [f"region-{i}" for i in range(64)]
SHAPES = (1, 2, 4)


@dataclass
class Job(outrig.Entry, type_name="bench.PartJob"):
    region: str | None = None
    n: int | None = None
    written: float | None = None


def _config(workdir: Path) -> Path:
    path = workdir / "partitions.toml"
    lines = ["[space_defaults]", "max_entries = 10000000", ""]
    for p in SHAPES:
        if p > 1:
            lines += [f"[spaces.p{p}]", 'partition_by = "region"', f"partitions = {p}", ""]
    path.write_text("\n".join(lines))
    return path


def _start(workdir: Path) -> ServerProcess:
    return start_outrig_with(
        workdir, "--in-memory", "--config", str(_config(workdir)), "--log-level", "WARNING"
    )


def _quantiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return statistics.median(ordered), ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


# ---------------------------------------------------------------- a. every core


def _cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS


def _run_time(pid: int) -> float:
    """CPU seconds of every thread of a process so far, to the nanosecond (/proc's schedstat:
    /proc's stat counts clock ticks, too coarse to share out half-second slots)."""
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/schedstat") as stat:
                total += int(stat.read().split()[0])
        except FileNotFoundError:
            continue
    return total / 1e9


def _switches(pid: int) -> int:
    """Context switches of every thread of a process so far (how often it slept and woke)."""
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/status") as status:
                for line in status:
                    if "ctxt_switches:" in line:  # voluntary and nonvoluntary
                        total += int(line.split()[1])
        except FileNotFoundError:
            continue
    return total


def _children_cpu(pid: int) -> float:
    """CPU of a process and its children that were waited for (a client process, once done)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12]) + int(fields[13]) + int(fields[14])) / _CLOCK_TICKS


class _Served:
    """`outrig serve --workers W` in memory with "jobs" in P partitions: its workers' pids."""

    def __init__(self, workdir: Path, workers: int, partitions: int) -> None:
        config = workdir / f"every-core-{workers}-{partitions}.toml"
        config.write_text(
            "[space_defaults]\nmax_entries = 10000000\n\n"
            + (
                f'[spaces.jobs]\npartition_by = "region"\npartitions = {partitions}\n'
                if partitions > 1
                else ""
            )
        )
        flags = ["--in-memory", "--config", str(config), "--log-level", "WARNING", "--workers", str(workers)]
        self.server = start_outrig_with(workdir, *flags, name=f"outrig-w{workers}-p{partitions}")
        self.pids = [self.server.pid]
        if workers > 1:
            assert self.server.process.stdout is not None
            self.pids = []
            for _ in range(workers):
                found = _WORKER_LINE.search(self.server.process.stdout.readline())
                assert found is not None, self.server.log.read_text()[-2000:]
                self.pids.append(int(found.group(3)))

    def cpu(self) -> list[float]:
        return [_cpu(pid) for pid in self.pids]

    def switches(self) -> int:
        return sum(_switches(pid) for pid in self.pids)

    def stop(self) -> None:
        self.server.stop()


def _regions_of(partition: int, partitions: int) -> list[str]:
    """64 routing values of one partition."""
    names = (f"one-{i}" for i in range(100_000))
    return [r for r in names if value_partition(encode_value(r), partitions) == partition][:64]


async def _client_pairs(
    address: str, seconds: float, tasks: int, seed: int, regions: list[str], rate: float = 0.0
) -> int:
    """Pairs done in `seconds` by `tasks` tasks; with `rate`, each task paces itself to its share
    of `rate` pairs/s (this process's offered load), starting pairs on a schedule, not faster."""
    done = 0
    interval = tasks / rate if rate > 0 else 0.0
    async with outrig.aio.connect(address, space="jobs") as space:
        for region in regions:  # locate every partition before the clock starts
            await space.write(Job(region=region, n=-1))
            await space.take(Job(region=region, n=-1), timeout=10)
        deadline = time.monotonic() + seconds

        async def pairs(task: int) -> None:
            nonlocal done
            n = 0
            start = time.monotonic() + interval * task / tasks  # the tasks' slots interleaved
            while time.monotonic() < deadline:
                if interval:
                    due = start + n * interval
                    if due > time.monotonic():
                        await asyncio.sleep(due - time.monotonic())  # pacing the offered load
                region = regions[(seed * 131 + task * 17 + n) % len(regions)]
                await space.write(Job(region=region, n=n))
                await space.take(Job(region=region, n=n), timeout=10)
                n += 1
                done += 1

        await asyncio.gather(*(pairs(task) for task in range(tasks)))
    return done


async def _client_slots(
    addresses: list[str], start: float, seconds: float, slot: float, tasks: int, seed: int, rate: float
) -> list[int]:
    """Pairs done on each of `addresses` by `tasks` tasks that drive one server at a time: the
    one of the current `slot`-second slot (slot i: server i mod n), from the monotonic clock's
    `start` (every client process switches together), for `seconds`. A pair started in a slot
    counts for that slot's server. `rate`: as `_client_pairs`'s."""
    done = [0] * len(addresses)
    interval = tasks / rate if rate > 0 else 0.0
    async with contextlib.AsyncExitStack() as stack:
        spaces = [await stack.enter_async_context(outrig.aio.connect(a, space="jobs")) for a in addresses]
        for space in spaces:  # locate every partition before the clock starts
            for region in REGIONS:
                await space.write(Job(region=region, n=-1))
                await space.take(Job(region=region, n=-1), timeout=10)
        await asyncio.sleep(max(0.0, start - time.monotonic()))
        deadline = start + seconds

        async def pairs(task: int) -> None:
            n = 0
            while (now := time.monotonic()) < deadline:
                due = start + (n + task / tasks) * interval
                if due > now:
                    await asyncio.sleep(due - now)  # pacing the offered load
                    now = time.monotonic()
                i = int((now - start) / slot) % len(spaces)
                region = REGIONS[(seed * 131 + task * 17 + n) % len(REGIONS)]
                await spaces[i].write(Job(region=region, n=n))
                await spaces[i].take(Job(region=region, n=n), timeout=10)
                n += 1
                done[i] += 1

        await asyncio.gather(*(pairs(task) for task in range(tasks)))
    return done


def _pin(pid: int, cores: set[int]) -> None:
    """Run every thread of process `pid` on `cores` (a thread started later inherits its
    creator's)."""
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            os.sched_setaffinity(int(task), cores)
        except (ProcessLookupError, OSError):
            continue


#: --pin: the servers on the first core, the clients on the others (None: wherever the kernel puts them).
_CLIENT_CORES: set[int] | None = None


def _spawn(command: list[str], clients: int) -> list[subprocess.Popen[str]]:
    """`clients` client processes running `command`, seeded 0, 1, ... (on the clients' cores)."""
    cores = _CLIENT_CORES
    return [
        subprocess.Popen(
            [*command, "--seed", str(i)],
            stdout=subprocess.PIPE,
            text=True,
            preexec_fn=None if cores is None else (lambda: os.sched_setaffinity(0, cores)),
        )
        for i in range(clients)
    ]


def _clients(
    address: str, clients: int, seconds: float, tasks: int, one: bool = False, rate: float = 0.0
) -> tuple[int, float]:
    """Pairs done by `clients` client processes of `tasks` tasks each in `seconds`, and their CPU
    seconds; with `rate`, the processes together offer at most `rate` pairs/s."""
    command = [
        sys.executable,
        __file__,
        "--client",
        address,
        "--seconds",
        str(seconds),
        "--tasks",
        str(tasks),
        *(["--one-partition"] if one else []),
        *(["--rate", str(rate / clients)] if rate > 0 else []),
    ]
    processes = _spawn(command, clients)
    total, cpu = 0, 0.0
    for process in processes:
        out, _ = process.communicate(timeout=seconds + 120)
        pairs, client_cpu = out.split()
        total += int(pairs)
        cpu += float(client_cpu)
    return total, cpu


# (workers, partitions, every routing value in one partition: one worker takes the whole load)
SHAPES_A = ((1, 1, False), (1, 2, False), (1, 4, False), (2, 2, False), (2, 4, False), (2, 2, True))


def part_a(
    workdir: Path, rounds: int, seconds: float, clients: int, one_worker: bool = False, rate: float = 0.0
) -> None:
    print(
        f"\na. every core: {clients} client processes x 10 tasks a worker, write+take pairs with the "
        f"routing value set, {seconds:.0f} s a round, {rounds} rounds, in memory"
        + ("; the servers pinned to core 0, the clients to the others" if _CLIENT_CORES is not None else "")
        + (f"; offered load capped at {rate:.0f} pairs/s" if rate > 0 else "")
    )
    rows: dict[tuple[int, int, bool], list[tuple[float, float, list[float], float]]] = {}
    woken: dict[tuple[int, int, bool], list[float]] = {}
    for _ in range(rounds):
        for workers, partitions, one in SHAPES_A if not one_worker else SHAPES_A[:3]:
            served = _Served(workdir, workers, partitions)
            if _CLIENT_CORES is not None:
                for pid in served.pids:
                    _pin(pid, {0})
            try:
                tasks = 10 if one else 10 * workers  # 10 in flight on each of a client's streams
                _clients(served.server.address, clients, 1.0, tasks, one)  # warm
                before, switched = served.cpu(), served.switches()
                pairs, client_cpu = _clients(served.server.address, clients, seconds, tasks, one, rate)
                after, switched = served.cpu(), served.switches() - switched
            finally:
                served.stop()
            used = [b - a for a, b in zip(before, after, strict=True)]
            rows.setdefault((workers, partitions, one), []).append(
                (
                    pairs / seconds,
                    sum(used) / max(1, pairs),
                    [u / max(1, pairs) for u in used],
                    client_cpu / max(1, pairs),
                )
            )
            woken.setdefault((workers, partitions, one), []).append(switched / max(1, pairs))
    base = rows[(1, 1, False)]
    base_rate = statistics.median(r for r, _, _, _ in base)
    base_cpu = statistics.median(c for _, c, _, _ in base)
    one_worker_p2 = statistics.median(r for r, _, _, _ in rows[(1, 2, False)])
    print(f"{'workers':>7} {'P':>2} {'pairs/s':>8} {'vs W1P1':>8} {'server us/pair':>15} {'vs W1P1':>8} "
          f"{'paired':>7} {'per worker us/pair':>20} {'client us/pair':>15} "
          f"{'server switches/pair':>21}")  # fmt: skip
    for (workers, partitions, one), found in rows.items():
        rate = statistics.median(r for r, _, _, _ in found)
        cpu = statistics.median(c for _, c, _, _ in found)
        each = [statistics.median(e[i] for _, _, e, _ in found) for i in range(workers)]
        client = statistics.median(c for _, _, _, c in found)
        # Each round's ratio to the same round's W1P1, then their median: what load the machine
        # had that round (others' processes share its cores) weighs on both sides alike.
        paired = statistics.median(c / b[1] for (_, c, _, _), b in zip(found, base, strict=True))
        star = "*" if one else " "
        print(
            f"{workers:>7} {partitions:>2}{star}{rate:>7.0f} {rate / base_rate:>8.2f} {cpu * 1e6:>15.0f} "
            f"{cpu / base_cpu:>8.2f} {paired:>7.2f} {' '.join(f'{e * 1e6:.0f}' for e in each):>20} "
            f"{client * 1e6:>15.0f}"
            f" {statistics.median(woken[(workers, partitions, one)]):>21.2f}"
        )
    if (2, 2, False) in rows:
        two = statistics.median(r for r, _, _, _ in rows[(2, 2, False)])
        print(f"P = 2: 2 workers / 1 worker, pairs/s: {two / one_worker_p2:.2f}")
    print("*: every routing value in one partition, so one of the two workers takes the whole load")


def part_a_slots(
    workdir: Path, rounds: int, seconds: float, clients: int, slot: float, rate: float = 0.0
) -> None:
    """The one-worker shapes (P = 1, 2, 4) served at once, the clients switching between them
    every `slot` seconds: what load the machine has (other processes on its cores) falls on every
    shape alike, slot by slot, instead of on whichever one a round measures then."""
    print(
        f"\na. slots: the one-worker shapes P = {', '.join(map(str, SHAPES))} served at once, {clients} "
        f"client processes x 10 tasks driving one at a time, switching every {slot:g} s, {seconds:.0f} s "
        f"a round, {rounds} rounds, in memory"
        + ("; the servers pinned to core 0, the clients to the others" if _CLIENT_CORES is not None else "")
        + (f"; offered load capped at {rate:.0f} pairs/s" if rate > 0 else "")
    )
    found: dict[int, list[tuple[float, float, float, float]]] = {}
    for _ in range(rounds):
        served = [_Served(workdir, 1, p) for p in SHAPES]
        try:
            if _CLIENT_CORES is not None:
                for each in served:
                    _pin(each.pids[0], {0})
            addresses = ",".join(each.server.address for each in served)
            command = [sys.executable, __file__, "--client", addresses, "--seconds", str(seconds)]
            start = time.monotonic() + 5.0
            command += ["--slot", str(slot), "--start", str(start)]
            command += ["--rate", str(rate / clients)] if rate > 0 else []
            processes = _spawn(command, clients)
            # The clients connect and warm up, then all start at `start`. Each server's CPU is
            # read at every slot's end (and a little after, for the pairs still in flight): what
            # it used in its own slots is its driven CPU, in the others' its idle CPU.
            driven, idle = [0.0] * len(SHAPES), [0.0] * len(SHAPES)
            switched = [each.switches() for each in served]
            boundaries = [start + j * slot for j in range(round(seconds / slot) + 1)]
            time.sleep(max(0.0, boundaries[0] - time.monotonic()))
            last = [_run_time(each.pids[0]) for each in served]
            for j, boundary in enumerate(boundaries[1:]):
                time.sleep(max(0.0, boundary + 0.01 - time.monotonic()))
                now = [_run_time(each.pids[0]) for each in served]
                for i in range(len(SHAPES)):
                    (driven if i == j % len(SHAPES) else idle)[i] += now[i] - last[i]
                last = now
            pairs = [0] * len(SHAPES)
            for process in processes:
                out, _ = process.communicate(timeout=seconds + 120)
                for i, done in enumerate(out.split()[: len(SHAPES)]):
                    pairs[i] += int(done)
            woken = [each.switches() - w for each, w in zip(served, switched, strict=True)]
        finally:
            for each in served:
                each.stop()
        share = seconds / len(SHAPES)  # each shape's seconds of slots
        for i, p in enumerate(SHAPES):
            count = max(1, pairs[i])
            found.setdefault(p, []).append(
                (pairs[i] / share, driven[i] / count, woken[i] / count, idle[i] / (seconds - share))
            )
    base = found[1]
    print(f"{'P':>2} {'pairs/s in its slots':>21} {'server us/pair':>15} {'vs P=1':>7} {'paired':>7} "
          f"{'server switches/pair':>21} {'idle CPU %':>11}")  # fmt: skip
    for p, rows in found.items():
        cpu = statistics.median(c for _, c, _, _ in rows)
        paired = statistics.median(c / b[1] for (_, c, _, _), b in zip(rows, base, strict=True))
        print(
            f"{p:>2} {statistics.median(r for r, _, _, _ in rows):>21.0f} {cpu * 1e6:>15.0f} "
            f"{cpu / statistics.median(c for _, c, _, _ in base):>7.2f} {paired:>7.2f} "
            f"{statistics.median(w for _, _, w, _ in rows):>21.2f} "
            f"{statistics.median(i for *_, i in rows) * 100:>11.1f}"
        )
    print("(server us/pair: its CPU in its own slots; idle CPU: in the others', % of a core)")


# ---------------------------------------------------------------- b. fan-out latency

CASES = ("read_any", "read_none", "count", "read_routed")


def _time_case(space: outrig.Space, case: str, calls: int) -> list[float]:
    samples = []
    for i in range(calls):
        began = time.perf_counter()
        if case == "read_any":
            space.read_nowait(Job())
        elif case == "read_none":
            space.read_nowait(Job(n=-1))
        elif case == "count":
            space.count(Job())
        else:
            space.read_nowait(Job(region=REGIONS[i % len(REGIONS)]))
        samples.append(time.perf_counter() - began)
    return samples


def part_b(workdir: Path, rounds: int, entries: int, calls: int) -> None:
    print(f"\nb. fan-out latency, {entries} entries per space, {calls} calls a case a round, {rounds} rounds")
    server = _start(workdir)
    try:
        spaces = {p: outrig.connect(server.address, space=f"p{p}" if p > 1 else "p1") for p in SHAPES}
        for space in spaces.values():
            space.write_many(
                [Job(region=REGIONS[i % len(REGIONS)], n=i) for i in range(entries)], lease=3600.0
            )
        samples: dict[tuple[int, str], list[float]] = {}
        for _ in range(rounds):
            for p in SHAPES:
                for case in CASES:
                    _time_case(spaces[p], case, 20)  # warm
                    samples.setdefault((p, case), []).append(
                        statistics.median(_time_case(spaces[p], case, calls))
                    )
        print(f"{'case':<12} {'P':>2} {'median us':>10} {'worst us':>9} {'vs P=1':>7}")
        for case in CASES:
            base = statistics.median(samples[(1, case)])
            for p in SHAPES:
                rounds_medians = samples[(p, case)]
                median = statistics.median(rounds_medians)
                spread = max(rounds_medians)
                print(f"{case:<12} {p:>2} {median * 1e6:>10.0f} {spread * 1e6:>9.0f} {median / base:>7.2f}")
        print("(worst: the slowest round's median; every partition is on this one server)")
        for space in spaces.values():
            space.close()
    finally:
        server.stop()


# ---------------------------------------------------------------- c. blocking take


def _parked(space: outrig.Space, at_least: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while space.describe().waiters < at_least:
        if time.monotonic() > deadline:
            raise RuntimeError("the takers did not park")
        time.sleep(0.005)


def _taker(
    address: str,
    name: str,
    stop: threading.Event,
    lock: threading.Lock,
    taken: list[int],
    latencies: list[float],
) -> None:
    with outrig.connect(address, space=name) as mine:
        while not stop.is_set():
            job = mine.take(Job(), timeout=0.5)
            if isinstance(job, Job) and job.n is not None and job.written is not None:
                done = time.monotonic()
                with lock:
                    taken.append(job.n)
                    latencies.append(done - job.written)


def part_c(workdir: Path, rounds: int, entries: int) -> None:
    print(f"\nc. blocking take without the routing field: 10 takers, {entries} entries, {rounds} rounds")
    server = _start(workdir)
    try:
        results: dict[int, list[tuple[float, float, bool]]] = {}
        for _ in range(rounds):
            for p in (1, 4):
                name = f"p{p}"
                taken: list[int] = []
                latencies: list[float] = []
                lock = threading.Lock()
                stop = threading.Event()

                args = (server.address, name, stop, lock, taken, latencies)
                threads = [threading.Thread(target=_taker, args=args) for _ in range(10)]
                for thread in threads:
                    thread.start()
                with outrig.connect(server.address, space=name) as writer:
                    for i in range(entries):
                        _parked(writer, 10 * p if i == 0 else 1)
                        writer.write(Job(region=REGIONS[i % len(REGIONS)], n=i, written=time.monotonic()))
                        deadline = time.monotonic() + 30
                        while len(taken) <= i and time.monotonic() < deadline:
                            time.sleep(0.0005)
                    stop.set()
                    for thread in threads:
                        thread.join()
                    left = writer.count(Job())
                exact = sorted(taken) == list(range(entries)) and left == 0
                median, p99 = _quantiles(latencies)
                results.setdefault(p, []).append((median, p99, exact))
        base = statistics.median(m for m, _, _ in results[1])
        print(f"{'P':>2} {'wake median ms':>15} {'p99 ms':>8} {'vs P=1':>7} {'exactly once':>13}")
        for p, rows in results.items():
            median = statistics.median(m for m, _, _ in rows)
            p99 = statistics.median(q for _, q, _ in rows)
            exact = all(e for _, _, e in rows)
            verdict = "yes" if exact else "NO"
            print(f"{p:>2} {median * 1e3:>15.2f} {p99 * 1e3:>8.2f} {median / base:>7.2f} {verdict:>13}")
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--part", choices=["a", "b", "c"])
    parser.add_argument("--seconds", type=float)
    parser.add_argument("--clients", type=int)
    parser.add_argument("--client", help=argparse.SUPPRESS)  # a client process of part a
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--tasks", type=int, default=10, help=argparse.SUPPRESS)
    parser.add_argument("--one-partition", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--one-worker", action="store_true", help="part a: only the shapes on one worker")
    parser.add_argument(
        "--pin", action="store_true", help="part a: the servers on the first core, the clients on the others"
    )
    parser.add_argument(
        "--rate", type=float, default=0.0, help="part a: cap the offered load at this many pairs/s in all"
    )
    parser.add_argument(
        "--slot",
        type=float,
        default=0.0,
        help="part a: serve the one-worker shapes at once, the clients switching every SLOT seconds",
    )
    parser.add_argument("--start", type=float, default=0.0, help=argparse.SUPPRESS)
    parser.add_argument("--rounds", type=int)
    parser.add_argument("--entries", type=int)
    args = parser.parse_args()
    if args.pin:
        global _CLIENT_CORES
        _CLIENT_CORES = set(range(1, os.cpu_count() or 2))
    if args.client and args.slot:
        counts = asyncio.run(
            _client_slots(
                args.client.split(","), args.start, args.seconds, args.slot, args.tasks, args.seed, args.rate
            )
        )
        print(*counts, _children_cpu(os.getpid()))
        return
    if args.client:
        regions = _regions_of(0, 2) if args.one_partition else REGIONS
        pairs = asyncio.run(
            _client_pairs(args.client, args.seconds, args.tasks, args.seed, regions, args.rate)
        )
        print(pairs, _children_cpu(os.getpid()))
        return
    rounds = args.rounds or (3 if args.quick else 5)
    print(f"cores: {os.cpu_count()}, load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    with tempfile.TemporaryDirectory(prefix="outrig-bench-partitions-") as work:
        workdir = Path(work)
        if args.part in (None, "a") and args.slot:
            part_a_slots(workdir, rounds, args.seconds or 24.0, args.clients or 2, args.slot, args.rate)
        elif args.part in (None, "a"):
            part_a(
                workdir,
                rounds,
                args.seconds or (3.0 if args.quick else 8.0),
                args.clients or 3,
                args.one_worker,
                args.rate,
            )
        if args.part in (None, "b"):
            part_b(
                workdir, rounds, args.entries or (1000 if args.quick else 10_000), 100 if args.quick else 300
            )
        if args.part in (None, "c"):
            part_c(workdir, rounds, args.entries or (50 if args.quick else 200))


if __name__ == "__main__":
    main()
