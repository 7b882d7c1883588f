"""Two parts of the durable path timed alone, in this interpreter's outrig (run it with each
checkout's interpreter, alternating, and compare the medians; docs/performance.md did 5 each).

    python bench/store_parts.py statements [--pairs N]   # N=0: a lone write's 3 records
    python bench/store_parts.py handoff
    python bench/store_parts.py changes [--entries N] [--keep-index | --drop-index]

``statements``: `_Writer.apply` of 200 batches of N pairs' records (a write's put, request and
change; a take's take, request and change of an entry of the batch before), each rolled back, 5
times; the median CPU of this thread per batch, and per pair net of an empty BEGIN/ROLLBACK.
``handoff``: the journal's store thread against a ThreadPoolExecutor: the submitting thread's CPU
per submit that wakes the idle thread (5 x 300, median), the work answering with
`call_soon_threadsafe`. ``changes``: a store whose change log holds N writes (default 50,000)
and then N takes of them (no request ids: their rows are gone, so each write's payload is in its
take's change), then the start-up's recovery of it (`EmbeddedBackend.start`, the recovery
report's seconds) and `outrig check` of it, timed once each; ``--drop-index`` first drops the
index changes_by_entry if this outrig made one, ``--keep-index`` makes it if not (to time the
queries a store of format 4 ran with and without it). Asserts nothing but the changes loaded.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from outrig.service.backends.embedded.store import journal
from outrig.service.backends.embedded.store.schema import open_store
from outrig.service.protocol import codec
from outrig.v1 import space_pb2 as pb


def statements(pairs: int) -> None:
    connection = open_store(Path(tempfile.mkdtemp(prefix="outrig-store-parts-")), "bench")
    fields = {"client": pb.Value(int_value=3), "note": pb.Value(string_value="a small entry of the bench")}
    payload = codec.payload_of(pb.Entry(type_name="bench.Small", fields=fields))
    writer = journal._Writer(connection, codec.entry_bytes)
    lone, count = pairs == 0, max(pairs, 1)

    def batch(base: int, seq: int) -> list[tuple[Any, ...]]:
        records: list[tuple[Any, ...]] = []
        for i in range(count):
            entry_id, request_id = base + i, uuid.uuid4().hex
            records.append(("put", "bench", entry_id, entry_id, 1e10, payload))
            records.append(("request", request_id, "bench", "write", 1e10, entry_id, 1, 1e10, 300.0))
            records.append(("change", "bench", seq + i, "write", entry_id, 1.0, 0, None, None))
        for i in range(0 if lone else count):
            entry_id, request_id = base - count + i, uuid.uuid4().hex
            records.append(("take", "bench", entry_id, request_id, 0, 1e10))
            records.append(("request", request_id, "bench", "take", 1e10, None, 1, None, None))
            records.append(("change", "bench", seq + count + i, "take", entry_id, 1.0, 0, None, payload))
        return records

    batches = [batch(1000 + 100 * k, 10_000 + 100 * k) for k in range(200)]
    writer.apply(batches[0])
    connection.execute("COMMIT")
    times = []
    for _ in range(5):
        started = time.thread_time()
        for records in batches:
            writer.apply(records)
            connection.execute("ROLLBACK")
        times.append((time.thread_time() - started) / len(batches))
    started = time.thread_time()
    for _ in batches:
        connection.execute("BEGIN IMMEDIATE")
        connection.execute("ROLLBACK")
    empty = (time.thread_time() - started) / len(batches)
    median = statistics.median(times)
    what = "a lone write's 3 records" if lone else f"{count} pairs' {len(batches[1])} records"
    print(
        f"{sys.executable}: apply of {what}: {median * 1e6:.1f} us per batch "
        f"({(median - empty) * 1e6 / count:.1f} us per pair net of BEGIN/ROLLBACK's {empty * 1e6:.1f})"
    )


async def handoff() -> None:
    loop = asyncio.get_running_loop()
    pool = ThreadPoolExecutor(max_workers=1)
    for name, target in (("ThreadPoolExecutor", pool), ("the store thread", journal._StoreThread())):
        medians = []
        for _ in range(5):
            cpu, count = 0.0, 300
            for _ in range(count):
                future: asyncio.Future[None] = loop.create_future()
                started = time.thread_time()
                target.submit(loop.call_soon_threadsafe, future.set_result, None)
                cpu += time.thread_time() - started
                await future
            medians.append(cpu / count)
        print(f"{sys.executable}: {name}: {1e6 * statistics.median(medians):.1f} us per submit")
    pool.shutdown()


def changes(entries: int, index: str | None) -> None:
    from outrig.service.backends.embedded.backend import EmbeddedBackend
    from outrig.service.backends.embedded.store.check import check_store
    from outrig.service.config import ServerConfig

    data_dir = Path(tempfile.mkdtemp(prefix="outrig-store-parts-"))
    connection = open_store(data_dir, "bench")
    fields = {"client": pb.Value(int_value=3), "note": pb.Value(string_value="a small entry of the bench")}
    payload = codec.payload_of(pb.Entry(type_name="bench.Small", fields=fields))
    now = time.time()
    with connection:
        connection.execute("BEGIN IMMEDIATE")
        connection.execute("INSERT INTO spaces (no, name, next_id) VALUES (1, 'bench', ?)", (entries + 1,))
        connection.execute("INSERT INTO change_logs (space, epoch, oldest) VALUES (1, 7, 1)")
        connection.executemany(
            "INSERT INTO changes (space, seq, kind, entry_id, at, txn, visible_at, payload) "
            "VALUES (1, ?, ?, ?, ?, 0, NULL, ?)",
            [(n, "write", n, now, None) for n in range(1, entries + 1)]
            + [(entries + n, "take", n, now, payload) for n in range(1, entries + 1)],
        )
    if index == "drop":
        connection.execute("DROP INDEX IF EXISTS changes_by_entry")
    elif index == "keep":
        connection.execute("CREATE INDEX IF NOT EXISTS changes_by_entry ON changes (space, entry_id)")
    indexed = connection.execute(
        "SELECT count(*) FROM sqlite_master WHERE name = 'changes_by_entry'"
    ).fetchone()
    connection.close()

    async def start() -> tuple[float, int]:
        backend = EmbeddedBackend(ServerConfig(data_dir=data_dir))
        await backend.start()
        try:
            report = backend.recovery
            assert report is not None
            log = backend.engine("bench").changes
            assert log is not None
            return report.seconds, log.count
        finally:
            await backend.close()
            await backend.shutdown()

    seconds, loaded = asyncio.run(start())
    assert loaded == 2 * entries, loaded
    started = time.perf_counter()
    report = check_store(data_dir)
    checked = time.perf_counter() - started
    which = "with" if indexed[0] else "without"
    print(
        f"{sys.executable}: {2 * entries:,} changes ({which} changes_by_entry): "
        f"recovery {seconds:.2f} s, check {checked:.2f} s ({report.verdict})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("part", choices=["statements", "handoff", "changes"])
    parser.add_argument(
        "--pairs", type=int, default=5, help="pairs per batch for `statements` (0: a lone write)"
    )
    parser.add_argument("--entries", type=int, default=50_000, help="writes, then takes, for `changes`")
    index = parser.add_mutually_exclusive_group()
    index.add_argument("--keep-index", dest="index", action="store_const", const="keep")
    index.add_argument("--drop-index", dest="index", action="store_const", const="drop")
    args = parser.parse_args()
    if args.part == "statements":
        statements(args.pairs)
    elif args.part == "changes":
        changes(args.entries, args.index)
    else:
        asyncio.run(handoff())


if __name__ == "__main__":
    main()
