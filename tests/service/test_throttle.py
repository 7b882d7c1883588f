"""logs.Throttle: a line per key per interval, the rest counted; a fake clock, no sleeping."""

from __future__ import annotations

import logging

import pytest

from outrig.service.logs import Throttle


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_one_line_per_key_per_interval_and_the_count_of_those_held_back() -> None:
    clock = FakeClock()
    throttle = Throttle(60.0, clock)
    assert throttle.admit("Write") == 0
    assert [throttle.admit("Write") for _ in range(5)] == [None] * 5
    assert throttle.admit("Read") == 0  # keys are throttled apart
    clock.now += 59.9
    assert throttle.admit("Write") is None
    clock.now += 0.1
    assert throttle.admit("Write") == 6  # the six held back since the last line
    assert throttle.admit("Write") is None
    clock.now += 600.0
    assert throttle.admit("Write") == 1
    assert throttle.admit("Read") == 0


def test_log_says_how_many_lines_it_held_back(caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock()
    throttle = Throttle(10.0, clock)
    logger = logging.getLogger("outrig.test.throttle")
    with caplog.at_level(logging.WARNING, logger=logger.name):
        logged = [
            throttle.log(logger, logging.WARNING, "k", "bad request to %s", "Write") for _ in range(100)
        ]
        clock.now += 10.0
        assert throttle.log(logger, logging.WARNING, "k", "bad request to %s", "Write")
    assert logged == [True] + [False] * 99
    assert [record.getMessage() for record in caplog.records] == [
        "bad request to Write",
        "bad request to Write (and 99 more like it since the last such line, not logged)",
    ]
