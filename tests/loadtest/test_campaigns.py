"""Whole campaigns: `outrig stress` with a server it starts, kills and restarts, and plain
`locust -f loadtest/locustfile.py`, alone and distributed, against real servers."""

from __future__ import annotations

import csv
import os
import re
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ServerProcess, start_server

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

ROOT = Path(__file__).resolve().parents[2]
LOCUSTFILE = ROOT / "loadtest" / "locustfile.py"
BIN = Path(sys.executable).parent
VERDICT = re.compile(
    r"^verdict: written=(\d+) read=(\d+) taken=(\d+) lost=(\d+) duplicated=(\d+) retries=(\d+)"
    r" empty=(yes|no)$"
)
SMALL = ["--num-entries", "1000", "--num-writers", "20", "--num-readers", "20", "--restart-wait", "1"]


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("OUTRIG_", "LOCUST_"))}


def _run(command: list[str], cwd: Path, timeout: float = 200) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        command, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=_env(), check=False
    )


def _verdict(done: subprocess.CompletedProcess[str]) -> dict[str, int | str]:
    """The numbers of the verdict, which must be the last line printed."""
    lines = done.stdout.strip().splitlines()
    assert lines, done.stderr[-3000:]
    match = VERDICT.match(lines[-1])
    assert match, f"last line is not the verdict: {lines[-1]!r}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    names = ["written", "read", "taken", "lost", "duplicated", "retries"]
    result: dict[str, int | str] = {
        name: int(value) for name, value in zip(names, match.groups(), strict=False)
    }
    result["empty"] = match.group(7)
    return result


def _stress(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    report = tmp_path / "report"
    return _run(
        [str(BIN / "outrig"), "stress", "--report-dir", str(report), *args, "--", "--only-summary"], tmp_path
    )


def test_the_ci_profile_one_kill_nothing_lost_or_duplicated(tmp_path: Path) -> None:
    done = _stress(tmp_path, "--profile", "stress-with-shutdown", *SMALL, "--verify-takes")
    verdict = _verdict(done)
    assert done.returncode == 0, done.stdout[-3000:]
    assert verdict == {
        "written": 1000,
        "read": 1000,
        "taken": 1000,
        "lost": 0,
        "duplicated": 0,
        "retries": verdict["retries"],
        "empty": "yes",
    }
    assert "kill 1: SIGKILL after 1000 writes and 0 takes" in done.stdout
    assert "retry path: sdk" in done.stdout
    report = tmp_path / "report"
    with (report / "stats_stats.csv").open() as stats:
        rows = {row["Name"]: row for row in csv.DictReader(stats)}
    for name in ("write", "read", "take", "verify take: read_nowait"):
        assert rows[name]["Type"] == "outrig"
        assert rows[name]["Request Count"] == "1000", name
        assert rows[name]["Failure Count"] == "0", name
    assert int(float(rows["write"]["Average Content Size"])) > 0
    assert (report / "report.html").stat().st_size > 10_000
    assert "outrig listening on" in (report / "server.log").read_text()


def test_interleaved_with_the_originals_retry_rules(tmp_path: Path) -> None:
    done = _stress(
        tmp_path, *SMALL, "--interleave", "--retry", "original", "--use-if-exists", "--verify-takes"
    )
    verdict = _verdict(done)
    assert done.returncode == 0, done.stdout[-3000:]
    assert (verdict["written"], verdict["lost"], verdict["duplicated"], verdict["empty"]) == (
        1000,
        0,
        0,
        "yes",
    )
    assert "retry path: original" in done.stdout
    kill = re.search(r"kill 1: SIGKILL after (\d+) writes", done.stdout)
    assert kill and 500 <= int(kill.group(1)) < 1000, done.stdout[-2000:]


def test_the_campaign_catches_acknowledged_writes_a_crash_lost(tmp_path: Path) -> None:
    # With --durability interval nothing is committed for a minute, so the kill after half the
    # writes loses every acknowledged entry not yet taken: the verdict must say so and fail.
    done = _stress(
        tmp_path,
        *SMALL,
        "--interleave",
        "--use-if-exists",
        "--durability",
        "interval",
        "--commit-interval-ms",
        "60000",
    )
    verdict = _verdict(done)
    assert done.returncode == 1, done.stdout[-3000:]
    assert int(verdict["lost"]) > 0, done.stdout[-3000:]
    assert "failed: " in done.stdout


MIX = ["--profile", "random", "--max-users", "10", "--step-users", "5", "--step-seconds", "2"]


def _exact(done: subprocess.CompletedProcess[str], **expected: int) -> dict[str, int | str]:
    """The verdict of a campaign that passed: nothing lost or duplicated (and `expected`)."""
    verdict = _verdict(done)
    assert done.returncode == 0, done.stdout[-3000:]
    assert (verdict["lost"], verdict["duplicated"]) == (0, 0), done.stdout[-3000:]
    assert {name: verdict[name] for name in expected} == expected
    return verdict


def _exact_mix(done: subprocess.CompletedProcess[str]) -> None:
    verdict = _exact(done)
    assert int(verdict["written"]) > 0 and int(verdict["taken"]) > 0
    assert verdict["empty"] == "yes"


def test_the_random_mix_accounts_for_every_entry(tmp_path: Path) -> None:
    done = _stress(tmp_path, *MIX, "--duration", "6")
    _exact_mix(done)
    assert re.search(r"notify: \d+ events received", done.stdout)
    with (tmp_path / "report" / "stats_stats.csv").open() as stats:
        names = {row["Name"] for row in csv.DictReader(stats)}
    assert {"write", "read", "take", "take_many", "notify", "transaction"} <= names


def test_both_campaigns_stay_exact_on_a_partitioned_space(tmp_path: Path) -> None:
    """The space in 3 partitions by serial (docs/scaling.md): the entries' own templates go to one
    partition, the root templates fan out, the kill and restart recover every partition."""
    (tmp_path / "stress").mkdir()
    (tmp_path / "mix").mkdir()
    done = _stress(
        tmp_path / "stress",
        "--profile",
        "stress-with-shutdown",
        *SMALL,
        "--verify-takes",
        "--partitions",
        "3",
    )
    _exact(done, written=1000, taken=1000)
    assert "kill 1: SIGKILL after 1000 writes" in done.stdout
    _exact_mix(_stress(tmp_path / "mix", *MIX, "--duration", "6", "--partitions", "3"))


def test_single_workers_killed_under_a_partitioned_space_lose_nothing(tmp_path: Path) -> None:
    """`--workers 2 --partitions 2`: each kill is a SIGKILL of one worker in turn (the supervisor
    restarts it and it recovers its store) while readers and writers run, through the public port;
    and the random mix with two such kills."""
    done = _stress(
        tmp_path, "--profile", "stress-with-shutdown", *SMALL, "--interleave", "--try-shutdown", "3",
        "--workers", "2", "--partitions", "2",
    )  # fmt: skip
    _exact(done, written=1000, taken=1000)
    assert len(re.findall(r"^kill \d: SIGKILL after", done.stdout, re.M)) == 3
    log = (tmp_path / "report" / "server.log").read_text()
    assert "outrig worker 0 restarted" in log and "outrig worker 1 restarted" in log
    (tmp_path / "mix").mkdir()
    mix = _stress(
        tmp_path / "mix", *MIX, "--duration", "8", "--mix-kills", "2", "--workers", "2", "--partitions", "2"
    )
    _exact_mix(mix)
    assert len(re.findall(r"^kill \d: SIGKILL at", mix.stdout, re.M)) == 2, mix.stdout[-2000:]


def test_bad_options_exit_2_naming_the_option(tmp_path: Path) -> None:
    done = _stress(tmp_path, "--num-writers", "0")
    assert done.returncode == 2
    assert "--num-writers" in done.stderr


def _locust(tmp_path: Path, host: str, *args: str) -> list[str]:
    return [str(BIN / "locust"), "-f", str(LOCUSTFILE), "--headless", "--host", host, "--only-summary", *args]


def test_plain_locust_runs_the_stress_campaign(tmp_path: Path, server: ServerProcess) -> None:
    space = f"plain-{tmp_path.name}"
    args = ["--num-entries", "300", "--num-writers", "10", "--num-readers", "10", "--space", space]
    done = _run(_locust(tmp_path, server.address, *args, "--csv", str(tmp_path / "s")), tmp_path)
    verdict = _verdict(done)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (verdict["written"], verdict["taken"], verdict["lost"], verdict["empty"]) == (300, 300, 0, "yes")
    assert (tmp_path / "s_stats.csv").exists()


def test_plain_locust_refuses_a_kill_it_cannot_do(tmp_path: Path, server: ServerProcess) -> None:
    args = ["--try-shutdown", "1", "--num-entries", "10", "--num-writers", "2", "--num-readers", "2"]
    done = _run(_locust(tmp_path, server.address, *args), tmp_path)
    assert done.returncode != 0
    assert "--kill-command" in done.stdout + done.stderr


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_distributed_master_and_two_workers_with_kill_commands(tmp_path: Path) -> None:
    data = tmp_path / "data"
    first = start_server("--data-dir", str(data))
    pid_file = tmp_path / "server.pid"
    pid_file.write_text(str(first.process.pid))
    serve = f"{sys.executable} -m outrig.service serve --listen {first.address} --data-dir {data}"
    restart = f"nohup {serve} >> {tmp_path / 'restarted.log'} 2>&1 & echo $! > {pid_file}"
    port = _free_port()
    args = [
        "--num-entries",
        "400",
        "--num-writers",
        "10",
        "--num-readers",
        "10",
        "--interleave",
        "--try-shutdown",
        "1",
        "--restart-wait",
        "0.5",
        "--kill-command",
        f"kill -9 $(cat {pid_file})",
        "--restart-command",
        restart,
    ]
    master = subprocess.Popen(
        _locust(
            tmp_path,
            first.address,
            "--master",
            "--expect-workers",
            "2",
            "--master-bind-port",
            str(port),
            *args,
        ),
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
    )
    workers = [
        subprocess.Popen(
            [str(BIN / "locust"), "-f", str(LOCUSTFILE), "--worker", "--master-port", str(port)],
            cwd=tmp_path,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=_env(),
        )
        for _ in range(2)
    ]
    try:
        out, err = master.communicate(timeout=180)
        done = subprocess.CompletedProcess(master.args, master.returncode, out, err)
        verdict = _verdict(done)
        assert master.returncode == 0, err[-3000:]
        assert (verdict["written"], verdict["read"], verdict["taken"]) == (400, 400, 400)
        assert (verdict["lost"], verdict["duplicated"], verdict["empty"]) == (0, 0, "yes")
        assert "kill 1: SIGKILL after" in out
    finally:
        processes: list[subprocess.Popen[Any]] = [master, *workers]
        for process in processes:
            if process.poll() is None:
                process.kill()
            process.wait()
        first.stop()
        subprocess.run(f"kill -9 $(cat {pid_file}) 2>/dev/null", shell=True, check=False)


def test_the_web_ui_runs_the_campaign(tmp_path: Path, server: ServerProcess) -> None:
    port = _free_port()
    command = [
        str(BIN / "locust"),
        "-f",
        str(LOCUSTFILE),
        "--host",
        server.address,
        "--web-host",
        "127.0.0.1",
        "--web-port",
        str(port),
        "--autostart",
        "--autoquit",
        "0",
        "--num-entries",
        "100",
        "--num-writers",
        "5",
        "--num-readers",
        "5",
        "--space",
        f"web-{tmp_path.name}",
    ]
    done = _run(command, tmp_path)
    verdict = _verdict(done)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (verdict["written"], verdict["taken"], verdict["empty"]) == (100, 100, "yes")
    assert f"Starting web interface at http://127.0.0.1:{port}" in done.stderr
