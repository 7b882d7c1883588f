"""What the change log costs and gives (issue 24), each figure against a baseline of the same run:

    python bench/changes.py [--quick] [--rounds N] [--away S] [--only write|replay|fanout]

- write: durable write+take pairs per second (4 client threads, `durability = always`), the log
  on against off (`[space_defaults] changes = false`): the cost ratio off/on (target <= 1.1);
  and the store's bytes per change: 20,000 writes and their takes (40,000 changes) on fresh data
  dirs, the data dir's size with the log less without, over the changes (and what retention
  counts, describe's bytes / count).
- replay: a subscriber away for S seconds (default 10) while 10,000 matching writes happen
  (write_many of 100) gets all 10,000 on resume, in order, none twice (checked); the replay rate
  (events/s reading them back) against the live rate (events/s a connected subscriber sees while
  the same writes happen, which the writer bounds: its own rate is printed too).
- fanout: 100 subscribers on one space (asyncio, spread over 4 connections), 1,000 writes
  (write_many of 50): events/s delivered and the server's CPU per event, `Changes` streams
  against the same number of `notify` registrations (the baseline).

Every configuration runs on a fresh durable `outrig serve` process, the cases interleaved within
each round (their order alternating), medians over rounds with min and max. Prints the core count
and the load average; asserts only what a run must deliver (every event, in order).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import shutil
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import grpc
from servers import ServerProcess, start_outrig_with

import outrig
import outrig.aio

_OWN_CONNECTION = [("grpc.use_local_subchannel_pool", 1)]


@dataclass
class Job(outrig.Entry, type_name="bench.Job"):
    client: int | None = None
    n: int | None = None
    note: str | None = None


class Server:
    """A fresh durable `outrig serve`, the change log on or off for every space."""

    def __init__(self, root: Path, *, log: bool) -> None:
        self.workdir = Path(tempfile.mkdtemp(prefix="outrig-bench-changes-", dir=root))
        config = self.workdir / "outrig.toml"
        config.write_text(
            f"[space_defaults]\nchanges = {'true' if log else 'false'}\nmax_entries = 1000000\n"
        )
        self.data = self.workdir / "data"
        self.process: ServerProcess = start_outrig_with(
            self.workdir, "--data-dir", str(self.data), "--config", str(config), "--log-level", "WARNING"
        )
        self.address = self.process.address

    def size(self) -> int:
        return sum(p.stat().st_size for p in self.data.rglob("*") if p.is_file())

    def close(self) -> None:
        self.process.stop()
        shutil.rmtree(self.workdir, ignore_errors=True)


def _median(samples: list[float]) -> str:
    return f"{statistics.median(samples):,.0f} (min {min(samples):,.0f}, max {max(samples):,.0f})"


# ---------------------------------------------------------------- write cost


def _pairs(address: str, seconds: float, clients: int = 4) -> float:
    counts = [0] * clients
    start = threading.Barrier(clients)
    failures: list[BaseException] = []

    def client(number: int) -> None:
        try:
            with outrig.connect(address, space="bench", options=_OWN_CONNECTION) as space:
                space.count(Job(client=number))
                start.wait()
                end = time.monotonic() + seconds
                n = 0
                while time.monotonic() < end:
                    space.write(Job(client=number, n=n, note="x" * 32), lease=60.0)
                    if space.take(Job(client=number), timeout=10.0) is None:
                        raise RuntimeError("a take found nothing")
                    n += 1
                counts[number] = n
        except BaseException as err:
            failures.append(err)
            start.abort()

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if failures:
        raise failures[0]
    return sum(counts) / seconds


def _store_bytes(root: Path, log: bool, count: int) -> tuple[int, float]:
    """The data dir's size after `count` writes and their takes; and describe's bytes per change."""
    server = Server(root, log=log)
    try:
        with outrig.connect(server.address, space="bytes") as space:
            for start in range(0, count, 500):
                space.write_many([Job(n=n, note="x" * 32) for n in range(start, start + 500)], lease=600)
            while space.take_many(Job(), max_entries=500, timeout=0):
                pass
            described = space.describe().change_log
            per = described.bytes / described.count if described is not None and described.count else 0.0
    finally:
        server.process.stop()
    size = server.size()
    shutil.rmtree(server.workdir, ignore_errors=True)
    return size, per


def bench_write(root: Path, rounds: int, seconds: float) -> None:
    rates: dict[bool, list[float]] = {True: [], False: []}
    for round_number in range(rounds):
        for log in (True, False) if round_number % 2 == 0 else (False, True):
            server = Server(root, log=log)
            try:
                rates[log].append(_pairs(server.address, seconds))
            finally:
                server.close()
    on, off = statistics.median(rates[True]), statistics.median(rates[False])
    print("durable write+take pairs/s, 4 client threads:")
    print(f"  log on:  {_median(rates[True])}")
    print(f"  log off: {_median(rates[False])}")
    print(f"  write cost with the log (off/on): {off / on:.3f} (target <= 1.1)")
    count = 20_000
    with_log, per = _store_bytes(root, True, count)
    without, _ = _store_bytes(root, False, count)
    print(
        f"store: {with_log:,} bytes with the log, {without:,} without, for {count:,} writes and their "
        f"takes: {(with_log - without) / (2 * count):.0f} bytes per change on disk; retention counts "
        f"{per:.0f} bytes per change (payload + 64)"
    )


# ---------------------------------------------------------------- replay after an absence


def _write_burst(space: outrig.Space, count: int, first: int = 0) -> float:
    began = time.perf_counter()
    for start in range(first, first + count, 100):
        space.write_many([Job(n=n, note="burst") for n in range(start, start + 100)], lease=600)
    return count / (time.perf_counter() - began)


def bench_replay(root: Path, rounds: int, away: float, count: int = 10_000) -> None:
    replay: list[float] = []
    live: list[float] = []
    writer_rates: list[float] = []
    for round_number in range(rounds):
        server = Server(root, log=True)
        try:
            with outrig.connect(server.address, space=f"replay{round_number}") as space:
                cases: list[Callable[[], None]] = []

                def absent(space: outrig.Space = space) -> None:
                    with space.changes(Job()) as stream:
                        cursor = stream.cursor
                    left = time.monotonic()
                    first = space.count(Job())
                    _write_burst(space, count, first)
                    time.sleep(max(0.0, away - (time.monotonic() - left)))  # away this long in all
                    began = time.perf_counter()
                    with space.changes(Job(), since=cursor) as stream:
                        numbers = [next(stream).entry.n for _ in range(count)]  # type: ignore[union-attr]
                    replay.append(count / (time.perf_counter() - began))
                    if numbers != list(range(first, first + count)):
                        raise AssertionError("the replay missed, repeated or reordered changes")

                def connected(space: outrig.Space = space) -> None:
                    first = space.count(Job())
                    with space.changes(Job()) as stream:
                        rates: list[float] = []
                        writer = threading.Thread(
                            target=lambda: rates.append(_write_burst(space, count, first))
                        )
                        began = time.perf_counter()
                        writer.start()
                        numbers = [next(stream).entry.n for _ in range(count)]  # type: ignore[union-attr]
                        live.append(count / (time.perf_counter() - began))
                        writer.join()
                        writer_rates.extend(rates)
                    if numbers != list(range(first, first + count)):
                        raise AssertionError("the live stream missed, repeated or reordered changes")

                cases = [absent, connected] if round_number % 2 == 0 else [connected, absent]
                for case in cases:
                    case()
        finally:
            server.close()
    print(f"a subscriber away {away:g} s while {count:,} writes happen (all received in order, none twice):")
    print(f"  replay on resume: {_median(replay)} events/s")
    print(
        f"  live, connected:  {_median(live)} events/s (the writer alone: {_median(writer_rates)} writes/s)"
    )
    print(f"  replay / live: {statistics.median(replay) / statistics.median(live):.2f}")


# ---------------------------------------------------------------- 100 subscribers


async def _fanout(address: str, kind: str, subscribers: int, writes: int) -> tuple[float, float]:
    spaces = [
        await outrig.aio.connect(address, space="fan", options=_OWN_CONNECTION).__aenter__() for _ in range(4)
    ]
    try:
        streams = []
        for i in range(subscribers):
            space = spaces[i % len(spaces)]
            stream = space.changes(Job()) if kind == "changes" else space.notify(Job(), lease=600)
            streams.append(await stream.__aenter__())
        done = asyncio.Event()
        left = [subscribers]

        async def consume(stream: object) -> None:
            for _ in range(writes):
                await anext(stream)  # type: ignore[call-overload]
            left[0] -= 1
            if not left[0]:
                done.set()

        consumers = [asyncio.ensure_future(consume(stream)) for stream in streams]
        began = time.perf_counter()
        for start in range(0, writes, 50):
            await spaces[0].write_many([Job(n=n) for n in range(start, start + 50)], lease=600)
        await asyncio.wait_for(done.wait(), 300)
        elapsed = time.perf_counter() - began
        for consumer in consumers:
            consumer.cancel()
        for stream in streams:
            await stream.close()
        return subscribers * writes / elapsed, elapsed
    finally:
        for space in spaces:
            await space.close()


def bench_fanout(root: Path, rounds: int, subscribers: int = 100, writes: int = 1_000) -> None:
    rates: dict[str, list[float]] = {"changes": [], "notify": []}
    cpu: dict[str, list[float]] = {"changes": [], "notify": []}
    for round_number in range(rounds):
        for kind in ("changes", "notify") if round_number % 2 == 0 else ("notify", "changes"):
            server = Server(root, log=True)
            try:
                before = server.process.cpu_seconds()
                rate, _ = asyncio.run(_fanout(server.address, kind, subscribers, writes))
                used = server.process.cpu_seconds() - before
                rates[kind].append(rate)
                cpu[kind].append(used / (subscribers * writes) * 1e6)
            finally:
                server.close()
    print(f"{subscribers} subscribers on one space, {writes:,} writes (write_many of 50):")
    for kind in ("changes", "notify"):
        label = "Changes streams" if kind == "changes" else "notify (baseline)"
        print(
            f"  {label}: {_median(rates[kind])} events/s delivered; server CPU "
            f"{statistics.median(cpu[kind]):.1f} us per event "
            f"(min {min(cpu[kind]):.1f}, max {max(cpu[kind]):.1f})"
        )
    ratio = statistics.median(rates["changes"]) / statistics.median(rates["notify"])
    per = statistics.median(cpu["changes"]) / statistics.median(cpu["notify"])
    print(f"  changes / notify: events/s {ratio:.2f}, CPU per event {per:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="a smoke run: 1 round, short runs, 1 s away")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=3.0, help="seconds per write-cost run")
    parser.add_argument("--away", type=float, default=10.0, help="seconds the subscriber is away")
    parser.add_argument("--only", choices=("write", "replay", "fanout"))
    parser.add_argument("--data-root", type=Path, default=Path(tempfile.gettempdir()))
    args = parser.parse_args()
    rounds, seconds, away = args.rounds, args.seconds, args.away
    if args.quick:
        rounds, seconds, away = 1, 1.0, 1.0
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(
        f"outrig change log bench: {os.cpu_count()} cores, Python {platform.python_version()}, "
        f"grpcio {grpc.__version__}; {rounds} rounds; load average {load}",
        flush=True,
    )
    if args.only in (None, "write"):
        bench_write(args.data_root, max(rounds, 2) if not args.quick else 2, seconds)
    if args.only in (None, "replay"):
        bench_replay(args.data_root, rounds, away)
    if args.only in (None, "fanout"):
        bench_fanout(args.data_root, max(rounds, 2) if not args.quick else 2)
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
