"""The image's entrypoint, end to end, without a container engine: the Dockerfile's ENTRYPOINT +
CMD run as a subprocess with the Dockerfile's ENV, on a free loopback port and a temporary data
dir; the image's HEALTHCHECK command until it passes; a write and a take through the SDK; SIGTERM
and a clean exit; `outrig check` on the data dir it leaves."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import outrig

from ..conftest import free_port, missing_tool
from ..polling import wait_until
from .files import BIN, dockerfile_stages, image_env

_TCMALLOC = Path(f"/usr/lib/{os.uname().machine}-linux-gnu/libtcmalloc_minimal.so.4")


@dataclass
class DeployTask(outrig.Entry, type_name="deploy.Task"):
    job: str | None = None
    n: int | None = None


def in_venv(argv: list[str]) -> list[str]:
    """The image runs `outrig` from its PATH; here it is this environment's console script."""
    return [str(BIN / argv[0]), *argv[1:]]


def run(argv: list[str], env: dict[str, str], timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(in_venv(argv), env=env, capture_output=True, text=True, timeout=timeout)


def test_the_image_command_serves_is_healthy_and_stops_cleanly(tmp_path: Path) -> None:
    stages = dockerfile_stages()
    server = stages["server"]
    argv = server.exec_form("ENTRYPOINT") + server.exec_form("CMD")
    environment = image_env(stages, "server")
    assert environment["OUTRIG_LISTEN"].startswith("0.0.0.0:") and "PYTHONUNBUFFERED" in environment
    data = tmp_path / "var-lib-outrig"
    data.mkdir()
    # The image's environment on a machine without one: its ENV, with the listen address moved to
    # a free loopback port (this test must not serve beyond loopback) and the volume to a temp dir.
    env = {k: v for k, v in os.environ.items() if not k.startswith("OUTRIG_")}
    assert environment["OUTRIG_METRICS_LISTEN"].startswith("0.0.0.0:")
    metrics = f"127.0.0.1:{free_port()}"
    env |= environment | {
        "OUTRIG_LISTEN": f"127.0.0.1:{free_port()}",
        "OUTRIG_DATA_DIR": str(data),
        "OUTRIG_METRICS_LISTEN": metrics,
    }
    log = tmp_path / "server.log"
    with log.open("w") as stderr:
        process = subprocess.Popen(
            in_venv(argv), env=env, cwd=data, stdout=subprocess.PIPE, stderr=stderr, text=True
        )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        match = re.search(r"outrig listening on (\S+)", line)
        assert match is not None, f"{line!r} {log.read_text()}"
        address = match.group(1)
        assert address == env["OUTRIG_LISTEN"]
        # The image's LD_PRELOAD: tcmalloc serves the server's allocations (Debian's package,
        # which .ci/run installs; without it the dynamic linker only warns and glibc serves).
        if not _TCMALLOC.exists():
            missing_tool(str(_TCMALLOC), "libtcmalloc-minimal4")
        maps = Path(f"/proc/{process.pid}/maps").read_text()
        assert environment["LD_PRELOAD"] in maps, "the image's preloaded allocator is not mapped"

        # The HEALTHCHECK, as Docker would run it: the same argv and environment.
        healthcheck = server.healthcheck()
        probes: list[subprocess.CompletedProcess[str]] = []

        def healthy() -> bool:
            probes.append(run(healthcheck, env))
            return probes[-1].returncode == 0

        wait_until(healthy, 20, what=lambda: f"a healthy health check: {probes[-1].stderr}", interval=0.2)

        with outrig.connect(address, space="default") as space:
            space.write(DeployTask(job="deploy", n=1), lease=outrig.FOREVER)
            space.write(DeployTask(job="deploy", n=2), lease=outrig.FOREVER)
            taken = space.take(DeployTask(job="deploy"), timeout=5.0)
            assert taken == DeployTask(job="deploy", n=1)

        # The metrics the image serves on its own port.
        with urllib.request.urlopen(f"http://{metrics}/metrics", timeout=10) as reply:
            text = reply.read().decode()
        assert 'outrig_requests_total{code="OK",method="Write"} 2.0' in text
        assert 'outrig_space_entries{space="default"} 1.0' in text

        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0, log.read_text()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        if process.stdout is not None:
            process.stdout.close()
    assert "shutting down" in log.read_text()
    down = run(healthcheck, env)
    assert down.returncode == 1, "the health check must fail once the server is gone"
    check = run(["outrig", "check", str(data)], env)
    assert check.returncode == 0, check.stdout + check.stderr
    assert check.stdout.splitlines()[-1] == "check: ok"
    assert "space 'default': 1 entries" in check.stdout, check.stdout
