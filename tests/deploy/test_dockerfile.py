"""deploy/Dockerfile and .dockerignore, checked without a container engine: hadolint, and what the
image must be (docs/deploy.md)."""

from __future__ import annotations

import fnmatch
import subprocess
import tomllib
from pathlib import Path

import pytest

from .files import DOCKERFILE, ROOT, Stage, dockerfile_stages, tool


def hadolint(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [tool("hadolint"), "--no-color", "--failure-threshold", "warning", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_hadolint_finds_no_warning_or_error() -> None:
    done = hadolint(DOCKERFILE)
    assert done.returncode == 0, done.stdout + done.stderr


def test_hadolint_fails_on_a_warning(tmp_path: Path) -> None:
    """The check can fail: the Dockerfile with its one reasoned `ignore` removed is refused."""
    bare = tmp_path / "Dockerfile"
    bare.write_text(
        "".join(
            line for line in DOCKERFILE.read_text().splitlines(keepends=True) if "hadolint ignore" not in line
        )
    )
    done = hadolint(bare)
    assert done.returncode != 0 and "DL3013" in done.stdout


@pytest.fixture(scope="module")
def stages() -> dict[str, Stage]:
    return dockerfile_stages()


def test_the_base_image_is_pinned_by_tag(stages: dict[str, Stage]) -> None:
    external = {s.base for s in stages.values() if s.base not in stages}
    assert external, "no base image"
    for base in external:
        image, _, tag = base.partition(":")
        assert image == "python" and "slim" in tag and tag[:1].isdigit() and tag.count(".") >= 2, base


def test_the_server_stage_is_the_default_and_complete(stages: dict[str, Stage]) -> None:
    assert list(stages)[-1] == "server"  # `docker build` without --target builds the last stage
    server = stages["server"]
    assert server.last("USER") == "10001:10001"
    assert server.exec_form("ENTRYPOINT") == ["outrig"]
    assert server.exec_form("CMD") == ["serve"]
    env = server.env()
    assert env["OUTRIG_LISTEN"] == "0.0.0.0:7480"
    assert env["OUTRIG_DATA_DIR"] == "/var/lib/outrig"
    assert "OUTRIG_INSECURE" not in env, "the image must not switch off the listen check for everyone"
    assert server.last("VOLUME") == '["/var/lib/outrig"]'
    assert server.last("EXPOSE") == "7480 9480"  # gRPC, and the Prometheus metrics
    assert server.last("STOPSIGNAL") == "SIGTERM"
    assert server.healthcheck()[:2] == ["outrig", "health"]
    assert any('"outrig[server,postgres]"' in run and "--no-index" in run for run in server.all("RUN"))


def test_the_server_runs_on_debians_tcmalloc(stages: dict[str, Stage]) -> None:
    """The allocator the HD array rows were measured best with (docs/performance.md,
    "Allocators"), from Debian at a pinned version, preloaded by its bare name (any architecture's
    library path); tests/deploy/test_entrypoint.py checks that the server then maps it."""
    server = stages["server"]
    assert server.env()["LD_PRELOAD"] == "libtcmalloc_minimal.so.4"
    installs = [run for run in server.all("RUN") if "apt-get install" in run]
    assert len(installs) == 1 and "libtcmalloc-minimal4=" in installs[0], installs
    assert "rm -rf /var/lib/apt/lists/*" in installs[0]


def test_the_loadtest_stage_runs_the_locustfile(stages: dict[str, Stage]) -> None:
    loadtest = stages["loadtest"]
    assert loadtest.last("USER") == "10001:10001"
    assert loadtest.exec_form("ENTRYPOINT") == ["locust"]
    assert '"outrig[loadtest]"' in loadtest.last("RUN")
    assert loadtest.last("COPY") == "loadtest/locustfile.py loadtest/locustfile.py"
    assert (ROOT / "loadtest" / "locustfile.py").exists()


def _ignored(path: str, patterns: list[str]) -> bool:
    """Docker's rule, for the patterns used here: the last matching pattern wins; `!` lets in."""
    ignored = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        body = pattern.lstrip("!").rstrip("/")
        parts = path.split("/")
        prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
        if body.startswith("**/"):
            hit = any(fnmatch.fnmatch(part, body[3:]) for part in parts)
        else:
            hit = any(fnmatch.fnmatch(prefix, body) for prefix in prefixes)
        if hit:
            ignored = not negate
    return ignored


def test_dockerignore_lets_in_what_the_wheel_is_built_from(stages: dict[str, Stage]) -> None:
    patterns = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    needed = ["pyproject.toml", project["project"]["readme"]]
    for directory in set(project["tool"]["setuptools"]["package-dir"].values()):
        needed += [str(p.relative_to(ROOT)) for p in (ROOT / directory).rglob("*.py")]
    needed += [str(p.relative_to(ROOT)) for p in (ROOT / "client").rglob("*.pyi")]
    needed.append("client/py.typed")
    for path in needed:
        assert not _ignored(path, patterns), f".dockerignore keeps {path} out of the build context"
    for path in ("tests/conftest.py", ".git/HEAD", "bench/run.py", "service/__pycache__/cli.cpython-311.pyc"):
        assert _ignored(path, patterns), f".dockerignore lets {path} into the build context"
    # ... and the build stage copies exactly those.
    copied = [args.split()[0] for args in stages["build"].all("COPY")]
    assert sorted(copied) == sorted(["pyproject.toml", "client/", "service/", "loadtest/"])
    assert "README.md" in stages["build"].all("COPY")[0]
