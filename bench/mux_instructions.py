"""Instructions per write+take pair of bench/mux_inprocess.py, counted by valgrind's callgrind:
a figure the load of a shared machine does not move, for changes too small to see in CPU time.

    python bench/mux_instructions.py [--python PATH ...] [--pairs N1,N2] [--tasks T]

Each interpreter (default: this one; give another checkout's `.venv/bin/python` to compare, run
in that checkout's bench directory) runs bench/mux_inprocess.py for N1 and for N2 pairs (one round
each, PYTHONHASHSEED=0) under ``valgrind --tool=callgrind``; the difference of the two totals over
N2 - N1 is the instructions (Ir) per pair, start-up and imports cancelled out. What a pair counts:
the server's Python from the MuxRequest's bytes to the MuxReply's (mux.py, the servicer, the
memory backend, the engine), and the SDK's building of the two requests in the same process (the
same in both checkouts unless the SDK changed). Needs valgrind; takes 1-2 minutes per interpreter
on a quiet machine (valgrind runs Python about 50 times slower). ``--tasks`` is passed through to
mux_inprocess.py: 10 (its default) is the 10-task shape of one connection, 1 the 1-client shape
(one operation in flight). Asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from callgrind import counted


def instructions(python: str, pairs: int, tasks: int = 10) -> int:
    """callgrind's instruction count of one run of mux_inprocess.py with `pairs` pairs."""
    bench = Path(python).absolute().parents[2] / "bench"  # a checkout's .venv/bin/python
    if not (bench / "mux_inprocess.py").exists():
        bench = Path(__file__).resolve().parent
    command = [
        str(Path(python).absolute()),  # run from the bench directory: a relative path would not resolve
        "mux_inprocess.py",
        "--pairs",
        str(pairs),
        "--rounds",
        "1",
        "--tasks",
        str(tasks),
    ]
    return counted(command, cwd=bench, what="mux_inprocess.py")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--python", action="append", help="an interpreter (repeatable); default this one")
    parser.add_argument("--pairs", default="500,2500", help="the two run sizes (default 500,2500)")
    parser.add_argument("--tasks", type=int, default=10, help="asyncio tasks on the stream (default 10)")
    args = parser.parse_args()
    small, large = (int(n) for n in args.pairs.split(","))
    print(
        f"instructions per pair (callgrind), {args.tasks} tasks, {os.cpu_count()} cores,"
        f" Python {sys.version.split()[0]}"
    )
    for python in args.python or [sys.executable]:
        low, high = instructions(python, small, args.tasks), instructions(python, large, args.tasks)
        print(f"{python}: {(high - low) / (large - small):,.0f} Ir per pair ({low:,} / {high:,})")


if __name__ == "__main__":
    main()
