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


def test_the_work_queue_example_runs(server, space_name):
    """The README's takes with ack, against a real server: two jobs, one through `taking`, one
    by hand, and a delayed write that nothing sees yet."""
    (example,) = re.findall(
        r"## Work queues: takes with ack\n\n.*?```python\n(.*?)```", README.read_text(), re.S
    )
    setup = f"""
from dataclasses import dataclass
import outrig

@dataclass
class Job(outrig.Entry, type_name="readme.Job"):
    kind: str | None = None
    n: int | None = None

resized = []
resize = resized.append
space = outrig.connect({server.address!r}, space={space_name!r})
space.write_many([Job(kind="resize", n=1), Job(kind="resize", n=2)])
"""
    check = """
assert resized == [Job(kind="resize", n=1)], resized
assert space.take_nowait(Job()) is None  # both acked, the report delayed
assert space.describe().delayed == 1  # a space of the session's server: not partitioned
space.close()
"""
    run_example(setup + example + check, README)
