"""The architecture's import rules hold (.ci/layers runs import-linter's contracts from
pyproject.toml), and the check is live: a copy of the tree with one forbidden import fails it."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / ".ci" / "layers"


def _layers(root: Path) -> subprocess.CompletedProcess[str]:
    # lint-imports is installed beside this interpreter (the dev extra).
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    return subprocess.run(
        ["bash", str(SCRIPT), str(root)], capture_output=True, text=True, env=env, timeout=120
    )


def _broken(report: str) -> list[str]:
    """The names of the contracts a report says are broken (it wraps long names)."""
    summary = report.split("-------------------------------------", 1)[-1].split("Contracts:")[0]
    verdicts = re.findall(r"(.+?) (KEPT|BROKEN)(?: |$)", " ".join(summary.split()))
    return [name.strip() for name, verdict in verdicts if verdict == "BROKEN"]


def _copy(tmp_path: Path) -> Path:
    copy = tmp_path / "tree"
    for part in ("client", "service", "loadtest"):
        shutil.copytree(ROOT / part, copy / part, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", copy / "pyproject.toml")
    return copy


def test_the_tree_keeps_every_contract() -> None:
    result = _layers(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


@pytest.mark.parametrize(
    ("module", "line", "contract"),
    [
        ("service/engine/space.py", "import outrig.service.transport.servicer", "layered"),
        ("service/backends/base.py", "import grpc", "nothing imports gRPC"),
        ("service/engine/values.py", "import asyncio", "the engine is pure"),
        ("client/_codec.py", "import outrig.service.config", "the SDK never imports the server"),
        ("loadtest/mix.py", "import outrig._codec", "loadtest drives the public SDK only"),
    ],
)
def test_a_forbidden_import_breaks_the_check(tmp_path: Path, module: str, line: str, contract: str) -> None:
    copy = _copy(tmp_path)
    path = copy / module
    text = path.read_text()
    # After the module's docstring and `from __future__`, where an import may stand.
    head, sep, rest = text.partition("from __future__ import annotations\n")
    path.write_text(head + sep + line + "  # noqa\n" + rest if sep else line + "\n" + text)
    result = _layers(copy)
    assert result.returncode != 0
    assert any(contract in name for name in _broken(result.stdout)), result.stdout
