"""The README's quick start runs as written against a real server."""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def run_example(code: str, source: Path) -> None:
    """Run a documented example as a module of its own."""
    module = types.ModuleType("documented_example")
    sys.modules[module.__name__] = module  # dataclasses look their module up
    try:
        exec(compile(code, str(source), "exec", dont_inherit=True), module.__dict__)
    finally:
        del sys.modules[module.__name__]


def test_quick_start_runs(server, capsys):
    (example,) = re.findall(
        r"## Quick start with the Python SDK\n\n```python\n(.*?)```", README.read_text(), re.S
    )
    assert "127.0.0.1:7480" in example
    code = example.replace("127.0.0.1:7480", server.address).replace('space="default"', 'space="readme"')
    run_example(code, README)
    printed = capsys.readouterr().out
    assert "Task(job='resize', n=2)" in printed  # the notify event
