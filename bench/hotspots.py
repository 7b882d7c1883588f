"""Where the outrig server's main thread spends its time under one workload, sampled with py-spy.

    python bench/hotspots.py [--seconds S] [--clients N] [--python-only] [--out DIR] [WORKLOAD ...]

WORKLOAD is one of bench/workloads.py's (read, read_many, pair, take_many, hd_write, hd_read,
notify; default: read hd_read), run by 1 blocking client (or, with ``--clients N``, N asyncio
clients with a connection each) against a fresh in-memory `outrig serve`, as in bench/run.py
(notify: one writer and 1 blocking subscriber, or N asyncio subscribers; its client process, this
one, is sampled too, all its threads). After a 1 s
warm-up, ``py-spy record -p PID -d S -f raw --threads --native``
samples the server (100 Hz) while the client goes on. For the server's main thread (the event
loop, where every handler runs; grpc's poller thread is left out) it prints how busy the thread
was (samples in epoll_wait are idle), the share of busy samples by owner (outrig, grpc, protobuf,
asyncio), the functions the samples were in, and the outrig functions with the most samples
including what they call. Native frames matter: without them the time grpc spends in its Cython
and C code is charged to the Python frame that called it (mostly asyncio's), and time in libc or
the interpreter's C code is charged here to the nearest frame that is not (so a sendmsg made by
grpc counts for grpc). ``--python-only`` drops --native. The raw profiles are kept in DIR (default:
a temporary directory, printed).

Needs py-spy (``pip install py-spy``; sampling another process needs root or ptrace rights).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from entries import SPACE
from measure import tune_client
from run import preload
from servers import ServerProcess, start_outrig
from workloads import (
    WORKLOADS,
    AsyncFactory,
    Plan,
    SyncClient,
    SyncFactory,
    Workload,
    connect,
    connect_async,
    hd_read_async,
    hd_read_sync,
    hd_write_async,
    hd_write_sync,
    pair_async,
    pair_sync,
    read_async,
    read_many_async,
    read_many_sync,
    read_sync,
    take_many_async,
    take_many_sync,
)

_FRAME = re.compile(r"^(?P<function>.*) \((?P<file>[^():]*)(?::\d+)?\)$")
_SAMPLE_RATE = 100  # py-spy's default, samples per second
_ENTRY_POINTS = {"main (service/cli/commands.py)", "<module> (service/__main__.py)"}  # on every stack
_IDLE = {"epoll_wait", "EpollSelector.select"}  # the event loop waiting for something to do
#: A client thread waiting (gRPC's blocking API parks its callers in a Condition), and the bench's
#: own window timer, set apart as idle when every thread of the client process is read.
_CLIENT_IDLE = {"Condition.wait", "Window._watch"}
_STEPS: dict[str, SyncFactory] = {
    "read": read_sync,
    "read_many": read_many_sync,
    "pair": pair_sync,
    "take_many": take_many_sync,
    "hd_write": hd_write_sync,
    "hd_read": hd_read_sync,
}
_ASYNC_STEPS: dict[str, AsyncFactory] = {
    "read": read_async,
    "read_many": read_many_async,
    "pair": pair_async,
    "take_many": take_many_async,
    "hd_write": hd_write_async,
    "hd_read": hd_read_async,
}


def _py_spy() -> str:
    """py-spy next to this Python (a virtualenv's bin/), else on PATH; "" if neither has it."""
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.exists() else shutil.which("py-spy") or ""


def category(frame: re.Match[str]) -> str:
    """Whose code a frame is: outrig, grpc, protobuf, asyncio; "cpython" for the interpreter's and
    libc's own C code (charged to whoever called it), "other" for the rest."""
    file = "/" + frame["file"]  # py-spy shortens paths: service/protocol/codec.py, asyncio/events.py
    if "/service/" in file or "/outrig/" in file or "/client/" in file:
        return "outrig"
    if "grpc" in file:
        return "grpc"
    # upb, protobuf's C core, lives in google/_upb/_message.abi3.so, which py-spy names by its file only.
    if "protobuf" in file or "upb" in file or "_message.abi3" in file or "upb" in frame["function"].lower():
        return "protobuf"
    if "asyncio" in file or "selectors" in file:
        return "asyncio"
    if file.endswith((".c", ".h", ".so.6", ".so.1.0")) or "libpython" in file:
        return "cpython"
    return "other"


def _name(frame: re.Match[str]) -> str:
    if frame["file"].startswith("grpc/_cython/"):
        return "(grpc's Cython and C core)"  # no symbols: addresses only
    if frame["function"].startswith("0x"):
        return f"(native code in {frame['file']})"
    return f"{frame['function']} ({frame['file']})"


@dataclass
class Profile:
    """The server main thread's samples, idle ones (waiting in epoll) set apart."""

    seconds: float
    idle: int = 0
    busy: int = 0
    owners: Counter[str] = field(default_factory=Counter)  # category -> busy samples
    own: Counter[str] = field(default_factory=Counter)  # function -> busy samples spent in it
    inclusive: Counter[str] = field(default_factory=Counter)  # outrig function -> samples under it
    in_outrig: int = 0  # busy samples with an outrig frame on the stack (below the entry point)


def parse(raw: Path, pid: int, seconds: float, *, every_thread: bool = False) -> Profile:
    """Read py-spy's raw output: one line per distinct stack, "thread (TID): NAME;frame;frame N"
    (the main thread's only, unless `every_thread`).

    Each busy sample is charged to its innermost frame that is not the interpreter's or libc's own
    C code, so a `sendmsg` grpc makes counts for grpc, and a dict lookup outrig makes for outrig.
    """
    profile = Profile(seconds)
    main_thread = f"thread ({pid})"  # py-spy names a thread by its native id; the main one's is the pid
    for line in raw.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        frames = stack.split(";")
        if not every_thread and not frames[0].startswith(main_thread):
            continue
        count = int(count_text)
        parsed = [match for frame in frames[1:] if (match := _FRAME.match(frame))]
        if parsed and (  # waiting
            parsed[-1]["function"] in _IDLE
            or (every_thread and any(frame["function"] in _CLIENT_IDLE for frame in parsed))
        ):
            profile.idle += count
            continue
        profile.busy += count
        owned = [frame for frame in parsed if category(frame) != "cpython"]
        if not owned:
            profile.owners["cpython"] += count
            continue
        leaf = owned[-1]
        profile.owners[category(leaf)] += count
        profile.own[_name(leaf)] += count
        mine = {_name(frame) for frame in owned if category(frame) == "outrig"} - _ENTRY_POINTS
        for name in mine:
            profile.inclusive[name] += count
        if mine:
            profile.in_outrig += count
    return profile


def report(name: str, profile: Profile, rate: float, top: int = 12, who: str = "the main thread") -> None:
    busy = profile.busy / (profile.seconds * _SAMPLE_RATE)
    print(
        f"## {name}: " + (f"{rate:,.0f} calls/s; " if rate > 0 else "") + f"{who} was busy {busy:.0%} of "
        f"{profile.seconds:g} s ({profile.busy:,} busy samples, {profile.idle:,} waiting in epoll)"
    )
    print()
    print(
        "busy samples by owner of the innermost frame: "
        + ", ".join(f"{key} {count / profile.busy:.1%}" for key, count in profile.owners.most_common())
        + f"; with outrig code on the stack: {profile.in_outrig / profile.busy:.1%}"
    )
    print()
    print("| function (innermost frame, C and libc charged to its caller) | share of busy samples |")
    print("|---|---|")
    for function, count in profile.own.most_common(top):
        print(f"| {function} | {count / profile.busy:.1%} |")
    print()
    print("| outrig function, including what it calls | share of busy samples |")
    print("|---|---|")
    for function, count in profile.inclusive.most_common(top):
        print(f"| {function} | {count / profile.busy:.1%} |")
    print()


def _spy(pid: int, seconds: float, native: bool, raw: Path) -> subprocess.Popen[str]:
    command = [_py_spy(), "record", "-p", str(pid), "-d", str(int(seconds)), "-f", "raw"]
    command += ["-o", str(raw), "--threads", *(["--native"] if native else [])]
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _profile_notify(
    workload: Workload,
    server: ServerProcess,
    clients: int,
    plan: Plan,
    spy: Callable[[], subprocess.Popen[str]],
) -> tuple[subprocess.Popen[str], float]:
    """bench/run.py's notify run itself, with the sampling started once its 1 s warm-up is over."""
    sampling: list[subprocess.Popen[str]] = []
    timer = threading.Timer(1.0, lambda: sampling.append(spy()))
    timer.start()
    sample = workload.run(server, clients, dataclasses.replace(plan, seconds=plan.seconds + 1.0, warmup=1.0))
    timer.join()
    sampling[0].wait()
    return sampling[0], sample.rate


def _profile_sync(
    workload: Workload, server: ServerProcess, plan: Plan, spy: Callable[[], subprocess.Popen[str]]
) -> tuple[subprocess.Popen[str], float]:
    with connect(server, plan, SPACE) as space:
        client: SyncClient = _STEPS[workload.name](space, 0)
        warm_until = time.monotonic() + 1.0
        while time.monotonic() < warm_until:
            client.step()
        process = spy()
        started, done = time.monotonic(), 0
        while process.poll() is None:
            done += client.step()
        rate = done / (time.monotonic() - started)
        client.finish()
    return process, rate


async def _profile_async(
    workload: Workload,
    server: ServerProcess,
    clients: int,
    plan: Plan,
    spy: Callable[[], subprocess.Popen[str]],
) -> tuple[subprocess.Popen[str], float]:
    spaces = [connect_async(server, plan, SPACE) for _ in range(clients)]
    try:
        made = [_ASYNC_STEPS[workload.name](space, number) for number, space in enumerate(spaces)]
        sampling: list[subprocess.Popen[str]] = []  # py-spy, once the 1 s warm-up is over

        async def loop(step: Callable[[], Awaitable[int]]) -> int:
            done = 0
            while not sampling:
                await step()
            while sampling[0].poll() is None:
                done += await step()
            return done

        tasks = [asyncio.create_task(loop(client.step)) for client in made]
        await asyncio.sleep(1.0)
        sampling.append(spy())
        started = time.monotonic()
        done = sum(await asyncio.gather(*tasks))
        rate = done / (time.monotonic() - started)
        await asyncio.gather(*(client.finish() for client in made))
    finally:
        await asyncio.gather(*(space.close() for space in spaces))
    return sampling[0], rate


def profile_workload(
    workload: Workload, plan: Plan, seconds: float, native: bool, out: Path, clients: int = 1
) -> tuple[Profile, float]:
    server: ServerProcess = start_outrig(out, f"outrig-{workload.name}-{clients}")
    try:
        preload(server, plan)
        raw = out / f"{workload.name}-{clients}.raw.txt"

        def spy() -> subprocess.Popen[str]:
            return _spy(server.pid, seconds, native, raw)

        client_raw = out / f"{workload.name}-{clients}.client.raw.txt"
        if workload.name == "notify":
            process, rate = _profile_notify(workload, server, clients, plan, spy)
            client = _spy(os.getpid(), seconds, native, client_raw)  # the client, a second time round
            _profile_notify(workload, server, clients, plan, lambda: client)
            if client.returncode == 0:
                threads = parse(client_raw, os.getpid(), seconds, every_thread=True)
                report(f"the client ({workload.name}, {clients})", threads, 0.0, who="every thread")
        elif clients == 1:
            process, rate = _profile_sync(workload, server, plan, spy)
        else:
            process, rate = plan.runner.run(_profile_async(workload, server, clients, plan, spy))
        if process.returncode != 0:
            assert process.stderr is not None
            raise RuntimeError(f"py-spy failed: {process.stderr.read()}")
        return parse(raw, server.pid, seconds), rate
    finally:
        server.stop()


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "workloads", nargs="*", default=["read", "hd_read"], choices=sorted([*_STEPS, "notify"])
    )
    parser.add_argument("--seconds", type=float, default=10.0, help="seconds sampled (default 10)")
    parser.add_argument(
        "--clients", type=int, default=1, help="1: a blocking client (default); N: N asyncio clients"
    )
    parser.add_argument("--python-only", action="store_true", help="sample Python frames only (no --native)")
    parser.add_argument("--out", type=Path, help="where to keep the raw profiles")
    args = parser.parse_args(argv)
    if not _py_spy():
        sys.exit("py-spy was not found on PATH: pip install py-spy")
    out = args.out or Path(tempfile.mkdtemp(prefix="outrig-profile-"))
    out.mkdir(parents=True, exist_ok=True)
    by_name = {workload.name: workload for workload in WORKLOADS}
    print(
        f"outrig server profiles ({'without' if args.python_only else 'with'} native frames); "
        f"raw files in {out}; client process allocator: {tune_client()}"
    )
    print()
    with asyncio.Runner() as runner:
        plan = Plan(args.seconds, 0.0, runner)
        for name in args.workloads:
            profile, rate = profile_workload(
                by_name[name], plan, args.seconds, not args.python_only, out, args.clients
            )
            who = "1 blocking client" if args.clients == 1 else f"{args.clients} asyncio clients"
            report(f"{name}, {who}", profile, rate)


if __name__ == "__main__":
    main()
