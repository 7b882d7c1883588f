"""The cyclic collector's cost per write+take pair of bench/mux_inprocess.py's stream, and what the
in-memory server keeps per pair for it to walk.

    python bench/collector.py [--python PATH ...] [--pairs N] [--rounds R] [--tasks T] [--types]

Each interpreter (default: this one; give another checkout's `.venv/bin/python` to compare, run
with that checkout's bench directory) serves R rounds of N pairs, one fresh process per round, the
interpreters' rounds interleaved. A round builds the in-memory server as mux_inprocess.py does
(`tune_collector`, then a collection and `gc.freeze()` of the start-up heap, as `outrig serve`
does) and serves its stream with `gc.callbacks` timing every collection in thread CPU time.
Prints, per pair, medians over the rounds: the collector's CPU (all, and by generation), the
whole CPU (so its share),
collections per 1,000 pairs of each generation, and the tracked objects the server still holds
once the stream is over (len(gc.get_objects()) after a collection, less the count before the
stream); ``--types`` adds those objects by type (the last round's). Asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

_FIGURES = ("collector_us", "cpu_us", "kept", "gen0", "gen1", "gen2", "gen0_us", "gen1_us", "gen2_us")


class _Timer:
    """A `gc.callbacks` entry: thread CPU time and count of collections, by generation."""

    def __init__(self) -> None:
        self.seconds = [0.0, 0.0, 0.0]
        self.collections = [0, 0, 0]
        self._began = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._began = time.thread_time()
        else:
            self.seconds[info["generation"]] += time.thread_time() - self._began
            self.collections[info["generation"]] += 1


async def _serve(
    rounds: list[tuple[bytes, bytes]], pairs: int, thresholds: tuple[int, ...] | None
) -> dict[str, Any]:
    from mux_inprocess import _Context

    from outrig.service import process
    from outrig.service.config import ServerConfig
    from outrig.service.transport.server import OutrigServer

    server = OutrigServer(ServerConfig(in_memory=True, listen="127.0.0.1:0", log_level="WARNING"))
    context = _Context()
    process.tune_collector()
    if thresholds:
        gc.set_threshold(*thresholds)
    gc.collect()
    gc.freeze()
    before = len(gc.get_objects())

    async def requests() -> AsyncIterator[bytes]:
        for writes, takes in rounds:
            for message in (writes, takes):
                context.written.clear()
                yield message
                while not context.written.is_set():
                    await context.written.wait()

    timer = _Timer()
    gc.callbacks.append(timer)
    stream = asyncio.ensure_future(server._mux.handle(requests(), context))  # type: ignore[arg-type]
    began = time.process_time()
    await stream
    cpu = time.process_time() - began
    gc.callbacks.remove(timer)
    gc.collect()
    held = gc.get_objects()
    types = collections.Counter(type(each).__qualname__ for each in held)
    return {
        "collector_us": sum(timer.seconds) / pairs * 1e6,
        "gen0_us": timer.seconds[0] / pairs * 1e6,
        "gen1_us": timer.seconds[1] / pairs * 1e6,
        "gen2_us": timer.seconds[2] / pairs * 1e6,
        "cpu_us": cpu / pairs * 1e6,
        "kept": (len(held) - before) / pairs,
        "gen0": timer.collections[0] / pairs * 1000,
        "gen1": timer.collections[1] / pairs * 1000,
        "gen2": timer.collections[2] / pairs * 1000,
        "types": {name: count / pairs for name, count in types.most_common(12)},
        "server": server,  # held until the figures are taken
    }


def _round(pairs: int, tasks: int, thresholds: tuple[int, ...] | None) -> None:
    """One round in this process; prints its figures as JSON."""
    from mux_inprocess import _messages

    rounds = _messages(tasks, pairs)
    figures = asyncio.run(_serve(rounds, pairs, thresholds))
    del figures["server"]
    print(json.dumps(figures))


def _run(python: str, args: argparse.Namespace) -> dict[str, Any]:
    bench = Path(python).absolute().parents[2] / "bench"  # a checkout's .venv/bin/python
    if not (bench / "mux_inprocess.py").exists():
        bench = Path(__file__).resolve().parent
    done = subprocess.run(
        [
            str(Path(python).absolute()),
            str(Path(__file__).resolve()),
            "--one",
            "--pairs",
            str(args.pairs),
            "--tasks",
            str(args.tasks),
            *(["--thresholds", args.thresholds] if args.thresholds else []),
        ],
        cwd=bench,
        env={**os.environ, "PYTHONHASHSEED": "0", "PYTHONPATH": str(bench)},
        capture_output=True,
        text=True,
        check=True,
    )
    figures: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--python", action="append", help="an interpreter (repeatable); default this one")
    parser.add_argument("--pairs", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tasks", type=int, default=10)
    parser.add_argument("--types", action="store_true", help="the objects kept, by type")
    parser.add_argument(
        "--thresholds", help="the collector's thresholds after tune_collector's, e.g. 10000,10,10"
    )
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        thresholds = tuple(int(each) for each in args.thresholds.split(",")) if args.thresholds else None
        _round(args.pairs, args.tasks, thresholds)
        return
    load = " ".join(f"{figure:.2f}" for figure in os.getloadavg())
    print(
        f"collector per pair over {args.pairs:,} pairs ({args.tasks} tasks), medians of {args.rounds} "
        f"rounds: {os.cpu_count()} cores, load average {load}"
    )
    pythons = args.python or [sys.executable]
    results: dict[str, list[dict[str, Any]]] = {python: [] for python in pythons}
    for _ in range(args.rounds):
        for python in pythons:
            results[python].append(_run(python, args))
    for python, runs in results.items():
        median = {name: statistics.median(run[name] for run in runs) for name in _FIGURES}
        print(
            f"{python}: collector {median['collector_us']:.1f} us of {median['cpu_us']:.1f} "
            f"({median['collector_us'] / median['cpu_us']:.1%}; by generation {median['gen0_us']:.1f} / "
            f"{median['gen1_us']:.1f} / {median['gen2_us']:.1f}); collections per 1,000 pairs "
            f"{median['gen0']:.1f} / {median['gen1']:.2f} / {median['gen2']:.3f}; "
            f"tracked objects kept {median['kept']:.2f}"
        )
        if args.types:
            shown = ", ".join(f"{name} {count:.2f}" for name, count in runs[-1]["types"].items())
            print(f"  kept by type: {shown}")


if __name__ == "__main__":
    main()
