"""One command's instruction count under valgrind's callgrind, for the benches that count
instructions (mux_instructions, batch_costs, client_instructions, store): a figure the load of a
shared machine does not move. Each bench runs N1 and N2 units and divides the difference, so
start-up and imports cancel out; PYTHONHASHSEED=0 keeps a run's hashing the same every time
(the count still moves with the interpreter's path and the working directory: compare runs made
the same way)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

_COLLECTED = re.compile(r"Collected : (\d+)")


def counted(
    command: list[str], *, cwd: Path | None = None, out: str = "/dev/null", what: str = "the run"
) -> int:
    """callgrind's instruction count of `command` (every thread of its process, not the kernel's
    work: a system call counts as its own instructions); `out` keeps callgrind's profile."""
    done = subprocess.run(
        ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", *command],
        cwd=cwd,
        # one OpenBLAS thread: the pool of threads of numpy (which bench/entries.py imports)
        # spins as it waits, and callgrind counts it by wall time: about 1% of a batch pair, the
        # runs' spread (docs/performance.md, "The batch pair, sixth pass")
        env={**os.environ, "PYTHONHASHSEED": "0", "OPENBLAS_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise SystemExit(f"{what} failed ({done.returncode}): {done.stderr[-1500:]}")
    found = _COLLECTED.search(done.stderr)
    if found is None:
        raise SystemExit(f"no instruction count from valgrind: {done.stderr[-500:]}")
    return int(found.group(1))
