"""What a take with an acknowledgement deadline costs, and how punctual its redelivery is.

    python bench/acks.py [--quick] [--seconds S] [--rounds N] [--redeliveries N]

Three steps, each moving one job through the space, against a fresh `outrig serve` per round,
in memory (``--in-memory``) and durable (``--data-dir``, ``--durability always``):

- take: write a job, take it (2 calls);
- ack: write a job, take it with ``ack=30``, ack the delivery (3 calls);
- transaction: write a job; begin, take it under the transaction, commit (4 calls): the
  JavaSpaces way to the same guarantee;
- settled: write a job, take it with ``ack=30`` and ``settle=`` the worker's previous delivery
  (2 calls: the take acknowledges the last job, as `Space.deliveries` does);
- batch: write 10 jobs (10 calls), take them with one ``take_many(ack=30)`` and acknowledge them
  with one `Space.ack_many` (12 calls for 10 jobs).

Each is driven by 1 blocking client and by 10 asyncio tasks on one connection (each task with
its own key, so that it takes its own jobs). Within a round the steps run one after the other
against the same server, their order rotating each round; the figures are medians of jobs per
second over the rounds, and the ratios are costs against the plain take of the same round
(time per job: take's rate / the step's rate; the issue's target for ack, settled and batch is
<= 1.3).

Last, redelivery: a job is delivered with a deadline of 0.3 s and never acked, while a second
client waits in a blocking take with ack; the latency is when that taker got the job minus the
first delivery's deadline (both read from this machine's clock: server and client share it).
Each sample starts at a random moment (0 to 0.5 s after the last), so that the deadlines fall
anywhere between two of the reaper's periodic passes (``reap_interval``, 0.5 s by default); a
third server, in memory with ``reap_interval = 0.05``, shows whether that interval bounds a
redelivery (it did until the reaper learnt to wake for the soonest deadline). Prints the core
count and load average. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from servers import ServerProcess, start_durable_outrig, start_outrig, start_outrig_with

import outrig
import outrig.aio

SPACE = "bench-acks"
TASKS = 10
WAIT = 5.0
REDELIVERY_DEADLINE = 0.3
BATCH = 10

#: Each settling worker's last delivery, by its space and key: its next take acknowledges it.
_previous: dict[tuple[int, int], outrig.Delivery | outrig.aio.AsyncDelivery] = {}


@dataclass
class Job(outrig.Entry, type_name="bench.AckJob"):
    key: int | None = None
    n: int | None = None


def _take(space: outrig.Space, key: int, n: int) -> None:
    space.write(Job(key=key, n=n))
    if space.take(Job(key=key), timeout=WAIT) is None:
        raise RuntimeError("take: the job just written was not there")


def _ack(space: outrig.Space, key: int, n: int) -> None:
    space.write(Job(key=key, n=n))
    delivery = space.take(Job(key=key), timeout=WAIT, ack=30.0)
    if delivery is None:
        raise RuntimeError("ack: the job just written was not there")
    delivery.ack()


def _transaction(space: outrig.Space, key: int, n: int) -> None:
    space.write(Job(key=key, n=n))
    with space.transaction() as txn:
        if txn.take(Job(key=key), timeout=WAIT) is None:
            raise RuntimeError("transaction: the job just written was not there")


async def _take_async(space: outrig.aio.AsyncSpace, key: int, n: int) -> None:
    await space.write(Job(key=key, n=n))
    if await space.take(Job(key=key), timeout=WAIT) is None:
        raise RuntimeError("take: the job just written was not there")


async def _ack_async(space: outrig.aio.AsyncSpace, key: int, n: int) -> None:
    await space.write(Job(key=key, n=n))
    delivery = await space.take(Job(key=key), timeout=WAIT, ack=30.0)
    if delivery is None:
        raise RuntimeError("ack: the job just written was not there")
    await delivery.ack()


async def _transaction_async(space: outrig.aio.AsyncSpace, key: int, n: int) -> None:
    await space.write(Job(key=key, n=n))
    async with space.transaction() as txn:
        if await txn.take(Job(key=key), timeout=WAIT) is None:
            raise RuntimeError("transaction: the job just written was not there")


def _settled(space: outrig.Space, key: int, n: int) -> None:
    space.write(Job(key=key, n=n))
    previous = _previous.pop((id(space), key), None)
    assert not isinstance(previous, outrig.aio.AsyncDelivery)
    delivery = space.take(Job(key=key), timeout=WAIT, ack=30.0, settle=previous)
    if delivery is None:
        raise RuntimeError("settled: the job just written was not there")
    _previous[(id(space), key)] = delivery


def _batch(space: outrig.Space, key: int, n: int) -> int:
    for i in range(BATCH):
        space.write(Job(key=key, n=n * BATCH + i))
    deliveries = space.take_many(Job(key=key), max_entries=BATCH, timeout=WAIT, ack=30.0)
    if len(deliveries) != BATCH or any(space.ack_many(deliveries)):
        raise RuntimeError(f"batch: took {len(deliveries)} of {BATCH} jobs, or an ack failed")
    return BATCH


async def _settled_async(space: outrig.aio.AsyncSpace, key: int, n: int) -> None:
    await space.write(Job(key=key, n=n))
    previous = _previous.pop((id(space), key), None)
    assert not isinstance(previous, outrig.Delivery)
    delivery = await space.take(Job(key=key), timeout=WAIT, ack=30.0, settle=previous)
    if delivery is None:
        raise RuntimeError("settled: the job just written was not there")
    _previous[(id(space), key)] = delivery


async def _batch_async(space: outrig.aio.AsyncSpace, key: int, n: int) -> int:
    for i in range(BATCH):
        await space.write(Job(key=key, n=n * BATCH + i))
    deliveries = await space.take_many(Job(key=key), max_entries=BATCH, timeout=WAIT, ack=30.0)
    if len(deliveries) != BATCH or any(await space.ack_many(deliveries)):
        raise RuntimeError(f"batch: took {len(deliveries)} of {BATCH} jobs, or an ack failed")
    return BATCH


def _settle_leftovers(space: outrig.Space) -> None:
    """Acknowledge what settling workers left pending (outside the timing)."""
    for place in [place for place in _previous if place[0] == id(space)]:
        delivery = _previous.pop(place)
        assert isinstance(delivery, outrig.Delivery)
        delivery.ack()


async def _settle_leftovers_async(space: outrig.aio.AsyncSpace) -> None:
    for place in [place for place in _previous if place[0] == id(space)]:
        delivery = _previous.pop(place)
        assert isinstance(delivery, outrig.aio.AsyncDelivery)
        await delivery.ack()


STEPS: dict[str, tuple[Callable[..., int | None], Callable[..., Awaitable[int | None]]]] = {
    "take": (_take, _take_async),
    "ack": (_ack, _ack_async),
    "transaction": (_transaction, _transaction_async),
    "settled": (_settled, _settled_async),
    "batch": (_batch, _batch_async),
}
#: The shapes of takes with ack (their costs against take are the issue's target).
ACKED = ("ack", "settled", "batch")


def _sync_rate(address: str, step: str, seconds: float) -> float:
    work = STEPS[step][0]
    with outrig.connect(address, space=SPACE) as space:
        for n in range(50):  # warm-up
            work(space, 0, n)
        done, calls, began = 0, 0, time.perf_counter()
        while time.perf_counter() - began < seconds:
            done += work(space, 0, calls) or 1
            calls += 1
        rate = done / (time.perf_counter() - began)
        _settle_leftovers(space)
        return rate


async def _async_rate(address: str, step: str, seconds: float) -> float:
    work = STEPS[step][1]
    async with outrig.aio.connect(address, space=SPACE) as space:
        await asyncio.gather(*(work(space, key, -1) for key in range(TASKS)))  # warm-up
        end = time.perf_counter() + seconds

        async def loop(key: int) -> int:
            done, calls = 0, 0
            while time.perf_counter() < end:
                done += await work(space, key, calls) or 1
                calls += 1
            return done

        began = time.perf_counter()
        counts = await asyncio.gather(*(loop(key) for key in range(TASKS)))
        rate = sum(counts) / (time.perf_counter() - began)
        await _settle_leftovers_async(space)
        return rate


def _redelivery_latencies(address: str, count: int) -> list[float]:
    """Seconds from each first delivery's deadline to when a parked taker got the job again."""
    latencies = []
    with outrig.connect(address, space=SPACE) as space, outrig.connect(address, space=SPACE) as other:
        for n in range(count):
            time.sleep(random.uniform(0.0, 0.5))  # a deadline anywhere between two reaper passes
            space.write(Job(key=-1, n=n))
            first = space.take(Job(key=-1), timeout=WAIT, ack=REDELIVERY_DEADLINE)
            if first is None:
                raise RuntimeError("redelivery: the job just written was not there")
            got: list[tuple[float, outrig.Delivery | None]] = []

            def wait_for_it(got: list[tuple[float, outrig.Delivery | None]] = got) -> None:
                again = other.take(Job(key=-1), timeout=WAIT, ack=30.0)
                got.append((time.time(), again))

            taker = threading.Thread(target=wait_for_it)
            taker.start()
            taker.join()
            ((at, again),) = got
            if again is None or again.deliveries != 2:
                raise RuntimeError(f"redelivery: the parked taker got {again!r}")
            again.ack()
            latencies.append(at - first.deadline)
    return latencies


Starter = Callable[[Path], ServerProcess]
SERVERS: dict[str, Starter] = {"in memory": start_outrig, "durable": start_durable_outrig}
FAST_REAPER = "in memory, reap_interval 0.05"


def _start_fast_reaper(workdir: Path) -> ServerProcess:
    config = workdir / "reaper.toml"
    config.write_text("reap_interval = 0.05\n")
    return start_outrig_with(workdir, "--in-memory", "--config", str(config), "--log-level", "WARNING")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="1 round of 1 s runs, 5 redeliveries")
    parser.add_argument("--seconds", type=float, default=3.0, help="seconds per run (3)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds (5)")
    parser.add_argument("--redeliveries", type=int, default=20, help="redeliveries timed per round (20)")
    args = parser.parse_args()
    seconds, rounds, redeliveries = (
        (1.0, 1, 5) if args.quick else (args.seconds, args.rounds, args.redeliveries)
    )
    print(f"cores={os.cpu_count()} load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    clients = ("1 client", f"{TASKS} tasks")
    rates: dict[tuple[str, str, str], list[float]] = {}
    costs: dict[tuple[str, str, str], list[float]] = {}
    latencies: dict[str, list[float]] = {kind: [] for kind in (*SERVERS, FAST_REAPER)}
    steps = list(STEPS)
    loop = asyncio.new_event_loop()  # one loop for every asyncio run: grpc.aio binds to the first
    with tempfile.TemporaryDirectory(prefix="outrig-bench-acks-") as root:
        for round_number in range(rounds):
            order = steps[round_number % len(steps) :] + steps[: round_number % len(steps)]
            for kind, start in SERVERS.items():
                server = start(Path(tempfile.mkdtemp(dir=root)))
                try:
                    for client in clients:
                        measured = {}
                        for step in order:
                            if client == "1 client":
                                measured[step] = _sync_rate(server.address, step, seconds)
                            else:
                                measured[step] = loop.run_until_complete(
                                    _async_rate(server.address, step, seconds)
                                )
                        for step, rate in measured.items():
                            rates.setdefault((kind, client, step), []).append(rate)
                            costs.setdefault((kind, client, step), []).append(measured["take"] / rate)
                    latencies[kind] += _redelivery_latencies(server.address, redeliveries)
                finally:
                    server.stop()
            fast = _start_fast_reaper(Path(tempfile.mkdtemp(dir=root)))
            try:
                latencies[FAST_REAPER] += _redelivery_latencies(fast.address, redeliveries)
            finally:
                fast.stop()
    loop.close()
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"{rounds} rounds of {seconds:g} s per run; jobs per second, medians (min - max)")
    print()
    print("| server | clients | step | jobs/s | cost vs take (time per job) |")
    print("|---|---|---|---|---|")
    for kind in SERVERS:
        for client in clients:
            for step in steps:
                values = rates[(kind, client, step)]
                cost = statistics.median(costs[(kind, client, step)])
                print(
                    f"| {kind} | {client} | {step} | {statistics.median(values):,.0f} "
                    f"({min(values):,.0f} - {max(values):,.0f}) | {cost:.2f} |"
                )
    print()
    print(f"redelivery after a {REDELIVERY_DEADLINE:g} s deadline, to a parked taker: got - deadline, ms")
    print()
    print("| server | redeliveries | median | p90 | min | max |")
    print("|---|---|---|---|---|---|")
    for kind, values in latencies.items():
        ms = sorted(v * 1000 for v in values)
        p90 = ms[min(len(ms) - 1, int(0.9 * len(ms)))]
        print(
            f"| {kind} | {len(ms)} | {statistics.median(ms):.1f} | {p90:.1f} | {ms[0]:.1f} | {ms[-1]:.1f} |"
        )
    parts = []
    for kind in SERVERS:
        for client in clients:
            figures = " ".join(
                f"{step}={statistics.median(costs[(kind, client, step)]):.2f}"
                for step in (*ACKED, "transaction")
            )
            parts.append(f"{kind.replace(' ', '_')}/{client.replace(' ', '_')}: {figures}")
    summary = " ".join(parts)
    print()
    print(f"costs vs take: {summary}")


if __name__ == "__main__":
    main()
