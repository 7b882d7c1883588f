"""docs/deploy.md's configuration table has one row per OUTRIG_* setting that service/config.py
reads, with its flag and default, so that the table cannot drift from the code."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from outrig.service import config
from outrig.service.cli import commands as cli

from .files import ROOT

DOC = ROOT / "docs" / "deploy.md"


def table_rows(text: str) -> dict[str, tuple[str, str, str]]:
    """{variable: (flag, default, meaning)} from the table after the config-table marker."""
    lines = text.split("<!-- config-table -->", 1)[1].strip().splitlines()
    rows: dict[str, tuple[str, str, str]] = {}
    for line in lines[2:]:
        if not line.startswith("|"):
            break
        cells = [cell.strip().strip("`") for cell in line.strip().strip("|").split("|")]
        variable, flag, default, meaning = cells
        assert variable not in rows, f"{variable} has two rows"
        rows[variable] = (flag, default, meaning)
    return rows


def serve_flags() -> dict[str, str]:
    """{dest: --flag} of `outrig serve`."""
    parser = cli._parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    serve = commands.choices["serve"]
    return {a.dest: a.option_strings[0] for a in serve._actions if a.option_strings and a.dest != "help"}


def _matches(cell: str, value: object) -> bool:
    if value is None:
        return cell == "none"
    if isinstance(value, bool):
        return cell == str(value).lower()
    if isinstance(value, int | float):
        return math.isclose(float(cell), value)
    if isinstance(value, Path):
        return cell == str(value)
    return cell == value


def check(text: str) -> list[str]:
    """What is wrong with the table in `text`."""
    rows = table_rows(text)
    defaults = config.ServerConfig()
    flags = serve_flags()
    problems = []
    expected = {f"OUTRIG_{name.upper()}": name for name in config._SCALARS}
    for variable in sorted(expected.keys() - rows.keys()):
        problems.append(f"{variable}: no row")
    for variable in sorted(rows.keys() - expected.keys()):
        problems.append(f"{variable}: a row for a setting config.py does not read")
    for variable in sorted(expected.keys() & rows.keys()):
        name, (flag, default, meaning) = expected[variable], rows[variable]
        if flag != flags.get(name, "—"):
            problems.append(f"{variable}: flag {flag!r}, `outrig serve` has {flags.get(name, '—')!r}")
        if not _matches(default, getattr(defaults, name)):
            problems.append(f"{variable}: default {default!r}, config.py has {getattr(defaults, name)!r}")
        if not meaning:
            problems.append(f"{variable}: no meaning")
    return problems


def test_every_setting_has_its_row() -> None:
    assert check(DOC.read_text()) == []


def test_every_flag_of_serve_has_a_setting() -> None:
    """... so that the table, which lists settings, also lists every flag but --config."""
    assert set(serve_flags()) - set(config._SCALARS) == {"config"}


def test_the_check_fails_on_drift() -> None:
    text = DOC.read_text()
    row = next(line for line in text.splitlines() if line.startswith("| `OUTRIG_REAP_BATCH`"))
    assert check(text.replace(row + "\n", "")) == ["OUTRIG_REAP_BATCH: no row"]
    extra = "| `OUTRIG_COLOUR` | — | none | no such thing |\n"
    assert check(text.replace(row + "\n", row + "\n" + extra)) == [
        "OUTRIG_COLOUR: a row for a setting config.py does not read"
    ]
    wrong = row.replace("`1000`", "`500`")
    assert check(text.replace(row, wrong)) == ["OUTRIG_REAP_BATCH: default '500', config.py has 1000"]
    flag = text.replace("| `OUTRIG_TLS_KEY` | `--tls-key` |", "| `OUTRIG_TLS_KEY` | — |")
    assert check(flag) == ["OUTRIG_TLS_KEY: flag '—', `outrig serve` has '--tls-key'"]
