"""deploy/monitoring: the Prometheus alert rules pass `promtool check rules` and their own unit
tests (`promtool test rules`), and the Grafana dashboard's queries are valid PromQL over metrics
real servers export (scraped here: a lone one and a tier's), covering throughput, latency, commit
latency, parked waiters, quota use, denials and a tier's ownership."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

import outrig
from outrig.service.config import ServerConfig
from outrig.testing import LocalServer

from ..conftest import free_port, missing_tool, start_server
from ..polling import scrape, wait_until
from ..postgres_server import PostgresServer
from .files import DEPLOY

MONITORING = DEPLOY / "monitoring"
ALERTS = MONITORING / "alerts.yaml"
DASHBOARD = MONITORING / "grafana-dashboard.json"
_METRIC = re.compile(r"\b(outrig_[a-z_]+|up)\b(?!\s*\()")


@dataclass
class Probe(outrig.Entry, type_name="monitoring.Probe"):
    n: int | None = None


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        missing_tool("promtool", "prometheus")
    assert found is not None
    return found


def _run(*args: str, cwd: Path = MONITORING) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [promtool(), *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False
    )


def _dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def _queries() -> list[str]:
    return [target["expr"] for panel in _dashboard()["panels"] for target in panel.get("targets", ())]


def _alert_exprs() -> list[str]:
    return [rule["expr"] for group in yaml.safe_load(ALERTS.read_text())["groups"] for rule in group["rules"]]


def _as_promql(query: str) -> str:
    """A dashboard query with Grafana's variables put in as Prometheus would see them."""
    return (
        query.replace("$__rate_interval", "5m")
        .replace('"$job"', '".*"')
        .replace('"$instance"', '".*"')
        .replace('"$space"', '".*"')
    )


def test_the_alert_rules_pass_promtool_and_their_unit_tests() -> None:
    checked = _run("check", "rules", ALERTS.name)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS: 10 rules found" in checked.stdout
    tested = _run("test", "rules", "alerts.test.yaml")
    assert tested.returncode == 0, tested.stdout + tested.stderr


def test_a_wrong_expectation_fails_the_rules_unit_tests(tmp_path: Path) -> None:
    """The unit tests can fail: the same tests, one annotation changed, do."""
    shutil.copy(ALERTS, tmp_path / ALERTS.name)
    broken = (MONITORING / "alerts.test.yaml").read_text().replace("at 95% of", "at 96% of")
    (tmp_path / "alerts.test.yaml").write_text(broken)
    assert _run("test", "rules", "alerts.test.yaml", cwd=tmp_path).returncode != 0


def test_the_dashboard_queries_are_valid_promql(tmp_path: Path) -> None:
    """promtool checks PromQL in rule files: each query becomes a recording rule."""
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:query_{i}", "expr": _as_promql(query)} for i, query in enumerate(_queries())
    ]}]}  # fmt: skip
    (tmp_path / "dashboard-rules.yaml").write_text(yaml.safe_dump(rules))
    checked = _run("check", "rules", "dashboard-rules.yaml", cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_the_dashboard_is_well_formed() -> None:
    dashboard = _dashboard()
    panels = dashboard["panels"]
    ids = [panel["id"] for panel in panels]
    assert len(ids) == len(set(ids))
    variables = {variable["name"] for variable in dashboard["templating"]["list"]}
    assert variables == {"datasource", "job", "instance", "space"}
    for panel in panels:
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert panel["targets"] and panel["description"], panel["title"]
        assert all(t["datasource"] == panel["datasource"] for t in panel["targets"]), panel["title"]
        assert panel["gridPos"]["x"] >= 0 and panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24


def _exported_metric_names(tmp_path: Path) -> set[str]:
    """The sample names a real durable server with a policy exports once it has served calls, a
    denial among them."""
    policy = tmp_path / "policy.toml"
    policy.write_text(
        '[[grant]]\nprincipals = ["*"]\nresources = ["outrig://jobs", "outrig://jobs/*"]\n'
        'actions = ["read", "write", "take"]\n'
    )
    metrics = f"127.0.0.1:{free_port()}"
    config = ServerConfig(data_dir=tmp_path / "data", policy=policy, metrics_listen=metrics)
    with (
        LocalServer(config) as server,
        outrig.connect(server.address, space="jobs", retry_deadline=10.0) as space,
    ):
        space.write(Probe(n=1))
        space.take(Probe(), timeout=0)
        space.write(Probe(n=2))
        with pytest.raises(outrig.PermissionDeniedError):
            space.with_space("elsewhere").write(Probe(n=3))
        names = wait_until(
            lambda: (
                found
                if "outrig_policy_denials_total" in (found := {s.split("{")[0] for s in scrape(metrics)})
                else None
            ),
            what="the scrape to show the denial",
        )
    return names


def _tier_metric_names(postgres: PostgresServer) -> set[str]:
    """The sample names two servers of a tier (`--backend postgres`) export once one owns a space
    and the other has forwarded a call to it."""
    dsn = postgres.dsn(postgres.new_database("m"))
    servers = [start_server("--backend", "postgres", "--dsn", dsn, metrics=True) for _ in range(2)]
    try:
        owner, other = servers
        with outrig.connect(owner.address, space="jobs") as space:
            space.write(Probe(n=1))  # the owner claims it
        with outrig.connect(other.address, space="jobs", direct=False) as space:
            space.write(Probe(n=2))  # forwarded
        return {name.split("{")[0] for server in servers if server.metrics for name in scrape(server.metrics)}
    finally:
        for server in servers:
            server.stop()


def test_every_metric_the_dashboard_and_alerts_use_is_exported(
    tmp_path: Path, postgres: PostgresServer
) -> None:
    # `up` is Prometheus' own; a tier's metrics, a tier server's.
    exported = _exported_metric_names(tmp_path) | _tier_metric_names(postgres) | {"up"}
    used = {name for query in (*_queries(), *_alert_exprs()) for name in _METRIC.findall(query)}
    assert used - exported == set(), f"not exported by the server: {sorted(used - exported)}"
    covered = {name for query in _queries() for name in _METRIC.findall(query)}
    wanted = {
        "outrig_requests_total",  # throughput
        "outrig_request_seconds_bucket",  # latency
        "outrig_store_commit_seconds_bucket",  # commit latency
        "outrig_waiters",  # parked waiters
        "outrig_space_max_entries",  # quota use
        "outrig_space_max_bytes",
        "outrig_policy_denials_total",  # denials
    }
    assert wanted <= covered, sorted(wanted - covered)
