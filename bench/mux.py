"""Write+take pairs per second over outrig's multiplexed stream and over its unary calls, durable
and in memory, next to Redis (in memory and AOF fsync always) and the no-op gRPC server, in one run.

    python bench/mux.py [--quick] [--rounds N] [--seconds S] [--warmup S] [--data-root DIR]
                        [--json PATH]

A pair is bench/workloads.py's: ``space.write(entry, lease=...)`` then ``space.take(template,
timeout=10)`` of a small entry (a template with the client's number set, so each client takes back
its own); for Redis, LPUSH + BRPOP of the same bytes through redis-py. Targets, each its own process
started once for the whole run (bench/servers.py):
  - outrig durable: ``--data-dir`` (fresh, under --data-root) ``--durability always``: each reply
    waits for the group commit's fsync. It serves ``--metrics-listen`` too (1.9 us a call,
    docs/metrics.md): the ``outrig_store_batch_changes`` histogram, read at each window's edges,
    gives the records per group commit and the commits per pair. Records, not operations: with
    request ids (the SDK's default) a write or take is 2 records, the change and its id, so a pair
    is 4 (2 with ``retry_deadline=0``);
  - outrig in memory: ``--in-memory``, as in bench/run.py;
  - each of the two through the SDK's unary calls (``connect(..., mux=False)``) and through its
    multiplexed stream, one bidirectional stream per connection (``mux=True``);
  - the no-op gRPC server (bench/noop_server.py), through the same two paths: the floor for a
    Python gRPC service, which answers every call or op at once with a canned reply;
  - Redis in memory (``--appendonly no``) and with ``--appendonly yes --appendfsync always``.
Clients, all in this process (tuned as in bench/run.py): 1 = a blocking ``outrig.Space`` (a sync
redis client); 10 = 10 asyncio tasks with a connection each (redis.asyncio, 10 connections); and
for outrig and the no-op server also 10 asyncio tasks sharing ONE connection (one AsyncSpace: the
case where the stream carries many operations at once) and 10 threads sharing one blocking Space.

Method: N rounds (default 3) in which every client shape runs every target once, in an order
rotated per round; each run has a warm-up (default 1 s), then a measured window (default 5 s) that
counts the pairs completing inside it, and the CPU time of the server process (all threads) and of
this process at the window's edges. Figures are medians over the rounds, with min and max. A full
run takes about 8 minutes on 2 cores, ``--quick`` (1 round x 2 s, 0.5 s warm-up) about 1 minute.

Prints the core count, the versions, the load average at the start and the end; a table of pairs/s
per target and client shape with the server and client CPU per pair and, for the durable rows,
records per group commit and commits per pair; the stream / unary ratios; a comparison with the
reference peers measured earlier on this machine (issue 10's table) and with the Redis rows of this
run. The last line is ``goal: durable outrig stream vs Redis AOF-always (same run) ...``; ``--json
PATH`` writes every median. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import re
import shutil
import statistics
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import redis
from durability import _filesystem
from entries import SPACE, Small
from google import protobuf
from measure import Sample, Window, gather_counts, loop_async, loop_sync, tune_client
from run import _load, _redis_server_version, _source_state, progress
from servers import (
    REDIS_MISSING,
    ServerProcess,
    free_port,
    redis_available,
    start_durable_outrig,
    start_noop,
    start_outrig,
    start_redis,
)
from workloads import OWN_CONNECTION, Plan, pair_async, pair_sync, redis_pair

import outrig
import outrig.aio
from outrig.aio import AsyncSpace

TASKS = 10  # the client count of the concurrent shapes


# ---------------------------------------------------------------- what runs against what


@dataclass(frozen=True)
class Target:
    name: str  # the key in the ratios line and the JSON: durable_stream
    label: str
    server: str  # durable, memory, noop, redis, redis_aof
    mux: bool = False  # outrig's stream rather than its unary calls

    @property
    def redis(self) -> bool:
        return self.server.startswith("redis")


TARGETS = (
    Target("durable_stream", "outrig durable, stream", "durable", mux=True),
    Target("durable_unary", "outrig durable, unary", "durable"),
    Target("memory_stream", "outrig in memory, stream", "memory", mux=True),
    Target("memory_unary", "outrig in memory, unary", "memory"),
    Target("noop_stream", "no-op gRPC, stream", "noop", mux=True),
    Target("noop", "no-op gRPC, unary", "noop"),
    Target("redis_aof", "Redis, AOF always", "redis_aof"),
    Target("redis", "Redis, in memory", "redis"),
)
TARGET = {target.name: target for target in TARGETS}


class Probe:
    """Opens a run's measured window once its clients are connected; given the server's metrics
    address, also reads the group-commit counters at the window's two edges."""

    def __init__(self, server: ServerProcess, plan: Plan, metrics: str | None) -> None:
        self._server, self._plan, self._metrics = server, plan, metrics
        self._window: Window | None = None
        self._watcher: threading.Thread | None = None
        self._edges: list[tuple[float, float]] = []
        self._failure: Exception | None = None

    def open(self) -> Window:
        self._window = Window(self._plan.warmup, self._plan.seconds, self._server)
        if self._metrics is not None:
            self._watcher = threading.Thread(target=self._watch, args=(self._window,), daemon=True)
            self._watcher.start()
        return self._window

    def _watch(self, window: Window) -> None:
        assert self._metrics is not None
        try:
            for edge in (window.warm, window.end):
                time.sleep(max(0.0, edge - time.monotonic()))
                self._edges.append(batch_counters(self._metrics))
        except Exception as err:
            self._failure = err

    def result(self, pairs: int) -> Run:
        assert self._window is not None, "the run never opened its window"
        sample = self._window.sample(pairs)
        if self._watcher is None:
            return Run(sample)
        self._watcher.join()
        if self._failure is not None:
            raise RuntimeError(f"reading http://{self._metrics}/metrics failed") from self._failure
        (changes_0, commits_0), (changes_1, commits_1) = self._edges
        return Run(sample, Commits(changes_1 - changes_0, commits_1 - commits_0, pairs))


_BATCH_LINE = re.compile(r"^outrig_store_batch_changes_(sum|count) (\S+)$", re.MULTILINE)


def batch_counters(metrics: str) -> tuple[float, float]:
    """(records committed, group commits) so far, from the server's Prometheus endpoint."""
    with urllib.request.urlopen(f"http://{metrics}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    values = dict(_BATCH_LINE.findall(text))
    if set(values) != {"sum", "count"}:
        raise RuntimeError(f"no outrig_store_batch_changes histogram at http://{metrics}/metrics")
    return float(values["sum"]), float(values["count"])


@dataclass(frozen=True)
class Commits:
    """The durable server's group commits inside one run's window."""

    changes: float  # records committed
    commits: float  # group commits
    pairs: int

    @property
    def per_commit(self) -> float:
        return self.changes / self.commits if self.commits else math.nan

    @property
    def per_pair(self) -> float:
        return self.commits / self.pairs if self.pairs else math.nan


@dataclass(frozen=True)
class Run:
    sample: Sample
    commits: Commits | None = None


# ---------------------------------------------------------------- the client shapes (outrig, no-op)


def _connect(server: ServerProcess, plan: Plan, mux: bool) -> outrig.Space:
    return outrig.connect(
        server.address, space=SPACE, options=OWN_CONNECTION, retry_deadline=plan.retry_deadline, mux=mux
    )


def _connect_async(server: ServerProcess, plan: Plan, mux: bool) -> AsyncSpace:
    return outrig.aio.connect(
        server.address, space=SPACE, options=OWN_CONNECTION, retry_deadline=plan.retry_deadline, mux=mux
    )


def one_client(server: ServerProcess, plan: Plan, mux: bool, probe: Probe) -> int:
    """One blocking Space in this thread; the pairs done inside the window."""
    with _connect(server, plan, mux) as space:
        client = pair_sync(space, 0)
        space.count(Small())  # connect before the clock starts
        return loop_sync(client.step, probe.open())


def threads_one_connection(server: ServerProcess, plan: Plan, mux: bool, probe: Probe) -> int:
    """TASKS threads sharing one blocking Space."""
    with _connect(server, plan, mux) as space:
        clients = [pair_sync(space, number) for number in range(TASKS)]
        space.count(Small())
        window = probe.open()
        with ThreadPoolExecutor(TASKS) as pool:
            return sum(pool.map(lambda client: loop_sync(client.step, window), clients))


async def _tasks(server: ServerProcess, plan: Plan, mux: bool, probe: Probe, connections: int) -> int:
    """TASKS asyncio tasks over `connections` AsyncSpaces (task n uses connection n % connections)."""
    spaces = [_connect_async(server, plan, mux) for _ in range(connections)]
    try:
        await asyncio.gather(*(space.count(Small()) for space in spaces))
        clients = [pair_async(spaces[number % connections], number) for number in range(TASKS)]
        window = probe.open()
        return await gather_counts([loop_async(client.step, window) for client in clients])
    finally:
        await asyncio.gather(*(space.close() for space in spaces))


def tasks_own_connections(server: ServerProcess, plan: Plan, mux: bool, probe: Probe) -> int:
    return plan.runner.run(_tasks(server, plan, mux, probe, TASKS))


def tasks_one_connection(server: ServerProcess, plan: Plan, mux: bool, probe: Probe) -> int:
    return plan.runner.run(_tasks(server, plan, mux, probe, 1))


@dataclass(frozen=True)
class Shape:
    name: str  # 1, 10_own, 10_shared, 10_threads
    label: str
    clients: int
    run: Callable[[ServerProcess, Plan, bool, Probe], int]  # outrig and the no-op server
    redis: bool  # whether Redis runs it too (redis_pair with this many connections)


SHAPES = (
    Shape("1", "1 (blocking)", 1, one_client, redis=True),
    Shape("10_own", f"{TASKS} tasks, a connection each", TASKS, tasks_own_connections, redis=True),
    Shape("10_shared", f"{TASKS} tasks, one connection", TASKS, tasks_one_connection, redis=False),
    Shape("10_threads", f"{TASKS} threads, one blocking Space", TASKS, threads_one_connection, redis=False),
)
SHAPE = {shape.name: shape for shape in SHAPES}


# ---------------------------------------------------------------- running everything


@dataclass
class Servers:
    processes: dict[str, ServerProcess]
    metrics: str  # the durable server's --metrics-listen address

    def stop(self) -> None:
        for process in self.processes.values():
            process.stop()


def start_servers(workdir: Path, with_redis: bool) -> Servers:
    servers = Servers({}, f"127.0.0.1:{free_port()}")
    try:
        servers.processes["durable"] = start_durable_outrig(workdir, "--metrics-listen", servers.metrics)
        servers.processes["memory"] = start_outrig(workdir)
        servers.processes["noop"] = start_noop(workdir)
        if with_redis:
            servers.processes["redis"] = start_redis(workdir)
            servers.processes["redis_aof"] = start_redis(workdir, aof_always=True)
    except BaseException:
        servers.stop()
        raise
    return servers


def measure(target: Target, shape: Shape, servers: Servers, plan: Plan) -> Run:
    server = servers.processes[target.server]
    if target.redis:
        return Run(redis_pair(server, shape.clients, plan))
    probe = Probe(server, plan, servers.metrics if target.server == "durable" else None)
    return probe.result(shape.run(server, plan, target.mux, probe))


def cells(servers: Servers) -> Iterator[tuple[Shape, tuple[Target, ...]]]:
    """Each client shape with the targets it runs against (those whose server is up)."""
    for shape in SHAPES:
        yield (
            shape,
            tuple(
                target
                for target in TARGETS
                if target.server in servers.processes and (shape.redis or not target.redis)
            ),
        )


Results = dict[tuple[str, str], list[Run]]  # (target, shape) -> runs


def measure_all(servers: Servers, plan: Plan, rounds: int) -> Results:
    results: Results = {}
    for round_number in range(rounds):
        for shape, targets in cells(servers):
            shift = round_number % len(targets)
            for target in targets[shift:] + targets[:shift]:
                try:
                    run = measure(target, shape, servers, plan)
                except Exception:
                    for process in servers.processes.values():
                        process.check_alive()
                    raise
                results.setdefault((target.name, shape.name), []).append(run)
                progress(
                    f"round {round_number + 1}/{rounds} {shape.name:<10} {target.name:<15} "
                    f"{run.sample.rate:>9,.1f} pairs/s"
                )
    return results


# ---------------------------------------------------------------- figures


@dataclass(frozen=True)
class Row:
    """The medians of one (target, shape)."""

    rate: float
    low: float
    high: float
    server_us: float  # server CPU per pair
    client_us: float  # this process's CPU per pair
    per_commit: float  # records per group commit (durable rows; nan elsewhere)
    commits_per_pair: float
    rates: list[float]


def _median(values: list[float]) -> float:
    known = [value for value in values if not math.isnan(value)]
    return statistics.median(known) if known else math.nan


def row_of(runs: list[Run]) -> Row:
    rates = [run.sample.rate for run in runs]
    commits = [run.commits for run in runs if run.commits is not None]
    return Row(
        _median(rates),
        min(rates),
        max(rates),
        _median([run.sample.server_cpu * 1e6 for run in runs]),
        _median([run.sample.client_cpu * 1e6 for run in runs]),
        _median([c.per_commit for c in commits]),
        _median([c.per_pair for c in commits]),
        rates,
    )


Rows = dict[tuple[str, str], Row]


def _rate(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:,.0f}"


def _fraction(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.2f}"


def _ratio(rows: Rows, mine: tuple[str, str], theirs: tuple[str, str]) -> float:
    if mine not in rows or theirs not in rows:
        return math.nan
    return rows[mine].rate / rows[theirs].rate


def _redis_shape(shape: Shape) -> str:
    """The Redis row a shape compares with: the same client count (Redis's 10 clients are 10
    connections)."""
    return "1" if shape.clients == 1 else "10_own"


def print_rows(rows: Rows) -> None:
    print(
        "| target | clients | pairs/s | min - max | server CPU/pair (us) | client CPU/pair (us) | "
        "records/commit | commits/pair | vs Redis AOF | vs Redis |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for shape in SHAPES:
        for target in TARGETS:
            row = rows.get((target.name, shape.name))
            if row is None:
                continue
            redis_shape = _redis_shape(shape)
            print(
                f"| {target.label} | {shape.label} | {_rate(row.rate)} | {_rate(row.low)} - "
                f"{_rate(row.high)} | {_rate(row.server_us)} | {_rate(row.client_us)} | "
                f"{_fraction(row.per_commit)} | {_fraction(row.commits_per_pair)} | "
                f"{_fraction(_ratio(rows, (target.name, shape.name), ('redis_aof', redis_shape)))} | "
                f"{_fraction(_ratio(rows, (target.name, shape.name), ('redis', redis_shape)))} |"
            )
    print()
    print(
        "vs Redis AOF, vs Redis: pairs/s / the Redis row of this run at the same client count "
        f"(Redis's {TASKS} clients are {TASKS} connections)"
    )


def stream_ratios(rows: Rows) -> dict[str, float]:
    """stream / unary, per outrig server and client shape."""
    return {
        f"stream_{server}_{shape.name}": _ratio(
            rows, (f"{server}_stream", shape.name), (f"{server}_unary", shape.name)
        )
        for server in ("durable", "memory")
        for shape in SHAPES
    }


def print_stream_ratios(ratios: dict[str, float]) -> None:
    print("stream / unary (pairs/s, same run):")
    print()
    print("| outrig | " + " | ".join(shape.label for shape in SHAPES) + " |")
    print("|---|" + "---|" * len(SHAPES))
    for server, label in (("durable", "durable (always)"), ("memory", "in memory")):
        cells = [_fraction(ratios[f"stream_{server}_{shape.name}"]) for shape in SHAPES]
        print(f"| {label} | " + " | ".join(cells) + " |")


# ---------------------------------------------------------------- the reference peers


@dataclass(frozen=True)
class Reference:
    name: str
    label: str
    one: float  # pairs/s, 1 client
    ten: float  # pairs/s, 10 clients
    same_run: str | None = None  # the target measuring the same peer in this run

    def at(self, clients: int) -> float:
        return self.one if clients == 1 else self.ten


#: Issue 10's table: the peers measured earlier on this machine (write+take pairs/s, 1 and 10 clients).
REFERENCE_SOURCE = "issue 10's table"
REFERENCES = (
    Reference("outrigger_memory", "Outrigger 3.0, in memory", 1_472, 3_717),
    Reference("outrigger_persistent", "Outrigger 3.0, persistent", 561, 910),
    Reference("redis_memory", "Redis via redis-py, in memory", 3_387, 7_660, same_run="redis"),
    Reference("redis_aof", "Redis via redis-py, AOF always", 1_495, 7_386, same_run="redis_aof"),
)
_COMPARED = ("durable_stream", "durable_unary", "memory_stream", "memory_unary")


def _measured(rows: Rows, target: str | None, shape: str) -> str:
    row = rows.get((target, shape)) if target is not None else None
    return _rate(row.rate) if row is not None else "-"


def print_references(rows: Rows) -> None:
    print(f"reference peers ({REFERENCE_SOURCE}) next to the same peers in this run, pairs/s:")
    print()
    print("| peer | 1 client, reference | 1 client, now | 10 clients, reference | 10 clients, now |")
    print("|---|---|---|---|---|")
    for peer in REFERENCES:
        now = [_measured(rows, peer.same_run, shape) for shape in ("1", "10_own")]
        print(f"| {peer.label} | {peer.one:,.0f} | {now[0]} | {peer.ten:,.0f} | {now[1]} |")
    print()
    print("outrig / peer, at the same client count (reference = issue 10; now = this run's Redis rows):")
    print()
    heads = [f"{peer.label} (reference)" for peer in REFERENCES]
    heads += [f"{TARGET[name].label} (now)" for name in ("redis", "redis_aof")]
    print("| outrig | clients | pairs/s | " + " | ".join(heads) + " |")
    print("|---|---|---|" + "---|" * len(heads))
    for shape in SHAPES:
        for name in _COMPARED:
            row = rows.get((name, shape.name))
            if row is None:
                continue
            cells = [_fraction(row.rate / peer.at(shape.clients)) for peer in REFERENCES]
            cells += [
                _fraction(_ratio(rows, (name, shape.name), (peer, _redis_shape(shape))))
                for peer in ("redis", "redis_aof")
            ]
            print(f"| {TARGET[name].label} | {shape.label} | {_rate(row.rate)} | " + " | ".join(cells) + " |")


def goals(rows: Rows) -> dict[str, float]:
    """The durable stream against Redis AOF always (this run) and Outrigger in memory (reference)."""
    outrigger = REFERENCES[0]
    figures: dict[str, float] = {}
    for shape in ("1", "10_own", "10_shared"):
        mine = ("durable_stream", shape)
        figures[f"vs_redis_aof_{shape}"] = _ratio(rows, mine, ("redis_aof", _redis_shape(SHAPE[shape])))
        rate = rows[mine].rate if mine in rows else math.nan
        figures[f"vs_outrigger_memory_{shape}"] = rate / outrigger.at(SHAPE[shape].clients)
    return figures


def goal_line(figures: dict[str, float]) -> str:
    def part(prefix: str) -> str:
        one, own, shared = (_fraction(figures[f"{prefix}_{shape}"]) for shape in ("1", "10_own", "10_shared"))
        return f"1 client {one}, 10 clients {own} (a connection each; one shared connection {shared})"

    line = (
        f"goal: durable outrig stream vs Redis AOF-always (same run) {part('vs_redis_aof')}; "
        f"vs Outrigger in memory (reference) {part('vs_outrigger_memory')}"
    )
    return line


def write_json(path: Path, header: dict[str, Any], rows: Rows, ratios: dict[str, float]) -> None:
    def number(value: float) -> float | None:
        return None if math.isnan(value) else value

    document = {
        **header,
        "rows": {
            f"{target}_{shape}": {
                "target": target,
                "shape": shape,
                "pairs_per_second": row.rate,
                "min": row.low,
                "max": row.high,
                "runs": row.rates,
                "server_cpu_us_per_pair": number(row.server_us),
                "client_cpu_us_per_pair": number(row.client_us),
                "records_per_commit": number(row.per_commit),
                "commits_per_pair": number(row.commits_per_pair),
            }
            for (target, shape), row in rows.items()
        },
        "ratios": {name: number(value) for name, value in ratios.items()},
        "reference": {
            "source": REFERENCE_SOURCE,
            **{peer.name: {"1": peer.one, "10": peer.ten} for peer in REFERENCES},
        },
    }
    path.write_text(json.dumps(document, indent=2) + "\n")


# ---------------------------------------------------------------- main


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="a smoke run: 1 round x 2 s (0.5 s warm-up)")
    parser.add_argument("--rounds", type=int, help="interleaved rounds (default 3)")
    parser.add_argument("--seconds", type=float, help="measured seconds per run (default 5)")
    parser.add_argument("--warmup", type=float, help="warm-up seconds before each run's window (default 1)")
    parser.add_argument(
        "--data-root",
        type=Path,
        default=Path(tempfile.gettempdir()),
        help="where the work dir (data dir, AOF) goes: fsync on tmpfs costs nothing",
    )
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write every median to PATH")
    args = parser.parse_args()
    rounds = args.rounds or (1 if args.quick else 3)
    seconds = args.seconds or (2.0 if args.quick else 5.0)
    warmup = args.warmup if args.warmup is not None else (0.5 if args.quick else 1.0)
    client_process = tune_client()
    with_redis = redis_available()

    print(
        f"outrig stream vs unary bench: {os.cpu_count()} cores, Python {platform.python_version()}, "
        f"grpcio {grpc.__version__}, protobuf {protobuf.__version__}, redis-py {redis.__version__}, "
        f"redis-server {_redis_server_version()}"
    )
    print(_source_state())
    print(f"client process allocator: {client_process}")
    print(
        f"data dirs on {_filesystem(args.data_root)}; {rounds} rounds x {seconds:g} s runs (after "
        f"{warmup:g} s warm-up) per target and client shape, interleaved; clients share the machine "
        f"with the servers"
    )
    load_start = _load()
    print(f"load average at start: {load_start}", flush=True)

    workdir = Path(tempfile.mkdtemp(prefix="outrig-bench-mux-", dir=args.data_root))
    try:
        servers = start_servers(workdir, with_redis)
        allocators = ", ".join(f"{name} {server.allocator()}" for name, server in servers.processes.items())
        print(f"server allocators: {allocators}", flush=True)
        try:
            with asyncio.Runner() as runner:
                results = measure_all(servers, Plan(seconds, warmup, runner), rounds)
        finally:
            servers.stop()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    load_end = _load()
    print(f"load average at end: {load_end}")
    if not with_redis:
        print(REDIS_MISSING)
    print()

    rows = {key: row_of(runs) for key, runs in results.items()}
    print_rows(rows)
    print()
    ratios = stream_ratios(rows)
    print_stream_ratios(ratios)
    print()
    print_references(rows)
    print()
    figures = goals(rows)
    ratios |= {f"goal_{name}": value for name, value in figures.items()}
    print("ratios: " + " ".join(f"{name}={_fraction(value)}" for name, value in ratios.items()))
    if args.json is not None:
        header = {
            "cores": os.cpu_count(),
            "python": platform.python_version(),
            "grpcio": grpc.__version__,
            "load_start": load_start,
            "load_end": load_end,
            "rounds": rounds,
            "seconds": seconds,
            "warmup": warmup,
        }
        write_json(args.json, header, rows, ratios)
    print(goal_line(figures))


if __name__ == "__main__":
    main()
