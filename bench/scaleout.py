"""Scale-out: 1, 2 and 3 outrig servers on one PostgreSQL database, against the embedded backend,
in the same run.

    python bench/scaleout.py [--quick] [--seconds S] [--rounds N] [--clients N]

A throwaway PostgreSQL is started from the machine's server binaries (as tests/postgres_server.py
does; with fsync on, as a real one runs). Each run starts fresh servers and 10 client threads (a
connection each), spread round-robin over the servers, that loop on one workload for S seconds:

- pair: write an entry, take it back (a template with the client's number);
- read: read_nowait of one of 100 entries written beforehand.

Configurations: embedded durable (SQLite, `--durability always`), embedded in memory, and
postgres with 1, 2 and 3 servers. Rounds are interleaved (the order rotates); figures are medians
over rounds. Prints the core count and load average: all servers, PostgreSQL and the clients
share this machine's cores, so more servers only help while the machine has idle CPU. Nothing is
asserted.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import psycopg
from servers import ServerProcess, start_outrig_with

import outrig

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.postgres_server import find_bindir, running_postgres

_OWN_CONNECTION = [("grpc.use_local_subchannel_pool", 1)]


@dataclass
class Job(outrig.Entry, type_name="bench.ScaleJob"):
    client: int | None = None
    n: int | None = None


def _client(
    address: str, number: int, workload: str, seconds: float, barrier: threading.Barrier, out: list[float]
) -> None:
    with outrig.connect(address, space="bench", options=_OWN_CONNECTION) as space:
        space.count(Job(client=number))
        barrier.wait()
        done, started = 0, time.monotonic()
        while time.monotonic() - started < seconds:
            if workload == "pair":
                space.write(Job(client=number, n=done), lease=60.0)
                if space.take(Job(client=number), timeout=10.0) is None:
                    raise RuntimeError("a take found nothing")
            else:
                space.read_nowait(Job(client=-1, n=done % 100))
            done += 1
        out[number] = done / (time.monotonic() - started)


def _run(addresses: list[str], workload: str, clients: int, seconds: float) -> float:
    if workload == "read":
        with outrig.connect(addresses[0], space="bench") as space:
            space.write_many([Job(client=-1, n=n) for n in range(100)], lease=600.0)
    rates = [0.0] * clients
    barrier = threading.Barrier(clients)
    threads = [
        threading.Thread(
            target=_client, args=(addresses[i % len(addresses)], i, workload, seconds, barrier, rates)
        )
        for i in range(clients)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sum(rates)


def _servers(name: str, dsn: str | None, workdir: Path) -> list[ServerProcess]:
    if name == "embedded-memory":
        return [start_outrig_with(workdir, "--in-memory", "--log-level", "WARNING", name="embedded")]
    if name == "embedded-durable":
        return [
            start_outrig_with(
                workdir, "--data-dir", str(workdir / "data"), "--log-level", "WARNING", name="embedded"
            )
        ]
    count = int(name.rsplit("-", 1)[1])
    assert dsn is not None
    return [
        start_outrig_with(
            workdir, "--backend", "postgres", "--dsn", dsn, "--log-level", "WARNING", name=f"pg{i}"
        )
        for i in range(count)
    ]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="1 round of 2 s runs")
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--clients", type=int, default=10)
    args = parser.parse_args()
    seconds, rounds = (2.0, 1) if args.quick else (args.seconds, args.rounds)
    bindir = find_bindir()
    if bindir is None:
        sys.exit("bench/scaleout.py needs PostgreSQL's server binaries (initdb, postgres)")
    names = ["embedded-memory", "embedded-durable", "postgres-1", "postgres-2", "postgres-3"]
    results: dict[tuple[str, str], list[float]] = {}
    print(f"cores={os.cpu_count()} clients={args.clients} load average before: {os.getloadavg()[0]:.2f}")
    with running_postgres(bindir, fsync=True) as postgres, tempfile.TemporaryDirectory() as root:
        print(postgres.version)
        for round_number in range(rounds):
            order = names[round_number % len(names) :] + names[: round_number % len(names)]
            for name in order:
                for workload in ("pair", "read"):
                    dsn = None
                    if name.startswith("postgres"):
                        database = f"b_{uuid.uuid4().hex[:10]}"
                        with psycopg.connect(postgres.dsn(), autocommit=True) as admin:
                            admin.execute(f"CREATE DATABASE {database}")
                        dsn = postgres.dsn(database)
                    workdir = Path(tempfile.mkdtemp(dir=root))
                    servers = _servers(name, dsn, workdir)
                    try:
                        rate = _run([s.address for s in servers], workload, args.clients, seconds)
                    finally:
                        for server in servers:
                            server.stop()
                    results.setdefault((name, workload), []).append(rate)
    print(f"load average after: {os.getloadavg()[0]:.2f}; {rounds} rounds x {seconds:g} s, medians")
    print()
    print("| configuration | write+take pairs/s | vs postgres-1 | reads/s | vs postgres-1 |")
    print("|---|---|---|---|---|")
    base = {w: statistics.median(results[("postgres-1", w)]) for w in ("pair", "read")}
    for name in names:
        pair, read = (statistics.median(results[(name, w)]) for w in ("pair", "read"))
        print(
            f"| {name} | {pair:,.0f} | {pair / base['pair']:.2f} | {read:,.0f} | {read / base['read']:.2f} |"
        )


if __name__ == "__main__":
    main()
