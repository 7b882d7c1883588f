"""What durability costs: write+take pairs per second, durable vs in-memory, 1 and 10 clients.

    python bench/durability.py [--quick] [--seconds S] [--data-root DIR]

Each run starts a fresh `outrig serve` process in one of three configurations:
  - in-memory: ``--in-memory``, nothing is stored;
  - durable:   ``--data-dir`` with ``--durability always`` (the default): every write and take is
               committed to SQLite, fsync included, before the reply (group commit batches the
               changes that arrive together);
  - interval:  ``--data-dir --durability interval``: replies at once, commits every 20 ms;
and runs clients that each loop "write an entry, take it back" (a template with the client's
number set) through the blocking SDK. One pair is two calls and two durable changes.

10 clients are 10 threads, each with its own connection (a local subchannel pool, so really 10
TCP connections). Threads rather than the asyncio client with 10 tasks so that the 1- and 10-client
rows run the very same client code and differ only in concurrency; side by side on the 2-core
machine where this was written, the two client styles gave the same pairs/s within the noise.

Runs are interleaved: each round runs every configuration twice, in an order rotated per round;
the figure is the median over rounds x runs, with min and max. The ratios compare each durable
configuration with in-memory at the same client count. Prints the core count, versions, the file
system of the data dirs (fsync on tmpfs costs nothing) and the load average (a busy machine shows
as a wide min-max). Nothing is asserted.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import shutil
import statistics
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import grpc
from google import protobuf
from servers import start_outrig_with

import outrig

# Each client gets its own TCP connection, not a channel on a shared one.
_STORE_CLOSED = re.compile(r"store closed: (.*)")
_OWN_CONNECTION = [("grpc.use_local_subchannel_pool", 1)]
_COMMIT_INTERVAL_MS = 20


@dataclass
class Job(outrig.Entry, type_name="bench.Job"):
    client: int | None = None
    n: int | None = None
    note: str | None = None


@dataclass(frozen=True)
class Configuration:
    name: str
    label: str
    flags: tuple[str, ...]
    durable: bool


CONFIGURATIONS = (
    Configuration("memory", "in-memory", ("--in-memory",), durable=False),
    Configuration("durable", "durable (always)", (), durable=True),
    Configuration(
        "interval",
        f"interval ({_COMMIT_INTERVAL_MS} ms)",
        ("--durability", "interval", "--commit-interval-ms", str(_COMMIT_INTERVAL_MS)),
        durable=True,
    ),
)


class Server:
    """A fresh `outrig serve` process, with its own data dir if durable."""

    def __init__(self, configuration: Configuration, root: Path) -> None:
        self.workdir = Path(tempfile.mkdtemp(prefix=f"outrig-bench-{configuration.name}-", dir=root))
        flags = list(configuration.flags)
        if configuration.durable:
            flags += ["--data-dir", str(self.workdir / "data")]
        self._process = start_outrig_with(self.workdir, *flags)
        self.address = self._process.address

    def close(self) -> str:
        """Stop the server; return its group-commit statistics line (logged at close), if any."""
        self._process.stop()
        match = _STORE_CLOSED.search(self._process.log.read_text())
        shutil.rmtree(self.workdir, ignore_errors=True)
        return match.group(1) if match else ""


def _client(
    address: str, number: int, start: threading.Barrier, window: list[float], counts: list[int | Exception]
) -> None:
    """Write and take back entries until the window ends; count the pairs begun inside it."""
    template = Job(client=number)
    try:
        with outrig.connect(address, space="bench", options=_OWN_CONNECTION) as space:
            space.count(template)  # connect before the clock starts
            start.wait()
            warm, end = window
            n = done = 0
            while (now := time.monotonic()) < end:
                space.write(Job(client=number, n=n, note="x" * 32), lease=60.0)
                if space.take(template, timeout=10.0) is None:
                    raise RuntimeError("a take found nothing: the entry just written is gone")
                n += 1
                if now >= warm:
                    done += 1
            counts[number] = done
    except Exception as err:
        counts[number] = err
        start.abort()  # do not leave the others waiting at the barrier


def measure(
    configuration: Configuration, clients: int, seconds: float, warmup: float, root: Path
) -> tuple[float, str]:
    """Pairs per second over `seconds`, after `warmup`, against a fresh server; and the server's
    group-commit statistics."""
    server = Server(configuration, root)
    try:
        counts: list[int | Exception] = [0] * clients
        window = [0.0, 0.0]

        def go() -> None:  # the barrier's action: set the clock once every client is connected
            now = time.monotonic()
            window[:] = [now + warmup, now + warmup + seconds]

        start = threading.Barrier(clients, action=go)
        threads = [
            threading.Thread(target=_client, args=(server.address, i, start, window, counts))
            for i in range(clients)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        failed = [count for count in counts if isinstance(count, Exception)]
        failed.sort(key=lambda err: isinstance(err, threading.BrokenBarrierError))  # the cause first
        if failed:
            raise RuntimeError(
                f"{len(failed)} of {clients} clients failed ({configuration.label})"
            ) from failed[0]
        rate = sum(count for count in counts if isinstance(count, int)) / seconds
    finally:
        commits = server.close()
    return rate, commits


def _filesystem(path: Path) -> str:
    """The mount point and file system type that hold `path`."""
    best = ("/", "?")
    resolved = str(path.resolve())
    with open("/proc/mounts") as mounts:
        for line in mounts:
            _, mount, kind, *_ = line.split()
            inside = resolved == mount or resolved.startswith(mount.rstrip("/") + "/")
            if inside and len(mount) >= len(best[0]):
                best = (mount, kind)
    return f"{best[0]} ({best[1]})"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="a short smoke run: 1 round x 1 run of 1 s")
    parser.add_argument("--seconds", type=float, default=3.0, help="measured seconds per run (default 3)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--runs", type=int, default=2, help="runs per configuration per round")
    parser.add_argument(
        "--data-root", type=Path, default=Path(tempfile.gettempdir()), help="where data dirs go"
    )
    args = parser.parse_args()
    seconds, warmup, rounds, runs = args.seconds, 0.5, args.rounds, args.runs
    if args.quick:
        seconds, warmup, rounds, runs = 1.0, 0.2, 1, 1

    print(
        f"outrig durability bench: {os.cpu_count()} cores, Python {platform.python_version()}, "
        f"grpcio {grpc.__version__}, protobuf {protobuf.__version__}"
    )
    print(
        f"data dirs on {_filesystem(args.data_root)}; {rounds} rounds x {runs} runs of {seconds:g} s "
        f"(after {warmup:g} s warm-up) per configuration, a fresh server per run"
    )
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)

    results: dict[tuple[str, int], list[float]] = {}
    last_commits: dict[tuple[str, int], str] = {}
    for clients in (1, 10):
        for round_number in range(rounds):
            shift = round_number % len(CONFIGURATIONS)
            order = CONFIGURATIONS[shift:] + CONFIGURATIONS[:shift]
            for _ in range(runs):
                for configuration in order:
                    rate, commits = measure(configuration, clients, seconds, warmup, args.data_root)
                    if commits:
                        last_commits[(configuration.label, clients)] = commits
                    results.setdefault((configuration.name, clients), []).append(rate)
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print()

    medians = {key: statistics.median(samples) for key, samples in results.items()}

    def ratio(name: str, clients: int) -> str:
        return f"{medians[(name, clients)] / medians[('memory', clients)]:.2f}"

    print("| configuration | clients | pairs/s (median) | min | max | vs in-memory |")
    print("|---|---|---|---|---|---|")
    for clients in (1, 10):
        for configuration in CONFIGURATIONS:
            samples = results[(configuration.name, clients)]
            median = medians[(configuration.name, clients)]
            print(
                f"| {configuration.label} | {clients} | {median:,.0f} | {min(samples):,.0f} | "
                f"{max(samples):,.0f} | {ratio(configuration.name, clients)} |"
            )
    print()
    if last_commits:
        print("group commit, as the server logs it at close (last run of each; warm-up included):")
        for (label, clients), commits in last_commits.items():
            print(f"  {label}, {clients} client{'s' if clients > 1 else ''}: {commits}")
        print()
    print(f"interval_1={ratio('interval', 1)}; the target for durable_10 is >= 0.7")
    durable_1, durable_10, interval_10 = ratio("durable", 1), ratio("durable", 10), ratio("interval", 10)
    print(f"ratios: durable_1={durable_1} durable_10={durable_10} interval_10={interval_10}")


if __name__ == "__main__":
    main()
