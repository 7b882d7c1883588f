"""docs/matching.md's examples (the priority queue, work by region) run as written against a real
server, and print what their comments say."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from .test_readme import run_example

DOC = Path(__file__).resolve().parents[2] / "docs" / "matching.md"


@pytest.mark.parametrize(
    ("heading", "printed"),
    [
        ("A priority queue", ["page-oncall", "resize", "reindex", "backup"]),
        ("Work by region", ["eu-north-1", "eu-west-1", "2"]),
    ],
)
def test_example_runs(server, capsys, heading, printed):
    (example,) = re.findall(rf"## {heading}\n\n.*?```python\n(.*?)```", DOC.read_text(), re.S)
    code = example.replace("127.0.0.1:7480", server.address)
    run_example(code, DOC)
    assert capsys.readouterr().out.split() == printed
