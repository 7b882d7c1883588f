"""deploy/compose.yaml: compose's own `config` check where a compose is installed (these machines
come without one), and the parsed file held against what it must contain (docs/deploy.md)."""

from __future__ import annotations

import shutil
import subprocess
from typing import Any

import pytest

from .files import COMPOSE, DOCKERFILE, ROOT, dockerfile_stages, load_yaml_documents


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    (doc,) = load_yaml_documents(COMPOSE)
    return doc


def _compose_command() -> list[str] | None:
    """`docker compose` (v2, a docker CLI plugin) or `docker-compose` (v1), where installed."""
    docker = shutil.which("docker")
    if docker is not None:
        done = subprocess.run([docker, "compose", "version"], capture_output=True, text=True, timeout=30)
        if done.returncode == 0:
            return [docker, "compose"]
    legacy = shutil.which("docker-compose")
    return None if legacy is None else [legacy]


def test_docker_compose_config() -> None:
    """Compose's own check, where it can run. These machines come with a docker CLI without the
    compose plugin (and no daemon); there this is skipped, and the tests below check the file."""
    command = _compose_command()
    if command is None:
        pytest.skip("neither docker compose nor docker-compose is installed here")
    for profile in ([], ["--profile", "stress"], ["--profile", "postgres", "--profile", "postgres-stress"]):
        done = subprocess.run(
            [*command, "-f", str(COMPOSE), *profile, "config", "--quiet"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr


def test_the_default_is_one_embedded_server_with_a_named_volume(compose: dict[str, Any]) -> None:
    services = compose["services"]
    default = [name for name, svc in services.items() if "profiles" not in svc]
    assert default == ["outrig"]
    server = services["outrig"]
    assert server["build"]["target"] == "server"
    volume, _, target = server["volumes"][0].partition(":")
    assert compose["volumes"][volume]["name"] == volume
    assert target == dockerfile_stages()["server"].env()["OUTRIG_DATA_DIR"]
    assert server["ports"] == ["127.0.0.1:7480:7480"]  # plaintext: published on the host's loopback only
    assert server["environment"]["OUTRIG_INSECURE"] == "true"
    grace = float(dockerfile_stages()["server"].env()["OUTRIG_GRACE_SECONDS"])
    assert float(server["stop_grace_period"].removesuffix("s")) > grace + 10


def test_the_healthcheck_is_the_images(compose: dict[str, Any]) -> None:
    test = compose["services"]["outrig"]["healthcheck"]["test"]
    assert test[0] == "CMD"
    assert test[1:] == dockerfile_stages()["server"].healthcheck()


def test_the_stress_profile_runs_the_campaign_distributed(compose: dict[str, Any]) -> None:
    services = compose["services"]
    stress = {name for name, svc in services.items() if "stress" in svc.get("profiles", [])}
    assert stress == {"locust-master", "locust-worker"}
    for name in stress:
        svc = services[name]
        assert svc["build"]["target"] == "loadtest"
        assert (ROOT / svc["build"]["context"].replace("..", ".")).resolve() == ROOT
        assert (COMPOSE.parent / svc["build"]["context"] / svc["build"]["dockerfile"]).resolve() == DOCKERFILE
        assert svc["command"][:4] == ["-f", "loadtest/locustfile.py", "--campaign", "stress"]
    master, worker = services["locust-master"]["command"], services["locust-worker"]["command"]
    assert master[master.index("--host") + 1] == "outrig:7480"
    assert "--master" in master and "--headless" in master
    workers = int(master[master.index("--expect-workers") + 1])
    assert services["locust-worker"]["deploy"]["replicas"] == workers
    assert worker[worker.index("--master-host") + 1] == "locust-master"
    assert services["locust-master"]["depends_on"]["outrig"]["condition"] == "service_healthy"


def test_every_build_target_is_a_stage(compose: dict[str, Any]) -> None:
    stages = dockerfile_stages()
    built = [svc for svc in compose["services"].values() if "build" in svc]
    for svc in built:
        assert svc["build"]["target"] in stages
    images = {svc["build"]["target"]: svc["image"] for svc in built}
    assert len(images) == 2  # one image per stage, shared by the services built from it


def test_the_postgres_profile_is_three_servers_behind_nginx(compose: dict[str, Any]) -> None:
    services = compose["services"]
    postgres = {name for name, svc in services.items() if "postgres" in svc.get("profiles", [])}
    assert postgres == {"postgres", "outrig-pg", "balancer"}
    servers = services["outrig-pg"]
    assert servers["deploy"]["replicas"] == 3
    assert servers["environment"]["OUTRIG_BACKEND"] == "postgres"
    dsn = servers["environment"]["OUTRIG_DSN"]
    database = services["postgres"]["environment"]
    assert dsn == (
        f"postgresql://{database['POSTGRES_USER']}:{database['POSTGRES_PASSWORD']}@postgres:5432/"
        f"{database['POSTGRES_DB']}"
    )
    assert servers["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert servers["healthcheck"]["test"][1:] == dockerfile_stages()["server"].healthcheck()
    mount = services["balancer"]["volumes"][0].split(":")
    config = (COMPOSE.parent / mount[0]).read_text()
    assert "grpc_pass grpc://outrig" in config and "server outrig-pg:7480" in config
    assert mount[1] == "/etc/nginx/conf.d/default.conf"
    stress = services["locust-pg-master"]["command"]
    assert stress[stress.index("--host") + 1] == "balancer:7480"
    assert services["locust-pg-worker"]["deploy"]["replicas"] == int(
        stress[stress.index("--expect-workers") + 1]
    )
