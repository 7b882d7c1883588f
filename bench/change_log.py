"""What the change log costs a write (issue 24): the log on against off, durable and in memory.

    python bench/change_log.py [--quick] [--seconds S] [--rounds N] [--tasks N]

Four `outrig serve` processes run side by side: in memory (``--in-memory``) and durable
(``--data-dir``, ``--durability always``), each with the change log on (the default) and with it
off (``changes = false`` under ``[space_defaults]``). In each round every server gets the same
load in turn, the order rotating each round: ``--tasks`` asyncio tasks on one connection, each
writing one small entry after another for ``--seconds``. The figures are medians over the rounds
of writes per second and of the server's CPU per write; the ratio is the cost of a write with the
log against without it, in the same round (rate off / rate on; the issue's target, durable, is
<= 1.1). Last, the bytes of log per change: in memory, what retention counts (payload + 64); on
disk, the pages of the SQLite tables of the log (dbstat) over its changes. Prints the core count
and load average. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sqlite3
import statistics
import tempfile
from dataclasses import dataclass
from pathlib import Path

from measure import Sample, Window, gather_counts, loop_async, tune_client
from servers import ServerProcess, _bench_flags, start_outrig_with

import outrig
import outrig.aio
from outrig.service.engine.changes import CHANGE_OVERHEAD
from outrig.v1 import space_pb2 as pb

SPACE = "bench-changes"


@dataclass
class Row(outrig.Entry, type_name="bench.ChangeRow"):
    n: int | None = None
    text: str | None = None


def _start(workdir: Path, durable: bool, log: bool) -> ServerProcess:
    name = f"{'durable' if durable else 'memory'}-log-{'on' if log else 'off'}"
    home = workdir / name
    home.mkdir()
    flags = _bench_flags(home)  # writes home/outrig.toml; add the log's setting to it
    config = home / "outrig.toml"
    if not log:
        config.write_text(config.read_text() + "changes = false\n")
    where = ["--data-dir", str(home / "data"), "--durability", "always"] if durable else ["--in-memory"]
    return start_outrig_with(home, *where, *flags, name=name)


async def _run(server: ServerProcess, seconds: float, tasks: int) -> Sample:
    async with outrig.aio.connect(server.address, space=SPACE) as space:
        window = Window(0.3, seconds, server)
        text = "x" * 100

        def loop(task: int) -> asyncio.Future[int]:
            n = 0

            async def step() -> int:
                nonlocal n
                n += 1
                await space.write(Row(n=task * 1_000_000 + n, text=text), lease=60.0)
                return 1

            return asyncio.ensure_future(loop_async(step, window))

        done = await gather_counts([loop(task) for task in range(tasks)])
        return window.sample(done)


def _disk_bytes_per_change(data_dir: Path) -> float:
    with sqlite3.connect(f"file:{data_dir / 'outrig.db'}?mode=ro", uri=True) as db:
        count = db.execute("SELECT count(*) FROM changes").fetchone()[0]
        # The log's table alone: its index by entry was dropped (the durable pair's fourth pass).
        pages = db.execute("SELECT sum(pgsize) FROM dbstat WHERE name = 'changes'").fetchone()[0]
    return pages / count if count else float("nan")


async def _rounds(
    servers: dict[tuple[bool, bool], ServerProcess], args: argparse.Namespace
) -> tuple[dict[tuple[bool, bool], list[Sample]], dict[bool, list[float]]]:
    """Every case once per round, in an order rotating each round."""
    cases = list(servers)
    samples: dict[tuple[bool, bool], list[Sample]] = {case: [] for case in cases}
    ratios: dict[bool, list[float]] = {True: [], False: []}
    for round_number in range(args.rounds):
        order = cases[round_number % len(cases) :] + cases[: round_number % len(cases)]
        got = {case: await _run(servers[case], args.seconds, args.tasks) for case in order}
        for case, sample in got.items():
            samples[case].append(sample)
        for durable in (True, False):
            ratios[durable].append(got[(durable, False)].rate / got[(durable, True)].rate)
        print(f"round {round_number + 1}: " + ", ".join(f"{_name(c)} {got[c].rate:,.0f}/s" for c in cases))
    return samples, ratios


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="2 rounds of 1 s")
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tasks", type=int, default=10)
    args = parser.parse_args()
    if args.quick:
        args.seconds, args.rounds = 1.0, 2
    print(
        f"cores: {os.cpu_count()}, load average at start: {os.getloadavg()[0]:.2f}; client: {tune_client()}"
    )
    cases = [(durable, log) for durable in (True, False) for log in (True, False)]
    with tempfile.TemporaryDirectory(prefix="bench-changes-") as tmp:
        workdir = Path(tmp)
        servers = {case: _start(workdir, *case) for case in cases}
        try:
            samples, ratios = asyncio.run(_rounds(servers, args))
            disk = _disk_bytes_per_change(workdir / "durable-log-on" / "data")
        finally:
            for server in servers.values():
                server.stop()
    print(f"\n{args.rounds} rounds of {args.seconds:g} s, {args.tasks} tasks on one connection each")
    print("| server | log | writes/s | server CPU per write | cost, log on / off |")
    print("|---|---|---|---|---|")
    for durable, log in cases:
        rows = samples[(durable, log)]
        rate = statistics.median(s.rate for s in rows)
        cpu = statistics.median(s.server_cpu for s in rows) * 1e6
        ratio = f"{statistics.median(ratios[durable]):.3f}" if log else ""
        where = "durable (always)" if durable else "in memory"
        print(f"| {where} | {'on' if log else 'off'} | {rate:,.0f} | {cpu:.1f} us | {ratio} |")
    entry = pb.Entry(type_name="bench.ChangeRow")
    entry.fields["n"].int_value = 1_000_001
    entry.fields["text"].string_value = "x" * 100
    counted = entry.ByteSize() + CHANGE_OVERHEAD
    print(
        f"\nbytes of log per change: in memory about {counted} counted by retention (the entry's "
        f"{entry.ByteSize()} + {CHANGE_OVERHEAD}); on disk {disk:.0f} (SQLite pages of the log's tables)"
    )


def _name(case: tuple[bool, bool]) -> str:
    durable, log = case
    return f"{'durable' if durable else 'memory'}/{'on' if log else 'off'}"


if __name__ == "__main__":
    main()
