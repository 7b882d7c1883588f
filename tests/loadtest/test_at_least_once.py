"""`outrig stress --profile at-least-once` for real: a server it starts, SIGKILLs and restarts,
workers that ack, abandon and nack jobs, poison jobs that must end in the dead-letter space; and
the same campaign catching acks that a crash undid."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from .test_campaigns import BIN, _run

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

VERDICT = re.compile(
    r"^verdict: jobs=(\d+) acked=(\d+) dead=(\d+) redelivered=(\d+) lost=(\d+) duplicated_acks=(\d+)$"
)
SMALL = [
    "--num-entries", "300", "--num-writers", "5", "--num-readers", "10", "--restart-wait", "1",
    "--ack-deadline", "3", "--poison-share", "0.1",
]  # fmt: skip


def _campaign(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], dict[str, int]]:
    report = tmp_path / "report"
    command = [str(BIN / "outrig"), "stress", "--profile", "at-least-once", "--report-dir", str(report)]
    done = _run([*command, *SMALL, *args, "--", "--only-summary"], tmp_path)
    lines = done.stdout.strip().splitlines()
    assert lines, done.stderr[-3000:]
    match = VERDICT.match(lines[-1])
    assert match, f"last line is not the verdict: {lines[-1]!r}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    names = ["jobs", "acked", "dead", "redelivered", "lost", "duplicated_acks"]
    return done, dict(zip(names, map(int, match.groups()), strict=True))


def test_every_good_job_is_acked_once_and_every_poison_job_dead_lettered(tmp_path: Path) -> None:
    done, verdict = _campaign(tmp_path)
    assert done.returncode == 0, done.stdout[-3000:]
    assert verdict["jobs"] == 300
    assert verdict["acked"] + verdict["dead"] == 300
    assert verdict["dead"] > 0  # 10% poison: 30 expected
    assert verdict["redelivered"] > verdict["dead"]  # poison ones alone are redelivered 3 times each
    assert (verdict["lost"], verdict["duplicated_acks"]) == (0, 0)
    assert re.search(r"^kill 1: SIGKILL after \d+ writes and \d+ acks; serving again", done.stdout, re.M)
    assert re.search(r"abandoned [1-9]\d*", done.stdout), done.stdout[-2000:]
    assert "failed:" not in done.stdout


def test_the_campaign_catches_acks_a_crash_undid(tmp_path: Path) -> None:
    # With --durability interval nothing is committed for a minute: the kill loses acknowledged
    # writes and acks, so jobs are lost or acked twice, and the verdict must say so and fail.
    done, verdict = _campaign(tmp_path, "--durability", "interval", "--commit-interval-ms", "60000")
    assert done.returncode == 1, done.stdout[-3000:]
    assert verdict["lost"] + verdict["duplicated_acks"] > 0, done.stdout[-3000:]
    assert "failed: " in done.stdout
