"""Server CPU per write with 0, 1 and N notify subscribers, outrig against the no-op server, in one
run: what a notify fan-out's event costs over the write that makes it.

    python bench/notify_costs.py [--rounds N] [--seconds S] [--subscribers 0,1,10]

bench/run.py's notify workload measures events per second, so its ratio mixes the writer's cost
with the events': this bench sets them apart. One blocking writer writes bench/run.py's notify
entry (300 s leases, cancelled after each run) while 0, 1 or N blocking subscribers (a thread and
a connection each) read the events; each round runs every count against outrig (`outrig serve
--in-memory`) and the no-op server (bench/noop_server.py), in alternating order. Printed: writes/s,
the server's CPU per write (all threads, at the window's edges) and the client process's, medians
over the rounds, and the server's CPU per event over its own 0-subscriber writes. Prints the core
count and the load average; asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path

from entries import NOTIFY_SPACE
from run import _load, progress
from servers import ServerProcess, start_noop, start_outrig, stop_all
from workloads import _NOTIFY_ENTRY, _NOTIFY_TEMPLATE, Plan, connect

import outrig

_LEASE = 300.0
_CANCEL_CHUNK = 1000


def _run(server: ServerProcess, plan: Plan, subscribers: int) -> tuple[float, float, float]:
    """One run: (writes/s, server CPU s per write, client CPU s per write)."""
    with connect(server, plan, NOTIFY_SPACE) as writer:
        listeners = [connect(server, plan, NOTIFY_SPACE) for _ in range(subscribers)]
        notifications = [listener.notify(_NOTIFY_TEMPLATE, lease=60.0) for listener in listeners]
        for notification in notifications:
            notification.__enter__()

        def consume(events: outrig.Notification) -> None:
            for _ in events:
                pass

        threads = [threading.Thread(target=consume, args=(events,)) for events in notifications]
        for thread in threads:
            thread.start()
        leases: list[outrig.Lease] = []
        warm = time.monotonic() + plan.warmup
        while time.monotonic() < warm:
            leases.append(writer.write(_NOTIFY_ENTRY, lease=_LEASE))
        server_0, client_0, started = server.cpu_seconds(), time.process_time(), time.monotonic()
        done = 0
        while time.monotonic() < started + plan.seconds:
            leases.append(writer.write(_NOTIFY_ENTRY, lease=_LEASE))
            done += 1
        server_1, client_1, ended = server.cpu_seconds(), time.process_time(), time.monotonic()
        for notification in notifications:
            notification.close()
        for thread in threads:
            thread.join()
        for listener in listeners:
            listener.close()
        for start in range(0, len(leases), _CANCEL_CHUNK):
            writer.cancel_many(leases[start : start + _CANCEL_CHUNK])
    return done / (ended - started), (server_1 - server_0) / done, (client_1 - client_0) / done


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    parser.add_argument("--seconds", type=float, default=2.0, help="measured seconds per run (default 2)")
    parser.add_argument("--subscribers", default="0,1,10", help="subscriber counts (default 0,1,10)")
    args = parser.parse_args()
    counts = [int(count) for count in args.subscribers.split(",")]
    print(f"notify costs: {os.cpu_count()} cores; {args.rounds} rounds x {args.seconds:g} s per run")
    print(f"load average before: {_load()}", flush=True)
    workdir = Path(tempfile.mkdtemp(prefix="outrig-notify-costs-"))
    servers = {"outrig": start_outrig(workdir, "outrig"), "noop": start_noop(workdir)}
    results: dict[tuple[str, int], list[tuple[float, float, float]]] = {}
    try:
        with asyncio.Runner() as runner:
            plan = Plan(args.seconds, 0.5, runner)
            for index in range(args.rounds):
                for count in counts:
                    names = list(servers) if index % 2 == 0 else list(servers)[::-1]
                    for name in names:
                        figures = _run(servers[name], plan, count)
                        results.setdefault((name, count), []).append(figures)
                        progress(
                            f"round {index + 1}/{args.rounds} {name:<6} {count:>3} subscribers: "
                            f"{figures[0]:>7,.0f} writes/s, server {figures[1] * 1e6:>7,.0f} us/write"
                        )
    finally:
        stop_all(servers.values(), workdir)
    print(f"load average after: {_load()}")
    print()
    print("| target | subscribers | writes/s | server us/write | server us/event over 0 | client us/write |")
    print("|---|---|---|---|---|---|")
    for name in servers:
        alone = statistics.median(s for _, s, _ in results[(name, counts[0])])
        for count in counts:
            runs = results[(name, count)]
            server = statistics.median(s for _, s, _ in runs)
            extra = f"{(server - alone) / (count - counts[0]) * 1e6:,.0f}" if count > counts[0] else ""
            rate = statistics.median(r for r, _, _ in runs)
            client = statistics.median(c for _, _, c in runs)
            print(f"| {name} | {count} | {rate:,.0f} | {server * 1e6:,.0f} | {extra} | {client * 1e6:,.0f} |")


if __name__ == "__main__":
    main()
