"""deploy/compose.yaml: compose's own `config` check where a compose is installed (these machines
come without one), and the parsed file held against what it must contain (docs/deploy.md)."""

from __future__ import annotations

import copy
import re
import shutil
import subprocess
from typing import Any

import pytest

from outrig.service import config

from ..conftest import missing_tool
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
        missing_tool("docker compose (or docker-compose)", "docker-compose")
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


def _tier(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The outrig servers of the postgres profile: every service with OUTRIG_BACKEND=postgres."""
    return {
        name: svc
        for name, svc in compose["services"].items()
        if svc.get("environment", {}).get("OUTRIG_BACKEND") == "postgres"
    }


def _port(address: str) -> int:
    return int(address.rpartition(":")[2])


def test_the_postgres_profile_is_a_tier_of_three_servers_behind_nginx(compose: dict[str, Any]) -> None:
    services = compose["services"]
    tier = _tier(compose)
    postgres = {name for name, svc in services.items() if "postgres" in svc.get("profiles", [])}
    assert postgres == {"postgres", "balancer", *tier}
    assert len(tier) == 3
    image = dockerfile_stages()["server"].env()
    grace = float(image["OUTRIG_GRACE_SECONDS"])
    database = services["postgres"]["environment"]
    for name, server in tier.items():
        assert server["profiles"] == ["postgres"]
        assert server["build"]["target"] == "server"
        # One container per service: replicas would share the one address the service advertises.
        assert server.get("deploy", {}).get("replicas", 1) == 1, name
        assert server["environment"]["OUTRIG_INSECURE"] == "true"
        assert server["environment"]["OUTRIG_DSN"] == (
            f"postgresql://{database['POSTGRES_USER']}:{database['POSTGRES_PASSWORD']}@postgres:5432/"
            f"{database['POSTGRES_DB']}"
        )
        assert float(server["environment"]["OUTRIG_OWNER_LEASE"]) > 0
        assert server["depends_on"]["postgres"]["condition"] == "service_healthy"
        assert server["healthcheck"]["test"] == ["CMD", *dockerfile_stages()["server"].healthcheck()]
        assert float(server["stop_grace_period"].removesuffix("s")) > grace + 10
        assert "ports" not in server  # reached through nginx, or by the other servers on the network
    # All share one database.
    assert len({server["environment"]["OUTRIG_DSN"] for server in tier.values()}) == 1


def test_each_server_of_the_tier_advertises_its_own_name_on_the_network(compose: dict[str, Any]) -> None:
    """The others forward calls to a space's owner at the address it advertises: its service name
    (which compose's DNS resolves for every service on the network) and the port it listens on."""
    tier = _tier(compose)
    listen = dockerfile_stages()["server"].env()["OUTRIG_LISTEN"]
    advertised = {}
    for name, server in tier.items():
        env = server["environment"]
        address = env["OUTRIG_ADVERTISE"]
        host, _, port = address.rpartition(":")
        assert host == name, address
        assert int(port) == _port(env.get("OUTRIG_LISTEN", listen)), address
        # On the default network with the others: no network of its own, no host networking.
        assert "networks" not in server and "network_mode" not in server, name
        advertised[name] = address
    assert len(set(advertised.values())) == len(tier)

    # Besides that address, the servers are the same service.
    def without_advertise(svc: dict[str, Any]) -> dict[str, Any]:
        svc = copy.deepcopy(svc)
        del svc["environment"]["OUTRIG_ADVERTISE"]
        return svc

    first, *others = tier.values()
    assert all(without_advertise(svc) == without_advertise(first) for svc in others)


def test_nginx_balances_over_every_server_of_the_tier(compose: dict[str, Any]) -> None:
    services = compose["services"]
    tier = _tier(compose)
    balancer = services["balancer"]
    mount = balancer["volumes"][0].split(":")
    assert mount[1] == "/etc/nginx/conf.d/default.conf"
    config = (COMPOSE.parent / mount[0]).read_text()
    upstream = re.search(r"upstream\s+(\S+)\s*\{([^}]*)\}", config)
    assert upstream is not None, "no upstream block"
    assert f"grpc_pass grpc://{upstream[1]};" in config
    servers = re.findall(r"^\s*server\s+([^\s;]+)", upstream[2], re.MULTILINE)
    assert sorted(servers) == sorted(svc["environment"]["OUTRIG_ADVERTISE"] for svc in tier.values())
    # nginx resolves the names when it starts: only once every server is up.
    assert balancer["depends_on"] == {name: {"condition": "service_healthy"} for name in tier}
    stress = services["locust-pg-master"]["command"]
    assert stress[stress.index("--host") + 1] == "balancer:7480"
    assert services["locust-pg-worker"]["deploy"]["replicas"] == int(
        stress[stress.index("--expect-workers") + 1]
    )


def test_every_outrig_variable_is_a_setting(compose: dict[str, Any]) -> None:
    """A misspelt OUTRIG_* variable would be ignored silently by the server."""
    settings = {f"OUTRIG_{name.upper()}" for name in config._SCALARS}
    for name, svc in compose["services"].items():
        variables = {key for key in svc.get("environment", {}) if key.startswith("OUTRIG_")}
        assert variables <= settings, (name, variables - settings)
