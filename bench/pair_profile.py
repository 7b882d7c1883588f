"""Where each microsecond of a write+take pair goes, in the server and in the client, unary vs Mux.

    python bench/pair_profile.py [--durable] [--seconds S] [--shapes sync1,shared10] [--out DIR]

For each client shape (``sync1``: one blocking `outrig.Space`; ``shared10``: 10 asyncio tasks on
one `AsyncSpace`; ``threads10``: 10 threads on one blocking `outrig.Space`) and each transport
(unary calls, ``mux=False``; the Mux stream, the default),
it starts a fresh `outrig serve` (in memory, or with ``--durable`` on a data dir with
``--durability always``) and runs the client in a process of its own, doing pairs without pause.
Two windows of S seconds each (default 5), after a 1 s warm-up:

1. unprofiled: pairs/s, and the CPU time each process used per pair (all its threads, from
   /proc/PID/stat), in microseconds;
2. both processes sampled by ``py-spy record --native`` (100 Hz, all threads, idle samples
   dropped): the share of busy samples by the owner of the innermost frame that is not the
   interpreter's or libc's own C code (outrig, grpc, protobuf, asyncio, threading, other).

It also prints how busy each of the server's threads was in window 1 (its CPU over the wall
time, named by py-spy's thread names from window 2: MainThread is the event loop, outrig-store
the durable store's commit thread), and, per Python thread of the server, the share of its busy
samples under each of a few functions (inclusive; the durable path's, `_FRAMES`).

It prints, per shape and transport, the CPU microseconds per pair of each process split by owner
(share x CPU per pair), and the top functions of each process. Needs py-spy and ptrace rights
(root here). The raw profiles stay in DIR (default: a temporary directory, printed).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from entries import SPACE, Small
from hotspots import _FRAME, _py_spy, category
from servers import ServerProcess, start_outrig, start_outrig_with

import outrig
import outrig.aio

#: Innermost frames that wait: py-spy --native samples waiting threads too. libc frames without a
#: symbol are, in these processes, almost all futex waits (a lock, a condition, a semaphore).
_IDLE = {"epoll_wait", "poll", "read", "syscall", "sem_wait", "pthread_cond_wait", "pthread_cond_timedwait"}
_TICKS = os.sysconf("SC_CLK_TCK")
_SHAPES = ("sync1", "shared10")
_LEASE = 300.0
#: The functions whose inclusive share of each server thread's busy samples is printed.
_FRAMES = (
    "Journal._begin",
    "_Writer.apply",
    "Journal.submit",
    "Recorder.enqueue",
    "Journal._finished",
    "MemoryBackend._write_records",
    "MemoryBackend._enqueue_take",
    "Journal._commit",
    "fdatasync",
    "gc_collect_main",
)
_THREAD = re.compile(r"thread \((\d+)\): ([^;]*)")


# ---------------------------------------------------------------- the client process


def _client(address: str, shape: str, mux: bool) -> None:
    """Do pairs until stdin closes; answer each line read from stdin with the pairs done so far."""
    done = [0]

    def answer() -> None:
        print("ready", flush=True)
        for _ in sys.stdin:
            print(done[0], flush=True)
        os._exit(0)

    if shape == "sync1":
        with outrig.connect(address, space=SPACE, mux=mux) as space:
            entry, template = Small(key=1, client=0, group="pair"), Small(client=0)
            for _ in range(200):
                space.write(entry, lease=_LEASE)
                space.take(template, timeout=10.0)
            threading.Thread(target=answer, daemon=True).start()
            while True:
                space.write(entry, lease=_LEASE)
                if space.take(template, timeout=10.0) is None:
                    raise RuntimeError("a take of the entry just written found nothing")
                done[0] += 1
    if shape == "threads10":
        _threads(address, mux, done, answer)
    asyncio.run(_shared(address, mux, done, answer))


def _threads(address: str, mux: bool, done: list[int], answer: Callable[[], None]) -> None:
    """10 threads doing pairs on one blocking Space (bench/mux.py's "10 threads" shape)."""
    lock = threading.Lock()
    with outrig.connect(address, space=SPACE, mux=mux) as space:

        def pairs(number: int) -> None:
            entry, template = Small(key=1, client=number, group="pair"), Small(client=number)
            while True:
                space.write(entry, lease=_LEASE)
                if space.take(template, timeout=10.0) is None:
                    raise RuntimeError("a take of the entry just written found nothing")
                with lock:
                    done[0] += 1

        for number in range(10):
            threading.Thread(target=pairs, args=(number,), daemon=True).start()
        time.sleep(1.0)
        answer()


async def _shared(address: str, mux: bool, done: list[int], answer: object) -> None:
    async with outrig.aio.connect(address, space=SPACE, mux=mux) as space:

        async def pairs(number: int) -> None:
            entry, template = Small(key=1, client=number, group="pair"), Small(client=number)
            while True:
                await space.write(entry, lease=_LEASE)
                if await space.take(template, timeout=10.0) is None:
                    raise RuntimeError("a take of the entry just written found nothing")
                done[0] += 1

        tasks = [asyncio.create_task(pairs(number)) for number in range(10)]
        await asyncio.sleep(1.0)
        threading.Thread(target=answer, daemon=True).start()  # type: ignore[arg-type]
        await asyncio.gather(*tasks)


# ---------------------------------------------------------------- measuring


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS  # utime, stime of every thread


def _thread_seconds(pid: int) -> defaultdict[str, float]:
    """CPU seconds by thread name, user and kernel apart: Python's threads are all named after the
    program (python...), gRPC's C core names its own (event_engine, ...), which py-spy cannot see.
    Kernel time is mostly sending, receiving and waking threads up (futex), where py-spy sees a
    thread that waits."""
    seconds: defaultdict[str, float] = defaultdict(float)
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            head, _, tail = (task / "stat").read_text().rpartition(")")
        except FileNotFoundError:  # the thread ended meanwhile
            continue
        name = head.partition("(")[2]
        name = "Python threads" if name.startswith("python") else name
        fields = tail.split()
        seconds[name] += int(fields[11]) / _TICKS  # user time
        seconds[f"{name}, in the kernel"] += int(fields[12]) / _TICKS  # system time: syscalls, wake-ups
    return seconds


def _task_seconds(pid: int) -> dict[int, float]:
    """CPU seconds (user and kernel) of each of the process's threads, by thread id."""
    seconds: dict[int, float] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            fields = (task / "stat").read_text().rpartition(")")[2].split()
        except FileNotFoundError:
            continue
        seconds[int(task.name)] = (int(fields[11]) + int(fields[12])) / _TICKS
    return seconds


@dataclass
class Busy:
    """One process's busy samples, by owner and by function; per thread (py-spy's name), the busy
    samples and those under each of `frames` (inclusive)."""

    samples: int = 0
    owners: Counter[str] = field(default_factory=Counter)
    functions: Counter[str] = field(default_factory=Counter)
    names: dict[int, str] = field(default_factory=dict)  # thread id -> py-spy's thread name
    thread_samples: Counter[str] = field(default_factory=Counter)
    under: defaultdict[str, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))


def _owner(frame: re.Match[str]) -> str:
    kind = category(frame)
    if kind == "other" and ("threading" in frame["file"] or "queue" in frame["file"]):
        return "threading"
    return kind


def _waiting(stack: list[re.Match[str]]) -> bool:
    leaf = stack[-1]
    if leaf["function"] in _IDLE or (leaf["file"].startswith("libc") and leaf["function"].startswith("0x")):
        return True
    return any(frame["function"] == "_client.<locals>.answer" for frame in stack)  # the bench's own


def parse(raw: Path, frames: Sequence[str] = _FRAMES) -> Busy:
    busy = Busy()
    for line in raw.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        thread = _THREAD.match(stack)
        if thread is not None:
            busy.names[int(thread[1])] = thread[2]
        parsed = [match for frame in stack.split(";")[1:] if (match := _FRAME.match(frame))]
        if not parsed or _waiting(parsed):
            continue
        count = int(count_text)
        busy.samples += count
        name = "?" if thread is None else thread[2]
        busy.thread_samples[name] += count
        called = {frame["function"] for frame in parsed}
        for function in frames:
            if function in called:
                busy.under[name][function] += count
        owned = [frame for frame in parsed if category(frame) != "cpython"]
        leaf = owned[-1] if owned else parsed[-1]
        busy.owners[_owner(leaf) if owned else "cpython"] += count
        busy.functions[f"{leaf['function']} ({leaf['file']})"] += count
    return busy


@dataclass
class Run:
    pairs_per_second: float
    server_threads: defaultdict[str, float]  # CPU microseconds per pair, by thread name
    client_threads: defaultdict[str, float]
    server: Busy
    client: Busy
    server_busy: dict[int, float] = field(default_factory=dict)  # thread id -> CPU over wall time

    @property
    def server_us(self) -> float:
        return sum(self.server_threads.values())

    @property
    def client_us(self) -> float:
        return sum(self.client_threads.values())


class Client:
    """The client process (`python`: another checkout's interpreter, for bench/sync_client.py)."""

    def __init__(self, address: str, shape: str, mux: bool, python: str = sys.executable) -> None:
        command = [python, __file__, "--client", address, "--shape", shape]
        self.process = subprocess.Popen(
            [*command, *([] if mux else ["--unary"])],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.process.stdout is not None
        assert self.process.stdin is not None
        self._out, self._in = self.process.stdout, self.process.stdin
        if self._out.readline().strip() != "ready":
            raise RuntimeError("the client process did not start")

    def pairs(self) -> int:
        self._in.write("?\n")
        self._in.flush()
        return int(self._out.readline())

    def stop(self) -> None:
        self._in.close()
        self.process.wait(10)


def _spy(pid: int, seconds: float, raw: Path) -> subprocess.Popen[str]:
    command = [_py_spy(), "record", "-p", str(pid), "-d", str(int(seconds)), "-f", "raw", "-o", str(raw)]
    return subprocess.Popen(
        [*command, "--threads", "--native"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )


def measure(server: ServerProcess, shape: str, mux: bool, seconds: float, out: Path) -> Run:
    client = Client(server.address, shape, mux)
    try:
        pid = client.process.pid
        first, server_cpu, client_cpu, tasks, began = (
            client.pairs(),
            _thread_seconds(server.pid),
            _thread_seconds(pid),
            _task_seconds(server.pid),
            time.monotonic(),
        )
        time.sleep(seconds)
        pairs = client.pairs() - first
        elapsed = time.monotonic() - began
        tasks_after = _task_seconds(server.pid)
        server_busy = {tid: (tasks_after[tid] - tasks.get(tid, 0.0)) / elapsed for tid in tasks_after}
        server_cpu = _per_pair(_thread_seconds(server.pid), server_cpu, pairs)
        client_cpu = _per_pair(_thread_seconds(pid), client_cpu, pairs)
        name = f"{shape}-{'mux' if mux else 'unary'}"
        spies = [
            _spy(server.pid, seconds, out / f"{name}-server.txt"),
            _spy(pid, seconds, out / f"{name}-client.txt"),
        ]
        for spy in spies:
            if spy.wait() != 0:
                assert spy.stderr is not None
                raise RuntimeError(f"py-spy failed: {spy.stderr.read()}")
    finally:
        client.stop()
    return Run(
        pairs / elapsed,
        server_cpu,
        client_cpu,
        parse(out / f"{name}-server.txt"),
        parse(out / f"{name}-client.txt"),
        server_busy,
    )


def _per_pair(
    after: defaultdict[str, float], before: defaultdict[str, float], pairs: int
) -> defaultdict[str, float]:
    return defaultdict(float, {name: (after[name] - before[name]) / pairs * 1e6 for name in after})


def report(title: str, run: Run, top: int = 8) -> None:
    print(f"## {title}: {run.pairs_per_second:,.0f} pairs/s")
    print()
    print(f"CPU per pair: server {run.server_us:,.0f} us, client {run.client_us:,.0f} us")
    print()
    print(
        "| thread, and in Python threads the owner of the innermost frame | server us/pair | client us/pair |"
    )
    print("|---|---|---|")
    python = {"server": run.server_threads["Python threads"], "client": run.client_threads["Python threads"]}
    print(f"| Python threads | {python['server']:,.0f} | {python['client']:,.0f} |")
    owners = sorted(set(run.server.owners) | set(run.client.owners), key=lambda o: -run.server.owners[o])
    for owner in owners:
        server = run.server.owners[owner] / max(1, run.server.samples) * python["server"]
        client = run.client.owners[owner] / max(1, run.client.samples) * python["client"]
        print(f"| - {owner} | {server:,.0f} | {client:,.0f} |")
    names = (set(run.server_threads) | set(run.client_threads)) - {"Python threads"}
    for name in sorted(names, key=lambda n: -(run.server_threads[n] + run.client_threads[n])):
        if run.server_threads[name] + run.client_threads[name] >= 1:
            server, client = run.server_threads[name], run.client_threads[name]
            what = name if name.startswith("Python") else f"gRPC core thread {name}"
            print(f"| {what} | {server:,.0f} | {client:,.0f} |")
    print()
    samples = f"server {run.server.samples:,}, client {run.client.samples:,}"
    print(f"(busy py-spy samples in Python threads: {samples})")
    print()
    print("| server thread | busy (CPU / wall, window 1) | busy samples | under: share of its busy samples |")
    print("|---|---|---|---|")
    for tid, share in sorted(run.server_busy.items(), key=lambda item: -item[1]):
        if share < 0.005:
            continue
        name = run.server.names.get(tid, "gRPC core (no Python frames)")
        samples_of = run.server.thread_samples[name]
        under = ", ".join(
            f"{function} {count / samples_of:.1%}" for function, count in run.server.under[name].most_common()
        )
        print(f"| {name} ({tid}) | {share:.1%} | {samples_of:,} | {under} |")
    print()
    sides = (
        ("server", run.server, run.server_threads["Python threads"]),
        ("client", run.client, run.client_threads["Python threads"]),
    )
    for side, busy, cpu in sides:
        print(f"| {side}: function (innermost frame) | us per pair |")
        print("|---|---|")
        for function, count in busy.functions.most_common(top):
            print(f"| {function} | {count / max(1, busy.samples) * cpu:,.0f} |")
        print()


def _start(durable: bool, out: Path, name: str) -> ServerProcess:
    if not durable:
        return start_outrig(out, name)
    data = out / f"{name}-data"
    return start_outrig_with(
        out, "--data-dir", str(data), "--durability", "always", "--log-level", "WARNING", name=name
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--durable", action="store_true", help="a data dir with --durability always")
    parser.add_argument("--seconds", type=float, default=5.0, help="seconds per window (default 5)")
    parser.add_argument(
        "--shapes", default=",".join(_SHAPES), help="sync1, shared10, threads10 (comma-separated)"
    )
    parser.add_argument("--out", type=Path, help="where to keep the raw profiles")
    parser.add_argument("--client", help=argparse.SUPPRESS)
    parser.add_argument("--shape", help=argparse.SUPPRESS)
    parser.add_argument("--unary", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.client:
        _client(args.client, args.shape, not args.unary)
        return
    out = args.out or Path(tempfile.mkdtemp(prefix="outrig-pair-profile-"))
    out.mkdir(parents=True, exist_ok=True)
    kind = "durable (always)" if args.durable else "in memory"
    print(f"# pair profile: {kind} outrig, {os.cpu_count()} cores")
    print(f"# load average {os.getloadavg()[0]:.2f}; raw profiles in {out}")
    print()
    for shape in args.shapes.split(","):
        for mux in (False, True):
            name = f"{shape}-{'mux' if mux else 'unary'}"
            server = _start(args.durable, out, name)
            try:
                run = measure(server, shape, mux, args.seconds, out)
            finally:
                server.stop()
            report(f"{shape}, {'Mux stream' if mux else 'unary calls'}", run)


if __name__ == "__main__":
    main()
