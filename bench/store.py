"""The durable path alone: write+take pairs through the embedded backend in one process, no gRPC,
this checkout against another one, in one run.

    python bench/store.py [--baseline-python PATH] [--rounds N] [--seconds S] [--tasks 10,1]

Each run is a child process (this file with ``--child``) of one interpreter: a fresh data dir, an
`EmbeddedBackend` with ``durability = always``, and N asyncio tasks each doing pairs as the SDK
does them (a write of one small entry with a request id and a 300 s lease, then a take of it with
a request id and a timeout), for a warm-up and then S measured seconds. It reports the pairs done
and, at the window's edges, the CPU time of the event loop's thread and of the store's commit
thread (all the process's other threads together), and the store's commits. With
``--baseline-python`` the other checkout's interpreter runs the same child (its outrig is the one
that venv has installed), alternating with this one, the order rotated per round; medians over
the rounds, and after / before. What the rows say: the loop's CPU per pair is what the durable
path costs the thread that also serves gRPC (bench/before_after.py shows the whole server's).
Each run also reports how busy the loop's and the store's threads were (CPU over the window's
wall time). ``--waits`` (this checkout only) times, in the window, where each operation's wall
time goes: from its call to its batch's submission (the engine's work), to the batch's start
(waiting for the commit before it), the batch's statements on the loop, the hand-off to the
store thread, the COMMIT with its fsync, the hop back to the loop, and the caller's resumption;
means in microseconds (means add up; medians would not).
``--instructions N1,N2`` counts instead, with valgrind's callgrind, the instructions per pair of
each interpreter's child (a run of N1 and one of N2 pairs: the difference over N2 - N1), a figure
the load of a shared machine does not move.
Prints the core count and the load average at the start and the end; asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from callgrind import counted

_SPACE = "bench"
_LEASE = 300.0


def _thread_cpu(ident: int | None) -> float:
    if ident is None:
        return 0.0
    return time.clock_gettime(time.pthread_getcpuclockid(ident))


def _process_cpu() -> float:
    return time.clock_gettime(time.CLOCK_PROCESS_CPUTIME_ID)


def _prefill(data_dir: Path, pairs: int, payload: bytes) -> None:
    """What `pairs` earlier pairs leave in a store within the request window: each one's entry
    row, taken by a request id, and its write's and (before format 5) its take's request rows."""
    from outrig.service import software_version
    from outrig.service.backends.embedded.store.schema import open_store, transaction

    connection = open_store(data_dir, software_version())
    until = time.time() + 600.0
    with transaction(connection):
        connection.execute("INSERT INTO spaces (name, next_id) VALUES (?, ?)", (_SPACE, pairs + 1))
        connection.executemany(
            "INSERT INTO entries (space, id, arrival, expires_at, payload, taken_by, taken_position) "
            "VALUES (1, ?, ?, ?, ?, ?, 0)",
            ((n, n, until, payload, uuid.uuid4().hex) for n in range(1, pairs + 1)),
        )
        columns = {row[1] for row in connection.execute("PRAGMA table_info(entries)")}
        if "taken_until" in columns:  # format 4 (a baseline's store may be older)
            connection.execute("UPDATE entries SET taken_until = ?", (until,))
        connection.executemany(
            "INSERT INTO requests (id, space, kind, expires_at, first_id, count, lease_expires_at, granted) "
            "VALUES (?, ?, ?, ?, ?, 1, ?, ?)",
            (
                (
                    uuid.uuid4().hex,
                    _SPACE,
                    kind,
                    until + n * 1e-3,
                    n if kind == "write" else None,
                    until,
                    300.0,
                )
                for n in range(1, pairs + 1)
                for kind in ("write", "take")
            ),
        )
        connection.execute("UPDATE requests SET lease_expires_at = NULL, granted = NULL WHERE kind = 'take'")
        if connection.execute("PRAGMA user_version").fetchone()[0] >= 5:  # a take's id is in its rows only
            connection.execute("DELETE FROM requests WHERE kind = 'take'")
    connection.close()


class _Waits:
    """Timestamps of each batch's steps and each operation's call and answer (``--waits``): the
    journal's methods wrapped on this one instance (they are looked up at each call)."""

    def __init__(self, journal: Any) -> None:
        self.on = False
        # Keyed by the batch itself, which this keeps alive: an id() would be reused.
        self.batches: dict[Any, dict[str, float]] = {}
        self.operations: list[tuple[float, float, float, Any]] = []  # call, submit, answer, batch
        self._submitted: dict[Any, tuple[float, Any]] = {}
        self._journal = journal
        clock = time.perf_counter
        submit, begin, finished = journal.submit, journal._begin, journal._finished
        commit = journal._commit

        def timed_submit(*args: Any, **kwargs: Any) -> Any:
            opening = journal._open is None
            result = submit(*args, **kwargs)
            batch = journal._open
            marks = self.batches.setdefault(batch, {})
            if opening:
                marks["open"] = clock()
            task = asyncio.current_task()
            if task is not None:
                self._submitted[task] = (clock(), batch)
            return result

        def timed_begin() -> None:
            batch = journal._open
            started = clock()
            begin()
            if batch is not None and journal._writing is batch:
                marks = self.batches[batch]
                marks["begin"], marks["handed"] = started, clock()

        def timed_commit(writer: Any, batch: Any, started: float) -> None:
            marks = self.batches[batch]
            marks["commit"] = clock()
            writer_commit = writer.commit

            def committed() -> None:
                writer_commit()
                marks["committed"] = clock()

            writer.commit = committed
            try:
                commit(writer, batch, started)
            finally:
                del writer.commit

        def timed_finished(batch: Any, started: float, error: Any) -> None:
            self.batches[batch]["finished"] = clock()
            finished(batch, started, error)

        journal.submit, journal._begin = timed_submit, timed_begin
        journal._commit, journal._finished = timed_commit, timed_finished

    def answered(self, called: float) -> None:
        task = asyncio.current_task()
        submitted = self._submitted.pop(task, None)
        if self.on and submitted is not None:
            self.operations.append((called, submitted[0], time.perf_counter(), submitted[1]))

    def summary(self) -> dict[str, float]:
        steps: dict[str, list[float]] = {}
        for called, submitted, answered, batch in self.operations:
            marks = self.batches.get(batch, {})
            if not {"begin", "handed", "commit", "committed", "finished"} <= set(marks):
                continue
            points = [
                ("engine, to the submit", called, submitted),
                ("to the batch's start", submitted, marks["begin"]),
                ("the statements (loop)", marks["begin"], marks["handed"]),
                ("hand-off to the store thread", marks["handed"], marks["commit"]),
                ("COMMIT and fsync (store thread)", marks["commit"], marks["committed"]),
                ("hop back to the loop", marks["committed"], marks["finished"]),
                ("to the caller's answer", marks["finished"], answered),
                ("call to answer", called, answered),
            ]
            for name, start, end in points:
                steps.setdefault(name, []).append(1e6 * (end - start))
        return {f"wait: {name}": statistics.fmean(values) for name, values in steps.items()}


async def _child(
    tasks: int,
    seconds: float,
    warmup: float,
    prefill: int = 0,
    waits: bool = False,
    count: int = 0,
    memory: bool = False,
) -> dict[str, float]:
    from outrig.service.backends.embedded.backend import EmbeddedBackend
    from outrig.service.backends.embedded.store.journal import Journal
    from outrig.service.config import ServerConfig
    from outrig.service.engine import NewEntry, Template
    from outrig.service.engine.values import FieldValue
    from outrig.service.protocol import codec
    from outrig.v1 import space_pb2 as pb

    def entry(client: int) -> NewEntry:
        """bench/entries.py's Small: four fields, about 70 bytes encoded."""
        values = {
            "key": FieldValue("int", 0),
            "client": FieldValue("int", client),
            "group": FieldValue("string", "pairs"),
            "note": FieldValue("string", "a small entry of the durable path's bench"),
        }
        fields = {name: codec.value_message(v) for name, v in values.items()}
        message = pb.Entry(type_name="bench.Small", fields=fields)
        return NewEntry("bench.Small", (), values, codec.payload_of(message), message.ByteSize())

    with tempfile.TemporaryDirectory(prefix="outrig-bench-store-") as data_dir:
        if prefill:
            _prefill(Path(data_dir), prefill, entry(0).payload)  # type: ignore[arg-type]
        config = ServerConfig(data_dir=None if memory else Path(data_dir), durability="always")
        backend = EmbeddedBackend(config)
        await backend.start()
        journal = backend.journal
        assert memory or isinstance(journal, Journal)
        counting = [False]
        done = [0]
        timing = _Waits(journal) if waits and journal is not None else None
        clock = time.perf_counter

        async def client(number: int) -> None:
            new = entry(number)
            template = Template("bench.Small", {"client": new.fields["client"]})
            while True:
                called = clock()
                await backend.write(_SPACE, [new], _LEASE, request_id=uuid.uuid4().hex)
                if timing is not None:
                    timing.answered(called)
                    called = clock()
                taken = await backend.match(
                    _SPACE,
                    [template],
                    take=True,
                    max_entries=1,
                    timeout=5.0,
                    if_exists=False,
                    request_id=uuid.uuid4().hex,
                )
                if timing is not None:
                    timing.answered(called)
                assert taken, "a take of the entry just written took nothing"
                if counting[0]:
                    done[0] += 1
                    if done[0] == count:
                        enough.set()
                if memory:  # nothing awaited suspends in memory: let the other tasks run
                    await asyncio.sleep(0)

        enough = asyncio.Event()
        if count:  # a fixed number of pairs from the start (for callgrind), no window
            counting[0] = True
            workers = [asyncio.get_running_loop().create_task(client(n)) for n in range(tasks)]
            await enough.wait()
            for worker in workers:
                worker.cancel()
            await asyncio.gather(*workers, return_exceptions=True)
            await backend.close()
            await backend.shutdown()
            return {"pairs": done[0]}
        workers = [asyncio.get_running_loop().create_task(client(n)) for n in range(tasks)]
        await asyncio.sleep(warmup)
        store = [t for t in threading.enumerate() if t.name.startswith("outrig-store")]
        store_ident = store[0].ident if store else None
        loop_ident = threading.get_ident()
        edges = []
        for phase in (True, False):
            counting[0] = phase
            if timing is not None:
                timing.on = phase
            edges.append(
                (
                    time.perf_counter(),
                    _thread_cpu(loop_ident),
                    _thread_cpu(store_ident),
                    _process_cpu(),
                    journal.statistics().batches if isinstance(journal, Journal) else 0,
                    done[0],
                )
            )
            if phase:
                await asyncio.sleep(seconds)
        for worker in workers:
            worker.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
        await backend.close()
        await backend.shutdown()
    (t0, loop0, store0, proc0, batches0, _), (t1, loop1, store1, proc1, batches1, pairs) = edges
    return {
        "pairs": pairs,
        "seconds": t1 - t0,
        "loop": loop1 - loop0,
        "store": store1 - store0,
        "process": proc1 - proc0,
        "commits": batches1 - batches0,
        **({} if timing is None else timing.summary()),
    }


def _run(
    python: str, tasks: int, seconds: float, warmup: float, prefill: int, waits: bool = False
) -> dict[str, float]:
    options = [f"--tasks={tasks}", f"--seconds={seconds}", f"--warmup={warmup}", f"--prefill={prefill}"]
    options += ["--waits"] if waits else []
    out = subprocess.run([python, __file__, "--child", *options], check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def _counted(python: str, tasks: int, pairs: int, prefill: int, memory: bool = False) -> int:
    """callgrind's instruction count of one child doing `pairs` pairs (every thread's, not the
    kernel's: an fsync counts as its system call)."""
    command = [
        python,
        __file__,
        "--child",
        f"--tasks={tasks}",
        f"--count={pairs}",
        f"--prefill={prefill}",
        *(["--memory"] if memory else []),
    ]
    return counted(command, what="the child")


def _instructions(baseline: str | None, tasks: int, sizes: str, prefill: int, memory: bool = False) -> None:
    """Instructions per pair: the difference of two runs' totals over the difference of their
    pairs (start-up, imports and the store's opening cancel out), a count the load does not move."""
    small, large = (int(n) for n in sizes.split(","))
    kind = "in-memory" if memory else "durable"
    print(f"instructions per {kind} pair (callgrind), {tasks} tasks, Python {sys.version.split()[0]}")
    for python in [*([baseline] if baseline else []), sys.executable]:
        low = _counted(python, tasks, small, prefill, memory)
        high = _counted(python, tasks, large, prefill, memory)
        print(f"{python}: {(high - low) / (large - small):,.0f} Ir per pair ({low:,} / {high:,})", flush=True)


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--baseline-python", help="the other checkout's interpreter")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--warmup", type=float, default=0.5)
    parser.add_argument("--tasks", default="10,1", help="asyncio tasks doing pairs, one figure per run")
    parser.add_argument(
        "--prefill", type=int, default=0, help="start from a store holding N earlier pairs' rows (default 0)"
    )
    parser.add_argument(
        "--waits", action="store_true", help="time each operation's steps (this checkout's runs only)"
    )
    parser.add_argument(
        "--instructions",
        metavar="N1,N2",
        help="instead: callgrind's instructions per pair (runs of N1 and N2 pairs, the first task count)",
    )
    parser.add_argument(
        "--memory", action="store_true", help="the backend without a data dir (in memory), to compare"
    )
    parser.add_argument("--count", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child = _child(
            int(args.tasks), args.seconds, args.warmup, args.prefill, args.waits, args.count, args.memory
        )
        print(json.dumps(asyncio.run(child)))
        return
    if args.instructions:
        tasks = int(args.tasks.split(",")[0])
        _instructions(args.baseline_python, tasks, args.instructions, args.prefill, args.memory)
        return
    targets = {"after": sys.executable}
    if args.baseline_python:
        targets = {"before": args.baseline_python, **targets}
    shapes = [int(t) for t in args.tasks.split(",")]
    print(f"the durable path alone: {os.cpu_count()} cores, Python {sys.version.split()[0]}")
    print(f"{args.rounds} rounds x {args.seconds:g} s (after {args.warmup:g} s) per target and shape")
    print(f"each run's store starts with {args.prefill:,} earlier pairs' rows")
    print(f"load average before: {_load()}", flush=True)
    results: dict[tuple[str, int], list[dict[str, float]]] = {}
    names = list(targets)
    for index in range(args.rounds):
        for tasks in shapes:
            shift = index % len(names)
            for name in names[shift:] + names[:shift]:
                waits = args.waits and name == "after"
                run = _run(targets[name], tasks, args.seconds, args.warmup, args.prefill, waits)
                results.setdefault((name, tasks), []).append(run)
                print(
                    f"  round {index + 1} {tasks:>2} tasks {name:<6} "
                    f"{run['pairs'] / run['seconds']:>8,.0f} pairs/s "
                    f"loop {1e6 * run['loop'] / run['pairs']:6.1f} us/pair",
                    file=sys.stderr,
                    flush=True,
                )
    print(f"load average after: {_load()}")
    print()
    print(
        "| tasks | target | pairs/s | loop thread us/pair (min - max) | store thread us/pair | "
        "process us/pair | pairs per commit | loop / store thread busy | loop after / before |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for tasks in shapes:
        loops = {}
        for name in names:
            runs = results[(name, tasks)]
            per = [1e6 * r["loop"] / r["pairs"] for r in runs]
            loops[name] = statistics.median(per)
            rate = statistics.median(r["pairs"] / r["seconds"] for r in runs)
            store = statistics.median(1e6 * r["store"] / r["pairs"] for r in runs)
            proc = statistics.median(1e6 * r["process"] / r["pairs"] for r in runs)
            per_commit = statistics.median(r["pairs"] / max(r["commits"], 1) for r in runs)
            busy = statistics.median(r["loop"] / r["seconds"] for r in runs)
            store_busy = statistics.median(r["store"] / r["seconds"] for r in runs)
            versus = f"{loops[name] / loops['before']:.2f}" if name != "before" and "before" in loops else ""
            print(
                f"| {tasks} | {name} | {rate:,.0f} | {loops[name]:,.1f} "
                f"({min(per):,.1f} - {max(per):,.1f}) | {store:,.1f} | {proc:,.1f} | "
                f"{per_commit:.2f} | {busy:.0%} / {store_busy:.0%} | {versus} |"
            )
    waited = [
        (key, tasks) for tasks in shapes for key in results[("after", tasks)][0] if key.startswith("wait:")
    ]
    if waited:
        print()
        print("| tasks | where an operation's wall time goes (this checkout) | us (median of the means) |")
        print("|---|---|---|")
        for key, tasks in waited:
            value = statistics.median(r[key] for r in results[("after", tasks)] if key in r)
            print(f"| {tasks} | {key.removeprefix('wait: ')} | {value:,.0f} |")


if __name__ == "__main__":
    main()
