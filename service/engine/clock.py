"""Injected time: lease expiry reads a clock object so tests move a fake one instead of sleeping."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    """Wall-clock seconds since the Unix epoch (leases outlive a process, so not monotonic)."""

    def time(self) -> float: ...


class SystemClock:
    """The real clock: its `time` is `time.time` itself, so that a read is one C call and no
    Python frame (the engine reads it three to four times an operation)."""

    time = staticmethod(time.time)


class FakeClock:
    """A clock that moves only when told to."""

    def __init__(self, start: float = 1_000_000.0) -> None:
        self._now = start

    def time(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        self._now += seconds
