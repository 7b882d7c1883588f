"""The postgres owner backend: a tier of `outrig serve --backend postgres` processes on one
PostgreSQL, each space owned (served from memory, recorded with group commit) by one of them.

    python bench/owners.py [--quick] [--part a|b|c|d] [--seconds S] [--rounds N] [--kills N]
                           [--entries N] [--owner-lease S]

A throwaway PostgreSQL is started from the machine's server binaries (tests/postgres_server.py,
with fsync on, as a real one runs); each configuration gets a fresh database and fresh servers.
One pair = a write, then a take of that entry (two calls, two durable changes).

a. One space, pairs/s through the SDK: 1 blocking client, and 10 asyncio tasks sharing one
   connection; the embedded durable backend (`--data-dir`, durability always: the baseline) vs
   the owner backend with one server, the clients on the owner. Ratio owner / embedded (targets:
   >= 0.8 with 10 clients, >= 0.7 with 1); for the owner, also PostgreSQL's WAL records and bytes
   per pair (pg_stat_wal over the measured window).
b. Six spaces over a tier of 3 servers (and, the baseline, of 1), clients spread over the
   spaces, each space's connection to its owner (found in PostgreSQL): aggregate pairs/s, and CPU
   seconds per pair of the outrig servers, of PostgreSQL (the postmaster and its children, from
   /proc) and of the client process, to read capacity per core off.
c. Takeover: one space holding --entries entries, 3 servers, clients doing pairs through a
   non-owner server (with the SDK's retries), the owner SIGKILLed: the time from the kill until
   a call on the space succeeds through another server (short calls, polled), median over
   --kills kills (the killed server restarted between kills). After each kill: every
   acknowledged write is still in the space or was taken exactly once, no take returned an entry
   twice, nothing taken is back, no stored entry was lost.
d. Forwarded vs direct: latency (median, p99) of a write+take pair and of a read by one blocking
   client, through a non-owner server vs on the owner, and CPU per operation of the client and of
   the servers (both servers for the forwarded path).
e. The change log's write cost (issue 24): pairs/s of one space on one owner server with the log
   on (the default) against off (`changes = false`, the baseline), 1 blocking client and 10
   asyncio tasks; the ratio off / on of the time per pair (target <= 1.1), server and PostgreSQL
   CPU and WAL bytes per pair, and the log's bytes per change in the database
   (pg_total_relation_size of outrig_changes, its index with it, over its rows).

Rounds are interleaved, figures are medians over rounds, ratios are against a baseline in the
same run. Prints the core count and load average: servers, PostgreSQL and clients share this
machine's cores. Nothing is asserted, except part c's checks, which print what they found.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import math
import os
import signal
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
from servers import ServerProcess, start_durable_outrig, start_outrig_with

import outrig
import outrig.aio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.postgres_server import PostgresServer, find_bindir, running_postgres

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
_WAIT = 10.0  # seconds a take may wait: the entry was just written, it matches at once
_LEASE = 600.0
_OWNER_SQL = (
    "SELECT s.address FROM outrig_spaces o JOIN outrig_servers s ON s.id = o.owner "
    "WHERE o.space = %s AND o.owner_expires_at > now()"
)
_NOTE = "x" * 32


@dataclass
class Item(outrig.Entry, type_name="bench.OwnerItem"):
    kind: str | None = None
    client: int | None = None
    n: int | None = None
    note: str | None = None


# ---------------------------------------------------------------- CPU from /proc


def _stat_fields(pid: int) -> list[str]:
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rpartition(")")[2].split()


def _cpu(pid: int, children: bool = False) -> float:
    """User + system seconds of `pid` (all its threads); with `children`, plus those of its
    children it has waited for (an exited PostgreSQL backend's time moves to the postmaster's)."""
    try:
        fields = _stat_fields(pid)
    except (FileNotFoundError, ProcessLookupError):
        return 0.0
    ticks = int(fields[11]) + int(fields[12])
    if children:
        ticks += int(fields[13]) + int(fields[14])
    return ticks / _CLOCK_TICKS


def _processes() -> Iterator[tuple[int, int, str]]:
    """(pid, parent pid, command line) of every process we can see."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            ppid = int(_stat_fields(int(entry))[1])
            with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                command = cmdline.read().replace(b"\0", b" ").decode(errors="replace")
        except (FileNotFoundError, ProcessLookupError, IndexError):
            continue
        yield int(entry), ppid, command


def find_postmaster(port: int) -> int:
    """The pid of the postmaster listening on `port` (as root, the child of `runuser`)."""
    candidates = {
        pid: ppid
        for pid, ppid, command in _processes()
        if command.split(" ")[0].endswith("/postgres") and f"-p {port} " in command
    }
    for pid, ppid in candidates.items():
        if ppid not in candidates:
            return pid
    raise RuntimeError(f"no postmaster on port {port} found in /proc")


class PostgresCpu:
    """CPU seconds of a PostgreSQL cluster so far: the postmaster, the children it has reaped,
    and its live children (backends, walwriter, checkpointer, ...)."""

    def __init__(self, port: int) -> None:
        self.postmaster = find_postmaster(port)

    def seconds(self) -> float:
        total = _cpu(self.postmaster, children=True)
        for pid, ppid, _ in _processes():
            if ppid == self.postmaster:
                total += _cpu(pid)
        return total


CpuSource = Callable[[], float]


def _wal_counter(postgres: PostgresServer, column: int) -> CpuSource:
    """PostgreSQL's WAL written so far (pg_stat_wal: 0, records; 1, bytes), as a meter's source:
    per pair, the WAL a pair costs (steadier than CPU on a shared machine)."""

    def read() -> float:
        with psycopg.connect(postgres.dsn(), autocommit=True) as connection:
            row = connection.execute("SELECT wal_records, wal_bytes FROM pg_stat_wal").fetchone()
        assert row is not None
        return float(row[column])

    return read


def _client_cpu() -> float:
    return time.process_time()


# ---------------------------------------------------------------- a tier of servers


class Tier:
    """Servers of the owner backend on one fresh database, by slot (a killed one is restarted in
    its slot, on a new port)."""

    def __init__(
        self,
        postgres: PostgresServer,
        workdir: Path,
        size: int,
        owner_lease: float | None,
        flags: tuple[str, ...] = (),
    ) -> None:
        self.dsn = postgres.dsn(postgres.new_database("b"))
        self.workdir = workdir
        self.owner_lease = owner_lease
        self.flags = flags
        self.starts = 0
        self.servers: list[ServerProcess] = []
        for slot in range(size):
            self.servers.append(self._start(slot))

    def _start(self, slot: int) -> ServerProcess:
        self.starts += 1
        lease = [] if self.owner_lease is None else ["--owner-lease", str(self.owner_lease)]
        return start_outrig_with(
            self.workdir,
            "--backend", "postgres", "--dsn", self.dsn, *lease, "--log-level", "INFO", *self.flags,
            name=f"pg{slot}-{self.starts}",
        )  # fmt: skip

    def restart(self, slot: int) -> None:
        self.servers[slot].stop()
        self.servers[slot] = self._start(slot)

    def kill(self, slot: int) -> None:
        process = self.servers[slot].process
        process.send_signal(signal.SIGKILL)
        process.wait()

    def owner(self, space: str) -> str | None:
        with psycopg.connect(self.dsn, autocommit=True) as connection:
            row = connection.execute(_OWNER_SQL, (space,)).fetchone()
        return None if row is None else str(row[0])

    def epoch(self, space: str) -> int:
        """How many times `space` has been claimed (its epoch)."""
        with psycopg.connect(self.dsn, autocommit=True) as connection:
            row = connection.execute("SELECT epoch FROM outrig_spaces WHERE space = %s", (space,)).fetchone()
        return 0 if row is None else int(row[0])

    def claims_logged(self, space: str) -> list[str]:
        """The servers' log lines saying they claimed `space` (with what they loaded, how fast)."""
        lines = []
        for log in sorted(self.workdir.glob("pg*.log")):
            for line in log.read_text(errors="replace").splitlines():
                if f"space {space!r} claimed" in line or f"space {space!r}: ownership lost" in line:
                    lines.append(f"{log.stem}: {line}")
        return lines

    def slot_of(self, address: str) -> int:
        for slot, server in enumerate(self.servers):
            if server.address == address:
                return slot
        raise RuntimeError(f"no server of the tier is at {address}")

    def claim(self, space: str, through: int = 0) -> str:
        """Touch `space` through server `through` (the tier decides who claims it); its owner."""
        with outrig.connect(self.servers[through].address, space=space, direct=False) as client:
            client.count(Item(kind="touch"))
        owner = self.owner(space)
        if owner is None:
            raise RuntimeError(f"space {space!r} has no live owner after a call on it")
        return owner

    def cpu_sources(self) -> list[CpuSource]:
        return [server.cpu_seconds for server in self.servers]

    def stop(self) -> None:
        for server in self.servers:
            server.stop()

    def logs(self) -> str:
        return " ".join(str(server.log) for server in self.servers)


# ---------------------------------------------------------------- timed runs


@dataclass(frozen=True)
class Run:
    rate: float  # pairs per second
    cpu: dict[str, float]  # CPU seconds per pair, by source name


class Meter:
    """A run's measured window: `warmup` seconds from now, lasting `seconds`; the CPU of each
    source is read at both edges (by a watcher thread, so the clients' loops never wait)."""

    def __init__(self, warmup: float, seconds: float, sources: dict[str, CpuSource]) -> None:
        self.warm = time.monotonic() + warmup
        self.end = self.warm + seconds
        self.seconds = seconds
        self._sources = sources
        self._edges: list[dict[str, float]] = []
        self._watcher = threading.Thread(target=self._watch, name="meter", daemon=True)
        self._watcher.start()

    def _watch(self) -> None:
        for edge in (self.warm, self.end):
            time.sleep(max(0.0, edge - time.monotonic()))
            self._edges.append({name: read() for name, read in self._sources.items()})

    def count(self, now: float) -> int:
        return 1 if self.warm <= now < self.end else 0

    def over(self, now: float) -> bool:
        return now >= self.end

    def result(self, units: int) -> Run:
        self._watcher.join()
        first, last = self._edges
        per = 1 / units if units else float("nan")
        return Run(units / self.seconds, {name: (last[name] - first[name]) * per for name in first})


def _pairs_sync(address: str, space: str, meter_of: Callable[[], Meter]) -> Run:
    with outrig.connect(address, space=space) as client:
        client.count(Item(kind="touch"))
        entry, template = Item(kind="pair", client=0, note=_NOTE), Item(kind="pair", client=0)
        meter, done = meter_of(), 0
        while True:
            client.write(entry, lease=_LEASE)
            if client.take(template, timeout=_WAIT) is None:
                raise RuntimeError("a take found nothing")
            now = time.monotonic()
            if meter.over(now):
                return meter.result(done)
            done += meter.count(now)


async def _pair_task(client: outrig.aio.AsyncSpace, number: int, meter: Meter) -> int:
    entry, template = Item(kind="pair", client=number, note=_NOTE), Item(kind="pair", client=number)
    done = 0
    while True:
        await client.write(entry, lease=_LEASE)
        if await client.take(template, timeout=_WAIT) is None:
            raise RuntimeError("a take found nothing")
        now = time.monotonic()
        if meter.over(now):
            return done
        done += meter.count(now)


async def _pairs_async(placement: list[tuple[str, str, int]], meter_of: Callable[[], Meter]) -> Run:
    """`tasks` asyncio clients per (address, space, tasks): one connection per space, shared."""
    clients = [outrig.aio.connect(address, space=space) for address, space, _ in placement]
    try:
        await asyncio.gather(*(client.count(Item(kind="touch")) for client in clients))
        meter = meter_of()
        loops: list[Awaitable[int]] = []
        number = 0
        for client, (_, _, tasks) in zip(clients, placement, strict=True):
            for _ in range(tasks):
                loops.append(_pair_task(client, number, meter))
                number += 1
        done = sum(await asyncio.gather(*loops))
    finally:
        await asyncio.gather(*(client.close() for client in clients))
    return meter.result(done)


@dataclass
class Settings:
    seconds: float
    warmup: float
    rounds: int
    kills: int
    entries: int
    owner_lease: float | None
    latency_ops: int
    runner: asyncio.Runner  # one event loop for every asyncio client (grpc.aio wants one per process)


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:,.0f}"


def _one_space(address: str, clients: int, sources: dict[str, CpuSource], settings: Settings) -> Run:
    """Pairs on the space "bench" at `address`: one blocking client, or `clients` asyncio tasks
    sharing a connection; metered from `sources`."""

    def meter() -> Meter:
        return Meter(settings.warmup, settings.seconds, sources)

    if clients == 1:
        return _pairs_sync(address, "bench", meter)
    return settings.runner.run(_pairs_async([(address, "bench", clients)], meter))


# ---------------------------------------------------------------- part a


def part_a(postgres: PostgresServer, root: Path, settings: Settings) -> None:
    print("## a. one space: embedded durable vs the owner backend with one server")
    configurations = ["embedded", "owner"]
    results: dict[tuple[str, int], list[Run]] = collections.defaultdict(list)
    for round_number in range(settings.rounds):
        order = configurations[round_number % 2 :] + configurations[: round_number % 2]
        for name in order:
            for clients in (1, 10):
                workdir = Path(tempfile.mkdtemp(dir=root))
                sources: dict[str, CpuSource] = {"client": _client_cpu}
                tier: Tier | None = None
                if name == "embedded":
                    server = start_durable_outrig(workdir, "--log-level", "WARNING", name="embedded")
                    stop = server.stop
                else:
                    tier = Tier(postgres, workdir, 1, settings.owner_lease)
                    server, stop = tier.servers[0], tier.stop
                    sources["postgres"] = PostgresCpu(postgres.port).seconds
                    sources["wal_records"], sources["wal_bytes"] = (
                        _wal_counter(postgres, 0),
                        _wal_counter(postgres, 1),
                    )
                sources["server"] = server.cpu_seconds
                try:
                    run = _one_space(server.address, clients, sources, settings)
                finally:
                    stop()
                results[(name, clients)].append(run)
                print(f"  round {round_number + 1} {name} {clients} client(s): {run.rate:,.0f} pairs/s")
    print()
    print("| backend | clients | pairs/s (median) | min | max | vs embedded | server CPU us/pair | "
          "PostgreSQL CPU us/pair | client CPU us/pair | WAL records/pair | WAL bytes/pair |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    ratios = {}
    for clients in (1, 10):
        base = _median([r.rate for r in results[("embedded", clients)]])
        for name in configurations:
            runs = results[(name, clients)]
            rate = _median([r.rate for r in runs])
            if name == "owner":
                ratios[clients] = rate / base
            pg = _us(_median([r.cpu["postgres"] for r in runs])) if name == "owner" else "-"
            wal = (
                f"{_median([r.cpu['wal_records'] for r in runs]):.1f} | "
                f"{_median([r.cpu['wal_bytes'] for r in runs]):,.0f}"
                if name == "owner"
                else "- | -"
            )
            print(
                f"| {name} | {clients} | {rate:,.0f} | {min(r.rate for r in runs):,.0f} | "
                f"{max(r.rate for r in runs):,.0f} | {rate / base:.2f} | "
                f"{_us(_median([r.cpu['server'] for r in runs]))} | {pg} | "
                f"{_us(_median([r.cpu['client'] for r in runs]))} | {wal} |"
            )
    print()
    print(f"ratios: owner_1={ratios[1]:.2f} (target >= 0.7) owner_10={ratios[10]:.2f} (target >= 0.8)")
    print()


# ---------------------------------------------------------------- part b

_SPACES = 6
_TASKS_PER_SPACE = 2


def part_b(postgres: PostgresServer, root: Path, settings: Settings) -> None:
    print(
        f"## b. {_SPACES} spaces, {_TASKS_PER_SPACE} asyncio clients each (one connection per space, "
        "to its owner): a tier of 3 vs a tier of 1"
    )
    sizes = [1, 3]
    results: dict[int, list[Run]] = collections.defaultdict(list)
    spreads: dict[int, list[int]] = {}
    for round_number in range(settings.rounds):
        order = sizes[round_number % 2 :] + sizes[: round_number % 2]
        for size in order:
            tier = Tier(postgres, Path(tempfile.mkdtemp(dir=root)), size, settings.owner_lease)
            try:
                placement = []
                for number in range(_SPACES):
                    space = f"bench-{number}"
                    placement.append((tier.claim(space, through=number % size), space, _TASKS_PER_SPACE))
                spreads[size] = [sum(1 for p in placement if p[0] == s.address) for s in tier.servers]
                servers = tier.cpu_sources()
                sources: dict[str, CpuSource] = {
                    "servers": lambda: sum(read() for read in servers),  # noqa: B023
                    "postgres": PostgresCpu(postgres.port).seconds,
                    "client": _client_cpu,
                }

                def meter() -> Meter:
                    return Meter(settings.warmup, settings.seconds, sources)  # noqa: B023

                run = settings.runner.run(_pairs_async(placement, meter))
            finally:
                tier.stop()
            results[size].append(run)
            print(
                f"  round {round_number + 1} tier of {size}: {run.rate:,.0f} pairs/s "
                f"(spaces per server {spreads[size]})"
            )
    print()
    print("| tier | spaces per server | pairs/s (median) | min | max | vs tier of 1 | "
          "outrig CPU us/pair | PostgreSQL CPU us/pair | client CPU us/pair |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    base = _median([r.rate for r in results[1]])
    for size in sizes:
        runs = results[size]
        rate = _median([r.rate for r in runs])
        print(
            f"| {size} | {spreads[size]} | {rate:,.0f} | {min(r.rate for r in runs):,.0f} | "
            f"{max(r.rate for r in runs):,.0f} | {rate / base:.2f} | "
            f"{_us(_median([r.cpu['servers'] for r in runs]))} | "
            f"{_us(_median([r.cpu['postgres'] for r in runs]))} | "
            f"{_us(_median([r.cpu['client'] for r in runs]))} |"
        )
    print()
    three = results[3]
    per_pair = _median([r.cpu["servers"] + r.cpu["postgres"] for r in three])
    print(
        f"tier of 3: {_us(per_pair)} us of server-side CPU per pair (outrig + PostgreSQL): about "
        f"{1 / per_pair:,.0f} pairs/s per core of servers, clients not counted"
    )
    print()


# ---------------------------------------------------------------- part c

_TAKEOVER_SPACE = "takeover"
_LOAD_CLIENTS = 3
_PROBE_TIMEOUT = 0.5  # seconds one probe may take before it counts as failed
_SERVED_DEADLINE = 60.0  # seconds after a kill the space is given to be served again


@dataclass
class Ledger:
    """What one load client saw: writes acknowledged, writes in doubt (failed), entries returned
    by takes, takes that failed (an entry may have been taken without being returned)."""

    acknowledged: set[tuple[int, int]] = field(default_factory=set)
    doubtful: set[tuple[int, int]] = field(default_factory=set)
    taken: list[tuple[int, int]] = field(default_factory=list)
    failed_takes: int = 0
    empty_takes: int = 0
    errors: collections.Counter[str] = field(default_factory=collections.Counter)
    first_pair_after: float | None = None  # time.monotonic() of the first pair done after the kill


def _id(entry: object) -> tuple[int, int]:
    """A pair entry's id: (client, n)."""
    if not isinstance(entry, Item) or entry.client is None or entry.n is None:
        raise RuntimeError(f"not a pair entry: {entry!r}")
    return entry.client, entry.n


def _load(address: str, number: int, stop: threading.Event, killed: list[float], ledger: Ledger) -> None:
    """Pairs through `address` (forwarded: direct=False) until `stop`, with the SDK's retries (30 s)."""
    template = Item(kind="pair", client=number)
    n = 0
    with outrig.connect(address, space=_TAKEOVER_SPACE, direct=False) as client:
        while not stop.is_set():
            n += 1
            try:
                client.write(Item(kind="pair", client=number, n=n, note=_NOTE), lease=_LEASE)
            except outrig.OutrigError as err:
                ledger.doubtful.add((number, n))
                ledger.errors[type(err).__name__] += 1
                continue
            ledger.acknowledged.add((number, n))
            try:
                got = client.take(template, timeout=_WAIT)
            except outrig.OutrigError as err:
                ledger.failed_takes += 1
                ledger.errors[type(err).__name__] += 1
                continue
            if got is None:
                ledger.empty_takes += 1
                continue
            ledger.taken.append(_id(got))
            if killed and ledger.first_pair_after is None and time.monotonic() > killed[0]:
                ledger.first_pair_after = time.monotonic()


async def _probe_until_served(addresses: list[str], deadline: float) -> tuple[float | None, int]:
    """Short calls (count, no retries, `_PROBE_TIMEOUT` each) through `addresses` in turn until
    one succeeds; (its time.monotonic(), or None if none did by `deadline`; the probes that
    failed)."""
    clients = [
        outrig.aio.connect(a, space=_TAKEOVER_SPACE, retry_deadline=0.0, direct=False) for a in addresses
    ]
    failed = 0
    try:
        while time.monotonic() < deadline:
            for client in clients:
                try:
                    await asyncio.wait_for(client.count(Item(kind="probe")), _PROBE_TIMEOUT)
                except (outrig.OutrigError, TimeoutError):
                    failed += 1
                    await asyncio.sleep(0.01)
                    continue
                return time.monotonic(), failed
        return None, failed
    finally:
        await asyncio.gather(*(client.close() for client in clients))


def _contents(address: str) -> tuple[collections.Counter[tuple[int, int]], int]:
    """The pair entries in the takeover space (by id, with multiplicity) and the filler count."""
    with outrig.connect(address, space=_TAKEOVER_SPACE) as client:
        present: collections.Counter[tuple[int, int]] = collections.Counter()
        for entry in client.contents(Item(kind="pair")):
            present[_id(entry)] += 1
        return present, client.count(Item(kind="filler"))


def _fill(address: str, entries: int) -> float:
    started = time.perf_counter()
    with outrig.connect(address, space=_TAKEOVER_SPACE) as client:
        for start in range(0, entries, 1000):
            batch = [Item(kind="filler", n=n, note=_NOTE) for n in range(start, min(entries, start + 1000))]
            client.write_many(batch, lease=outrig.FOREVER)
    return time.perf_counter() - started


def part_c(postgres: PostgresServer, root: Path, settings: Settings) -> None:
    print(
        f"## c. takeover: one space of {settings.entries:,} entries, 3 servers, {_LOAD_CLIENTS} "
        f"clients doing pairs through a non-owner server, the owner SIGKILLed ({settings.kills} kills)"
    )
    # the servers' logs are kept (their paths are printed) for a look at a takeover
    tier = Tier(postgres, Path(tempfile.mkdtemp(prefix="outrig-owners-c-")), 3, settings.owner_lease)
    served_after: list[float] = []
    pair_after: list[float] = []
    problems: list[str] = []
    try:
        owner = tier.claim(_TAKEOVER_SPACE)
        print(f"  filled {settings.entries:,} entries in {_fill(owner, settings.entries):.1f} s")
        all_acknowledged: set[tuple[int, int]] = set()
        all_doubtful: set[tuple[int, int]] = set()
        all_taken: collections.Counter[tuple[int, int]] = collections.Counter()
        for kill in range(settings.kills):
            owner_address = tier.owner(_TAKEOVER_SPACE)
            if owner_address is None:
                owner_address = tier.claim(_TAKEOVER_SPACE)
            victim = tier.slot_of(owner_address)
            survivors = [s.address for slot, s in enumerate(tier.servers) if slot != victim]
            stop, killed = threading.Event(), list[float]()
            ledgers = [Ledger() for _ in range(_LOAD_CLIENTS)]
            threads = [
                threading.Thread(
                    target=_load,
                    args=(survivors[i % 2], 1000 * (kill + 1) + i, stop, killed, ledgers[i]),
                    name=f"load-{i}",
                )
                for i in range(_LOAD_CLIENTS)
            ]
            for thread in threads:
                thread.start()
            time.sleep(max(1.0, settings.seconds / 2))  # load running before the kill: not a wait for a state
            before = sum(len(ledger.taken) for ledger in ledgers)
            epoch = tier.epoch(_TAKEOVER_SPACE)
            logged = set(tier.claims_logged(_TAKEOVER_SPACE))
            killed_at = time.monotonic()
            tier.kill(victim)
            killed.append(killed_at)
            served_at, failed = settings.runner.run(
                _probe_until_served(survivors, killed_at + _SERVED_DEADLINE)
            )
            if served_at is None:
                served = f"NOT served again within {_SERVED_DEADLINE:g} s"
                problems.append(f"kill {kill + 1}: {served}")
            else:
                served_after.append(served_at - killed_at)
                served = f"served again after {served_at - killed_at:.2f} s"
            time.sleep(1.0)  # let the load run on after the takeover
            stop.set()
            for thread in threads:
                thread.join(60)
            new_owner = tier.owner(_TAKEOVER_SPACE)
            claims = tier.epoch(_TAKEOVER_SPACE) - epoch
            if claims != 1:
                problems.append(f"kill {kill + 1}: {claims} claims of the space (1 expected)")
            firsts = [ledger.first_pair_after for ledger in ledgers if ledger.first_pair_after is not None]
            if firsts:
                pair_after.append(min(firsts) - killed_at)
            errors: collections.Counter[str] = collections.Counter()
            for ledger in ledgers:
                all_acknowledged |= ledger.acknowledged
                all_doubtful |= ledger.doubtful
                all_taken.update(ledger.taken)
                errors.update(ledger.errors)
            try:
                present, fillers = _contents(new_owner or survivors[0])
            except outrig.OutrigError as err:
                problems.append(f"kill {kill + 1}: the space's contents could not be read ({err})")
                present, fillers = collections.Counter(), -1
            twice = [i for i, times in all_taken.items() if times > 1]
            back = [i for i in all_taken if i in present]
            duplicated = [i for i, times in present.items() if times > 1]
            lost = [i for i in all_acknowledged if i not in present and i not in all_taken]
            failed_takes = sum(ledger.failed_takes for ledger in ledgers)
            found = {
                "taken twice": len(twice),
                "taken but back in the space": len(back),
                "stored twice": len(duplicated),
                "acknowledged, neither present nor taken": len(lost),
                "fillers missing": settings.entries - fillers,
            }
            if fillers < 0:  # the contents could not be read: nothing to check them against
                found = {}
            bad = {what: count for what, count in found.items() if count}
            print(
                f"  kill {kill + 1}: {Path(tier.servers[victim].log).name} killed; "
                f"{served} through another server ({failed} failed probes), new "
                f"owner {new_owner} ({claims} claim(s)); pairs {before:,} before the kill, "
                f"{sum(len(ledger.taken) for ledger in ledgers) - before:,} after; "
                f"client errors {dict(errors) or 'none'}; failed takes {failed_takes} (an entry "
                f"taken by one may be the 'neither' kind); "
                f"empty takes {sum(ledger.empty_takes for ledger in ledgers)}; checks: "
                + ("all hold" if not bad else f"VIOLATED {bad}")
            )
            for line in tier.claims_logged(_TAKEOVER_SPACE):
                if line not in logged:
                    print(f"    {line}")
            if bad:
                problems.append(f"kill {kill + 1}: {bad} (e.g. {(twice + back + duplicated + lost)[:5]})")
            tier.restart(victim)
    finally:
        tier.stop()
    print()
    print(
        f"takeover: served again through another server after median {_median(served_after):.2f} s "
        f"(min {min(served_after, default=math.nan):.2f}, max {max(served_after, default=math.nan):.2f}, "
        f"{len(served_after)} of {settings.kills} kills; owner lease "
        f"{settings.owner_lease or 3.0:g} s, {settings.entries:,} entries loaded); first pair of the "
        f"load after median {_median(pair_after):.2f} s"
    )
    print(
        "checks: "
        + ("every acknowledged write present or taken once, no take twice, nothing taken back, "
           "no filler lost" if not problems else "; ".join(problems))
    )  # fmt: skip
    print(f"server logs: {tier.logs()}")
    print()


# ---------------------------------------------------------------- part d


def _latencies(client: outrig.Space, op: str, count: int) -> list[float]:
    entry, template = Item(kind="lat", client=0, note=_NOTE), Item(kind="lat", client=0)
    read_template = Item(kind="fixed")
    samples = []
    for _ in range(count):
        began = time.perf_counter()
        if op == "pair":
            client.write(entry, lease=_LEASE)
            if client.take(template, timeout=_WAIT) is None:
                raise RuntimeError("a take found nothing")
        elif client.read(read_template, timeout=_WAIT) is None:
            raise RuntimeError("a read found nothing")
        samples.append(time.perf_counter() - began)
    return samples


_CPU_SIDES = ("owner", "forwarder", "client")


def part_d(postgres: PostgresServer, root: Path, settings: Settings) -> None:
    print("## d. forwarded (through a non-owner server) vs direct (on the owner), 1 blocking client")
    tier = Tier(postgres, Path(tempfile.mkdtemp(dir=root)), 2, settings.owner_lease)
    paths = ["direct", "forwarded"]
    ops = ["pair", "read"]
    samples: dict[tuple[str, str], list[float]] = collections.defaultdict(list)
    cpu: dict[tuple[str, str], list[dict[str, float]]] = collections.defaultdict(list)
    try:
        owner = tier.claim("bench")
        other = next(s for s in tier.servers if s.address != owner)
        owner_server = tier.servers[tier.slot_of(owner)]
        with outrig.connect(owner, space="bench") as setup:
            setup.write(Item(kind="fixed", note=_NOTE), lease=outrig.FOREVER)
        for round_number in range(settings.rounds):
            order = paths[round_number % 2 :] + paths[: round_number % 2]
            for path in order:
                address = owner if path == "direct" else other.address
                # direct=False: the SDK would otherwise find the owner and skip the hop measured.
                with outrig.connect(address, space="bench", direct=False) as client:
                    for op in ops:
                        _latencies(client, op, max(20, settings.latency_ops // 10))  # warm-up
                        first = (owner_server.cpu_seconds(), other.cpu_seconds(), time.process_time())
                        samples[(path, op)] += _latencies(client, op, settings.latency_ops)
                        last = (owner_server.cpu_seconds(), other.cpu_seconds(), time.process_time())
                        per_op = [(b - a) / settings.latency_ops for a, b in zip(first, last, strict=True)]
                        cpu[(path, op)].append(dict(zip(_CPU_SIDES, per_op, strict=True)))
    finally:
        tier.stop()
    print()
    print("| operation | path | median us | p99 us | vs direct (median) | client CPU us/op | "
          "owner CPU us/op | forwarding server CPU us/op |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for op in ops:
        base = statistics.median(samples[("direct", op)])
        for path in paths:
            values = sorted(samples[(path, op)])
            median = statistics.median(values)
            p99 = values[min(len(values) - 1, int(len(values) * 0.99))]
            spent = cpu[(path, op)]
            forwarder = _us(_median([s["forwarder"] for s in spent])) if path == "forwarded" else "-"
            label = "write+take pair" if op == "pair" else "read"
            print(
                f"| {label} | {path} | {_us(median)} | {_us(p99)} | {median / base:.2f} | "
                f"{_us(_median([s['client'] for s in spent]))} | "
                f"{_us(_median([s['owner'] for s in spent]))} | {forwarder} |"
            )
    print()


# ---------------------------------------------------------------- main

# ---------------------------------------------------------------- part e


def _log_bytes_per_change(dsn: str) -> float:
    """The change log's size in the database (table, TOAST and index) over its rows."""
    with psycopg.connect(dsn, autocommit=True) as connection:
        row = connection.execute(
            "SELECT pg_total_relation_size('outrig_changes'), (SELECT count(*) FROM outrig_changes)"
        ).fetchone()
    assert row is not None
    return row[0] / row[1] if row[1] else float("nan")


def part_e(postgres: PostgresServer, root: Path, settings: Settings) -> None:
    print("## e. the change log's write cost: one space on one owner server, log off (baseline) vs on")
    configurations = ["off", "on"]
    results: dict[tuple[str, int], list[Run]] = collections.defaultdict(list)
    log_bytes: list[float] = []
    for round_number in range(settings.rounds):
        order = configurations[round_number % 2 :] + configurations[: round_number % 2]
        for name in order:
            for clients in (1, 10):
                workdir = Path(tempfile.mkdtemp(dir=root))
                config = workdir / "outrig.toml"
                config.write_text(f"[space_defaults]\nchanges = {'true' if name == 'on' else 'false'}\n")
                tier = Tier(postgres, workdir, 1, settings.owner_lease, ("--config", str(config)))
                server = tier.servers[0]
                sources: dict[str, CpuSource] = {
                    "server": server.cpu_seconds,
                    "postgres": PostgresCpu(postgres.port).seconds,
                    "wal_bytes": _wal_counter(postgres, 1),
                }
                try:
                    run = _one_space(server.address, clients, sources, settings)
                    if name == "on":
                        log_bytes.append(_log_bytes_per_change(tier.dsn))
                finally:
                    tier.stop()
                results[(name, clients)].append(run)
                print(f"  round {round_number + 1} log {name} {clients} client(s): {run.rate:,.0f} pairs/s")
    print()
    print("| log | clients | pairs/s (median) | min | max | time per pair vs off | server CPU us/pair | "
          "PostgreSQL CPU us/pair | WAL bytes/pair |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    ratios = {}
    for clients in (1, 10):
        base = _median([r.rate for r in results[("off", clients)]])
        for name in configurations:
            runs = results[(name, clients)]
            rate = _median([r.rate for r in runs])
            ratios[(name, clients)] = base / rate
            print(
                f"| {name} | {clients} | {rate:,.0f} | {min(r.rate for r in runs):,.0f} | "
                f"{max(r.rate for r in runs):,.0f} | {base / rate:.2f} | "
                f"{_us(_median([r.cpu['server'] for r in runs]))} | "
                f"{_us(_median([r.cpu['postgres'] for r in runs]))} | "
                f"{_median([r.cpu['wal_bytes'] for r in runs]):,.0f} |"
            )
    print()
    print(
        f"ratios (time per pair, log on / off; target <= 1.1): 1 client {ratios[('on', 1)]:.2f}, "
        f"10 clients {ratios[('on', 10)]:.2f}; log bytes per change in PostgreSQL (median over "
        f"runs): {_median(log_bytes):,.0f}"
    )
    print()


PARTS: dict[str, Callable[[PostgresServer, Path, Settings], None]] = {
    "a": part_a,
    "b": part_b,
    "c": part_c,
    "d": part_d,
    "e": part_e,
}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="1 round of 1.5 s runs, 2 kills, 300 ops")
    parser.add_argument("--part", choices=sorted(PARTS), action="append", help="only this part (repeatable)")
    parser.add_argument("--seconds", type=float, default=4.0, help="length of a measured run")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--kills", type=int, default=5, help="part c: owners killed")
    parser.add_argument("--entries", type=int, default=100_000, help="part c: entries in the space")
    parser.add_argument("--latency-ops", type=int, default=2000, help="part d: calls per path and round")
    parser.add_argument("--owner-lease", type=float, help="the servers' --owner-lease (default: theirs, 3 s)")
    args = parser.parse_args()
    bindir = find_bindir()
    if bindir is None:
        sys.exit("bench/owners.py needs PostgreSQL's server binaries (initdb, postgres)")
    parts = args.part or sorted(PARTS)
    with (
        asyncio.Runner() as runner,
        running_postgres(bindir, fsync=True) as postgres,
        tempfile.TemporaryDirectory(prefix="outrig-owners-") as directory,
    ):
        settings = Settings(
            seconds=1.5 if args.quick else args.seconds,
            warmup=0.5 if args.quick else 1.0,
            rounds=1 if args.quick else args.rounds,
            kills=2 if args.quick else args.kills,
            entries=args.entries,
            owner_lease=args.owner_lease,
            latency_ops=300 if args.quick else args.latency_ops,
            runner=runner,
        )
        print(
            f"outrig owner-backend bench: cores={os.cpu_count()}, Python {sys.version.split()[0]}; "
            f"load average before: {os.getloadavg()[0]:.2f}; parts {', '.join(parts)}; "
            f"{settings.rounds} round(s) x {settings.seconds:g} s (after {settings.warmup:g} s warm-up)"
        )
        print(postgres.version)
        print()
        for part in parts:
            began = time.monotonic()
            PARTS[part](postgres, Path(directory), settings)
            print(f"(part {part}: {time.monotonic() - began:.0f} s; load average {os.getloadavg()[0]:.2f})")
            print(flush=True)
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
