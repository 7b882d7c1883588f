"""Packaging: the generated code is current, and the wheel installs and runs outside the repository."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_generated_code_matches_the_proto():
    done = subprocess.run(
        [sys.executable, str(ROOT / "proto" / "generate.py"), "--check"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr


EXAMPLE = textwrap.dedent(
    """
    import subprocess, sys, re
    from dataclasses import dataclass
    import outrig

    @dataclass
    class Task(outrig.Entry, type_name="wheel.Task"):
        job: str | None = None
        n: int | None = None

    command = ["outrig", "serve", "--listen", "127.0.0.1:0"]
    server = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    try:
        address = re.search(r"listening on (\\S+)", server.stdout.readline()).group(1)
        with outrig.connect(address, space="default") as space:
            space.write(Task(job="resize", n=1), lease=60.0)
            task = space.take(Task(job="resize"), timeout=5.0)
            assert task == Task(job="resize", n=1), task
            assert space.take_nowait(Task()) is None
        print("wheel-ok", outrig.__file__)
    finally:
        server.terminate()
        server.wait(15)
    """
)


@pytest.mark.slow
def test_wheel_installs_into_a_fresh_venv_and_runs(tmp_path):
    dist = tmp_path / "dist"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist), str(ROOT)],
        check=True,
        capture_output=True,
    )
    (wheel,) = dist.glob("outrig-*.whl")
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    subprocess.run(
        [str(python), "-m", "pip", "install", "-q", f"{wheel}[server]"], check=True, capture_output=True
    )
    site = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    )
    top_level = {path.name for path in site.iterdir()}
    assert "outrig" in top_level
    assert not {"client", "service", "loadtest", "proto", "tests"} & top_level
    script = tmp_path / "example.py"
    script.write_text(EXAMPLE)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{env_dir / 'bin'}{os.pathsep}{env['PATH']}"
    done = subprocess.run(
        [str(python), str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "wheel-ok" in done.stdout
    assert str(site) in done.stdout  # imported from the venv, not the repository
