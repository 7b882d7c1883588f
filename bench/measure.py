"""How a run is timed: a warm-up, then a measured window, and what was done inside it.

A run counts the units of work (calls, pairs, events) that *complete* inside the window
``[warm, end)``, which opens once every client is connected; units completing during the warm-up
or after the end are not counted. At the window's two edges a watcher thread reads the CPU time
of the server process and of this (client) process, so a sample also says how much CPU each side
spent per unit: on a 2-core machine that tells a server-bound row from a client-bound one.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from servers import ServerProcess

from outrig.service import process


def tune_client() -> str:
    """Give this (client) process the allocator settings `outrig serve` gives itself
    (service/process.py), and say which took. Untuned, the client's own page faults decided the
    HD array rows: glibc handed the client fresh pages for 3.6 MB messages, 3,600-4,900 faults and
    about 10 ms per call, against outrig and the no-op server alike. protobuf's upb still calls
    malloc_trim(0) after every 10,000 frees of its arenas' blocks on glibc: run the bench with
    jemalloc preloaded (LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libjemalloc.so.2), as the container
    image runs the server, for a client that keeps its pages."""
    if not process.glibc_allocates():
        return f"allocator {os.path.basename(process.malloc_library())} (preloaded)"
    thresholds = process.tune_malloc()
    return f"glibc, thresholds {'raised' if thresholds else 'unchanged'}, protobuf's heap trims on"


@dataclass(frozen=True)
class Sample:
    """One measured run."""

    rate: float  # units per second
    server_cpu: float  # server CPU seconds per unit
    client_cpu: float  # client CPU seconds per unit (this whole process)


class Window:
    """The measured part of a run, which starts `warmup` seconds from now and lasts `seconds`."""

    def __init__(self, warmup: float, seconds: float, server: ServerProcess | None) -> None:
        self.seconds = seconds
        self.warm = time.monotonic() + warmup
        self.end = self.warm + seconds
        self._server = server
        self._edges: list[tuple[float, float]] = []
        self._watcher = threading.Thread(target=self._watch, name="window", daemon=True)
        self._watcher.start()

    def _watch(self) -> None:
        for edge in (self.warm, self.end):
            time.sleep(max(0.0, edge - time.monotonic()))
            server = self._server.cpu_seconds() if self._server is not None else float("nan")
            self._edges.append((server, time.process_time()))

    def inside(self, now: float) -> bool:
        return self.warm <= now < self.end

    def sample(self, units: int) -> Sample:
        """The run's figures, once every client has stopped."""
        self._watcher.join()
        (server_0, client_0), (server_1, client_1) = self._edges
        per_unit = 1 / units if units else float("nan")
        return Sample(
            units / self.seconds, (server_1 - server_0) * per_unit, (client_1 - client_0) * per_unit
        )


def loop_sync(step: Callable[[], int], window: Window) -> int:
    """Call ``step`` (which returns the units it did) until the window ends; the units done inside."""
    done = 0
    while True:
        units = step()
        now = time.monotonic()
        if now >= window.end:
            return done
        if now >= window.warm:
            done += units


async def loop_async(step: Callable[[], Awaitable[int]], window: Window) -> int:
    """`loop_sync` for a coroutine step."""
    done = 0
    while True:
        units = await step()
        now = time.monotonic()
        if now >= window.end:
            return done
        if now >= window.warm:
            done += units


async def gather_counts(loops: Sequence[Awaitable[int]]) -> int:
    """Run client loops concurrently on this event loop; the sum of their counts."""
    counts = await asyncio.gather(*loops)
    return sum(counts)
