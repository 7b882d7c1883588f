"""How long a durable server takes to restart with many entries in its store.

    python bench/recovery.py [--entries N] [--runs R] [--data-root DIR]

Fills a fresh data dir with N small entries (default 1,000,000; two int fields, leased forever)
through `write_many` in batches of 1,000 from a few client threads, stops the server cleanly, then
restarts it R times (default 3) on that dir and times each from process start to its
"outrig listening" line. Prints the median and every run, the store's files and sizes, the server's
own recovery log line ("recovered N entries ... in S s": the part spent loading the store), its
resident memory once listening, and how long its clean shutdown took. For the floor, it times
the start of a server on an empty data dir the same way.

The filling server remembers request ids for 5 s only (``--request-window 5``), so that the store
holds the entries rather than the fill's own request ids; the recovery line shows how many remained.
Nothing is asserted, except that the restarted server counts every entry.
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
from servers import ServerProcess, start_outrig_with

import outrig

# A server holding a million entries takes seconds to stop (see docs/performance.md).
_STOP_WITHIN = 120.0
_RECOVERED = re.compile(r"recovered .*")
BATCH = 1000
FILLERS = 4
SPACE = "bench"


@dataclass
class Small(outrig.Entry, type_name="bench.Small"):
    k: int | None = None
    group: int | None = None


def start(workdir: Path, data_dir: Path, config: Path, *flags: str) -> ServerProcess:
    """A durable `outrig serve` on `data_dir`; its startup_seconds run from Popen to listening."""
    return start_outrig_with(workdir, "--data-dir", str(data_dir), "--config", str(config), *flags)


def recovery_line(server: ServerProcess) -> str:
    match = _RECOVERED.search(server.log.read_text())
    return match.group(0) if match else "(no recovery line in the log)"


def fill(address: str, entries: int) -> None:
    """Write `entries` entries in batches of BATCH from FILLERS threads."""
    batches = iter(range(0, entries, BATCH))
    lock = threading.Lock()
    errors: list[BaseException] = []

    def filler() -> None:
        try:
            with outrig.connect(address, space=SPACE) as space:
                while True:
                    with lock:
                        first = next(batches, None)
                    if first is None:
                        return
                    last = min(first + BATCH, entries)
                    space.write_many(
                        [Small(k=k, group=k % 100) for k in range(first, last)], lease=outrig.FOREVER
                    )
        except BaseException as err:
            errors.append(err)

    threads = [threading.Thread(target=filler) for _ in range(FILLERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]


def _sizes(data_dir: Path) -> str:
    files = sorted(p for p in data_dir.iterdir() if p.name.startswith("outrig.db"))
    total = sum(p.stat().st_size for p in files)
    parts = ", ".join(f"{p.name} {p.stat().st_size / 2**20:,.1f} MiB" for p in files)
    return f"{total / 2**20:,.1f} MiB ({parts})"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--entries", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument(
        "--data-root", type=Path, default=Path(tempfile.gettempdir()), help="where the data dir goes"
    )
    args = parser.parse_args()
    entries: int = args.entries

    print(
        f"outrig recovery bench: {entries:,} entries, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}, grpcio {grpc.__version__}, protobuf {protobuf.__version__}",
        flush=True,
    )
    workdir = Path(tempfile.mkdtemp(prefix="outrig-recovery-", dir=args.data_root))
    try:
        config = workdir / "outrig.toml"
        # The default quota is 1,000,000 entries and 1 GiB per space; leave room above N.
        config.write_text(
            f"[space_defaults]\nmax_entries = {entries + 1}\nmax_bytes = {max(entries, 1) * 4096}\n"
        )
        data_dir = workdir / "data"
        empty_dir = workdir / "empty"

        floor = []
        for _ in range(args.runs):
            server = start(workdir, empty_dir, config)
            floor.append(server.startup_seconds)
            server.stop_cleanly(_STOP_WITHIN)
        print(f"start on an empty data dir (the floor): median {statistics.median(floor):.2f} s", flush=True)

        server = start(workdir, data_dir, config, "--request-window", "5")
        began = time.perf_counter()
        fill(server.address, entries)
        filled = time.perf_counter() - began
        print(
            f"filled in {filled:.1f} s ({entries / filled:,.0f} entries/s, write_many of {BATCH} "
            f"from {FILLERS} threads)",
            flush=True,
        )
        time.sleep(6)  # let the fill's request ids leave their window
        stopped = server.stop_cleanly(_STOP_WITHIN)
        print(f"stopped the filling server in {stopped:.2f} s; store: {_sizes(data_dir)}", flush=True)

        seconds = []
        for run in range(args.runs):
            server = start(workdir, data_dir, config)
            seconds.append(server.startup_seconds)
            rss = server.rss_bytes() / 2**20
            with outrig.connect(server.address, space=SPACE) as space:
                counted = space.count(Small())
            if counted != entries:
                raise RuntimeError(f"the restarted server holds {counted:,} entries, not {entries:,}")
            stopped = server.stop_cleanly(_STOP_WITHIN)
            print(
                f"run {run + 1}: listening after {server.startup_seconds:.2f} s, resident {rss:,.0f} MiB, "
                f"clean stop {stopped:.2f} s; log: {recovery_line(server)}",
                flush=True,
            )
        print(f"store after the runs: {_sizes(data_dir)}")
        print(
            f"restart with {entries:,} entries: median {statistics.median(seconds):.2f} s "
            f"(runs {', '.join(f'{s:.2f}' for s in seconds)}; floor {statistics.median(floor):.2f} s)"
        )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
