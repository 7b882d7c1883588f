"""Fixtures the backend tests of this folder share (test_embedded_deliveries, test_embedded_changes)."""

from __future__ import annotations

from pathlib import Path

import pytest

from outrig.service.engine import FakeClock


@pytest.fixture
def clock() -> FakeClock:
    """A fake clock well past zero (a module may define its own)."""
    return FakeClock(1_000_000.0)


@pytest.fixture(params=["memory", "durable"])
def data_dir(request: pytest.FixtureRequest, tmp_path: Path) -> Path | None:
    """Each test twice: a memory-only server (None) and a durable one (a data dir)."""
    return None if request.param == "memory" else tmp_path / "data"
