"""The Locust command lines in compose.yaml and the stress Job parse: the campaign's options with
outrig's own option parser (loadtest/options.py), and the rest are options Locust has. So renaming
a campaign option cannot leave deploy/ behind."""

from __future__ import annotations

import argparse
import subprocess
from typing import Any

import pytest

from outrig.loadtest.options import StressParams, add_arguments, params_from

from .files import COMPOSE, KUBERNETES, load_yaml_documents, tool

# Locust's own options used in deploy/ (the flag, and whether it takes a value).
LOCUST_FLAGS = {
    "-f": True,
    "--host": True,
    "--headless": False,
    "--only-summary": False,
    "--master": False,
    "--expect-workers": True,
    "--worker": False,
    "--master-host": True,
}


def command_lines() -> dict[str, list[str]]:
    (compose,) = load_yaml_documents(COMPOSE)
    services: dict[str, Any] = compose["services"]
    (job,) = load_yaml_documents(KUBERNETES / "job-stress.yaml")
    (container,) = job["spec"]["template"]["spec"]["containers"]
    lines = {name: list(services[name]["command"]) for name in ("locust-master", "locust-worker")}
    lines["job-stress"] = list(container["args"])
    return lines


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(exit_on_error=False)
    for flag, takes_value in LOCUST_FLAGS.items():
        if takes_value:
            parser.add_argument(flag)
        else:
            parser.add_argument(flag, action="store_true")
    add_arguments(parser)
    return parser


@pytest.mark.parametrize("name", ["locust-master", "locust-worker", "job-stress"])
def test_the_campaign_options_parse(name: str) -> None:
    options = parser().parse_args(command_lines()[name])
    assert options.campaign == "stress"
    params = params_from(options)
    assert isinstance(params, StressParams)
    assert params.try_shutdown == 0  # the stress campaign: no kill, nothing to restart the server
    if name != "locust-worker":
        assert (params.num_entries, params.num_writers, params.num_readers) == (10000, 100, 100)


def test_a_renamed_option_is_caught() -> None:
    argv = [a.replace("--num-entries", "--entries") for a in command_lines()["job-stress"]]
    with pytest.raises(SystemExit):
        parser().parse_args(argv)


def test_locust_has_the_flags_used() -> None:
    done = subprocess.run([tool("locust"), "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    for flag in LOCUST_FLAGS:
        assert f"{flag} " in done.stdout or f"{flag}," in done.stdout or f"{flag}\n" in done.stdout, flag
