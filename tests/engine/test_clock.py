"""The engine's clocks: the real one reads the wall clock with no frame of its own."""

from __future__ import annotations

import time

from outrig.service.engine.clock import FakeClock, SystemClock


def test_system_clock_reads_the_wall_clock_as_one_c_call() -> None:
    clock = SystemClock()
    before = time.time()
    now = clock.time()
    assert before <= now <= time.time()
    # `time.time` itself, not a method calling it: an engine operation reads the clock three to
    # four times, and a Python frame each cost about 235 instructions a read
    assert clock.time is time.time


def test_fake_clock_moves_only_when_told() -> None:
    clock = FakeClock(100.0)
    assert clock.time() == clock.time() == 100.0
    clock.advance(2.5)
    assert clock.time() == 102.5
