"""The SDK client's instructions per write+take pair, counted by valgrind's callgrind: the client's
CPU per operation, which the load of a shared machine does not move.

    python bench/client_instructions.py [--python PATH ...] [--pairs N1,N2] [--shapes sync,aio1,aio10,redis]

One in-memory `outrig serve` of this checkout runs outside valgrind for the whole run. For each
interpreter given (default: this one; another checkout's `.venv/bin/python` imports that
checkout's SDK) and each client shape, a client process runs under ``valgrind --tool=callgrind``
twice, doing N1 and then N2 pairs after the same warm-up (PYTHONHASHSEED=0); the difference of the
two totals over N2 - N1 is the client's instructions (Ir) per pair, start-up, imports and
connecting cancelled out. callgrind counts every thread of the process together: gRPC's C core's
threads and the Mux stream's sending and reading threads too. A pair is bench/mux.py's: write one
small entry (bench/workloads.py's pair entry, lease 300 s), then take it back (its client number
set in the template, timeout 10 s). Shapes:
  - ``sync``: one blocking `outrig.Space` (over its Mux stream, the default);
  - ``unary``: the same with ``mux=False``;
  - ``aio1``: one `outrig.aio.AsyncSpace`, one task;
  - ``aio10``: one AsyncSpace, 10 tasks, each doing N / 10 of the pairs;
  - ``canned``: the blocking Space with its Mux stream replaced by one that answers at once with
    canned replies, on a channel that never connects: the SDK's own Python per pair (building
    requests, encoding, the call's layers, decoding), without gRPC, its threads or the server. It
    reaches into the SDK's internals (as they are at fa09113 and since). The shapes through gRPC
    move by about 1% from run to run (threads wake on timers, and the interpreter switches
    threads at times, not at instructions); this one does not;
  - ``redis``: for scale, redis-py's blocking client doing LPUSH + BRPOP of the same bytes
    against a `redis-server` of its own (this interpreter's redis package; skipped when
    redis-server is missing).
The client script is this file, run by the given interpreter with only `outrig` (and `redis`)
imported, so a checkout without this bench can be measured. Needs valgrind; a client under it
runs about 50 times slower, so a shape takes a minute or two. Asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from callgrind import counted

import outrig

SPACE = "bench-client"
WARMUP = 50  # pairs before the counted ones: caches, the stream, the first Locate
LEASE = 300.0
WAIT = 10.0
TASKS = 10
SHAPES = ("sync", "aio1", "aio10", "canned", "redis")
ALL_SHAPES = ("sync", "unary", "aio1", "aio10", "canned", "redis")


# ---------------------------------------------------------------- the client process


@dataclass
class Small(outrig.Entry, type_name="bench.Small"):
    """bench/entries.py's pair entry, declared here: another checkout's interpreter runs this file
    (with its own SDK), and the entry must be bench/mux.py's (same type name, same fields)."""

    key: int | None = None
    client: int | None = None
    group: str | None = None
    note: str | None = None


def _pair(number: int) -> tuple[Small, Small]:
    return Small(key=1000, client=number, group="pair", note="x" * 32), Small(client=number)


def _client_sync(address: str, pairs: int, mux: bool) -> None:
    entry, template = _pair(0)
    with outrig.connect(address, space=SPACE, mux=mux) as space:
        for _ in range(WARMUP + pairs):
            space.write(entry, lease=LEASE)
            if space.take(template, timeout=WAIT) is None:
                raise SystemExit("a take of the entry just written found nothing")


def _client_async(address: str, pairs: int, tasks: int) -> None:
    import outrig.aio

    async def run() -> None:
        async with outrig.aio.connect(address, space=SPACE) as space:

            async def loop(number: int, count: int) -> None:
                entry, template = _pair(number)
                for _ in range(count):
                    await space.write(entry, lease=LEASE)
                    if await space.take(template, timeout=WAIT) is None:
                        raise SystemExit("a take of the entry just written found nothing")

            await asyncio.gather(*(loop(n, WARMUP // tasks) for n in range(tasks)))
            await asyncio.gather(*(loop(n, pairs // tasks) for n in range(tasks)))

    asyncio.run(run())


class _CannedStream:
    """Stands for the blocking SDK's Mux stream (`outrig._mux._Stream`): answers a write and a
    take at once with replies made here, so that what is counted is the SDK's own Python."""

    ended = False
    unsupported = False

    def __init__(self) -> None:
        from outrig._mux_wire import OP_FIELDS, outcome
        from outrig.v1 import space_pb2 as pb

        self._write_field, self._outcome = OP_FIELDS["Write"], outcome
        self._written = pb.MuxResult(id=1)
        self._written.write.lease.id, self._written.write.lease.granted_seconds = 5, LEASE
        self._taken = pb.MuxResult(id=2)
        self._taken.match.entries.add().MergeFromString(outrig.entry_to_bytes(_pair(0)[0]))

    def call(self, field: int, data: bytes) -> object:
        return self._outcome(self._written if field == self._write_field else self._taken)


def _client_canned(address: str, pairs: int) -> None:
    entry, template = _pair(0)
    # No call reaches the server: the channel never connects, so no thread of gRPC's or of the
    # stream runs beside the caller (their wake-ups on timers made the count move by 1-3%).
    with outrig.connect(address, space=SPACE) as space:
        canned = _CannedStream()
        connection = space._connection  # the SDK's internals, as they are at fa09113 and since
        connection.home.mux._current = lambda: canned
        connection.locate_due(SPACE)  # what the space's first call asks and is told: served here
        connection.located(SPACE, None, again=False)
        for _ in range(WARMUP + pairs):
            space.write(entry, lease=LEASE)
            if space.take(template, timeout=WAIT) is None:
                raise SystemExit("the canned take found nothing")


def _client_redis(address: str, pairs: int) -> None:
    import redis

    host, _, port = address.rpartition(":")
    client = redis.Redis(host=host, port=int(port))
    payload = outrig.entry_to_bytes(_pair(0)[0])  # the bytes outrig's pair carries
    key = "bench:client:0"
    try:
        for _ in range(WARMUP + pairs):
            client.lpush(key, payload)
            if client.brpop([key], timeout=WAIT) is None:
                raise SystemExit("a BRPOP of the value just pushed found nothing")
    finally:
        client.close()


def client(shape: str, address: str, pairs: int) -> None:
    if shape in ("sync", "unary"):
        _client_sync(address, pairs, mux=shape == "sync")
    elif shape == "aio1":
        _client_async(address, pairs, 1)
    elif shape == "aio10":
        _client_async(address, pairs, TASKS)
    elif shape == "canned":
        _client_canned(address, pairs)
    elif shape == "redis":
        _client_redis(address, pairs)
    else:
        raise SystemExit(f"unknown shape {shape!r}")


# ---------------------------------------------------------------- counting


@dataclass(frozen=True)
class Count:
    low: int
    high: int
    pairs: int  # N2 - N1

    @property
    def per_pair(self) -> float:
        return (self.high - self.low) / self.pairs


def instructions(python: str, shape: str, address: str, pairs: int, out: str = "/dev/null") -> int:
    """callgrind's instruction count of one client process doing `pairs` pairs (after WARMUP)."""
    command = [
        str(Path(python).absolute()),
        str(Path(__file__).resolve()),
        "--client",
        shape,
        "--address",
        address,
        "--count",
        str(pairs),
    ]
    return counted(command, out=out, what=f"the {shape} client")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--python", action="append", help="an interpreter (repeatable); default this one")
    parser.add_argument("--pairs", default="100,600", help="the two run sizes (default 100,600)")
    parser.add_argument(
        "--shapes", default=",".join(SHAPES), help=f"of {', '.join(ALL_SHAPES)} (default {','.join(SHAPES)})"
    )
    parser.add_argument("--profile", metavar="DIR", help="keep the N2 runs' callgrind files in DIR")
    parser.add_argument("--client", help=argparse.SUPPRESS)
    parser.add_argument("--address", help=argparse.SUPPRESS)
    parser.add_argument("--count", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.client:
        client(args.client, args.address, args.count)
        return
    from servers import redis_available, start_outrig, start_redis, stop_all

    small, large = (int(n) for n in args.pairs.split(","))
    shapes = args.shapes.split(",")
    pythons = args.python or [sys.executable]
    version = sys.version.split()[0]
    print(f"client instructions per pair (callgrind), {os.cpu_count()} cores, Python {version}")
    print(f"pairs {small} and {large} after {WARMUP} of warm-up; one in-memory outrig serve of this checkout")
    workdir = Path(tempfile.mkdtemp(prefix="outrig-client-ir-"))
    servers = [start_outrig(workdir)]
    try:
        if "redis" in shapes and redis_available():
            servers.append(start_redis(workdir))
        for shape in shapes:
            if shape == "redis":
                if len(servers) < 2:
                    print("redis: skipped, no redis-server (apt-get install -y redis-server)")
                    continue
                runs = [sys.executable]  # redis-py is the same whichever checkout
                address = servers[1].address
            else:
                runs, address = pythons, servers[0].address
            for python in runs:
                out = "/dev/null"
                if args.profile:
                    Path(args.profile).mkdir(parents=True, exist_ok=True)
                    tag = Path(python).absolute().parents[2].name
                    out = str(Path(args.profile) / f"callgrind.{shape}.{tag}")
                low = instructions(python, shape, address, small)
                high = instructions(python, shape, address, large, out)
                count = Count(low, high, large - small)
                print(
                    f"{shape:<6} {python}: {count.per_pair:,.0f} Ir per pair ({low:,} / {high:,})",
                    flush=True,
                )
    finally:
        stop_all(servers, workdir)


if __name__ == "__main__":
    main()
