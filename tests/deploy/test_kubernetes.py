"""deploy/kubernetes, checked without a cluster: kubernetes-validate (strict) on every manifest, and
what the manifests must hold together (docs/deploy.md)."""

from __future__ import annotations

import copy
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from outrig.service import config
from outrig.service.security.policy import parse_policy

from .files import KUBERNETES, MANIFESTS, dockerfile_stages, load_yaml_documents, tool

Resources = dict[tuple[str, str, str], Any]  # (directory, kind, name) -> the resource


def validate(*paths: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [tool("kubernetes-validate"), "--strict", "--quiet", *map(str, paths)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_every_manifest_is_valid_kubernetes() -> None:
    assert len(MANIFESTS) == 11, MANIFESTS
    done = validate(*MANIFESTS)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_validation_can_fail(tmp_path: Path) -> None:
    """Strict: a misspelt field is refused, as is a wrong type."""
    doc = load_yaml_documents(KUBERNETES / "statefulset.yaml")[0]
    bad = copy.deepcopy(doc)
    bad["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["grpc"]["servcie"] = "x"
    wrong = copy.deepcopy(doc)
    wrong["spec"]["replicas"] = "one"
    for n, broken in enumerate((bad, wrong)):
        path = tmp_path / f"broken{n}.yaml"
        path.write_text(yaml.safe_dump(broken))
        done = validate(path)
        assert done.returncode != 0, done.stdout


def _resources() -> Resources:
    found = {}
    for path in MANIFESTS:
        for doc in load_yaml_documents(path):
            found[(path.parent.name, str(doc["kind"]), str(doc["metadata"]["name"]))] = doc
    return found


@pytest.fixture(scope="module")
def resources() -> Resources:
    return _resources()


def _container(statefulset: dict[str, Any]) -> dict[str, Any]:
    containers = statefulset["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return containers[0]


def _env(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container["env"]}


def test_the_statefulset_keeps_its_data_dir_on_a_volume_claim(resources: Resources) -> None:
    sts = resources[("kubernetes", "StatefulSet", "outrig")]
    assert sts["spec"]["replicas"] == 1
    assert sts["spec"]["serviceName"] == "outrig-headless"
    (claim,) = sts["spec"]["volumeClaimTemplates"]
    container = _container(sts)
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts[claim["metadata"]["name"]] == _env(container)["OUTRIG_DATA_DIR"] == "/var/lib/outrig"
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]
    # The image's user, so that fsGroup makes the volume writable for it.
    user = dockerfile_stages()["server"].last("USER")
    pod = sts["spec"]["template"]["spec"]["securityContext"]
    assert f"{pod['runAsUser']}:{pod['fsGroup']}" == user and pod["runAsNonRoot"] is True
    limits, requests = container["resources"]["limits"], container["resources"]["requests"]
    assert set(limits) == set(requests) == {"cpu", "memory"}
    # SIGTERM drains for the grace, and the kubelet must not SIGKILL before.
    grace = float(_env(container)["OUTRIG_GRACE_SECONDS"])
    assert sts["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] > grace + 10


def test_plain_probes_are_native_grpc(resources: Resources) -> None:
    container = _container(resources[("kubernetes", "StatefulSet", "outrig")])
    port = container["ports"][0]["containerPort"]
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert container[probe]["grpc"]["port"] == port, probe
    assert container["readinessProbe"]["grpc"]["service"] == "outrig.v1.Space"
    assert _env(container)["OUTRIG_INSECURE"] == "true"  # plaintext: what the kubelet's probes speak


def test_the_mtls_variant_differs_only_in_env_probes_and_tls(resources: Resources) -> None:
    plain = resources[("kubernetes", "StatefulSet", "outrig")]
    mtls = resources[("mtls", "StatefulSet", "outrig")]
    secret = resources[("kubernetes", "Secret", "outrig-tls")]
    container = _container(mtls)
    env = _env(container)
    assert "OUTRIG_INSECURE" not in env
    mount = next(m["mountPath"] for m in container["volumeMounts"] if m["name"] == "tls")
    volume = next(v for v in mtls["spec"]["template"]["spec"]["volumes"] if v["name"] == "tls")
    assert volume["secret"]["secretName"] == secret["metadata"]["name"]
    keys = set(secret["stringData"])
    for name in ("OUTRIG_TLS_CERT", "OUTRIG_TLS_KEY", "OUTRIG_TLS_CLIENT_CA", "OUTRIG_TOKEN_PUBLIC_KEY"):
        directory, _, key = env[name].rpartition("/")
        assert directory == mount and key in keys, name
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        argv = container[probe]["exec"]["command"]
        assert argv[:3] == ["outrig", "health", "127.0.0.1:7480"], argv
        flags = dict(a.removeprefix("--").split("=", 1) for a in argv[3:] if "=" in a)
        for flag in ("tls-ca", "tls-cert", "tls-key"):
            directory, _, key = flags[flag].rpartition("/")
            assert directory == mount and key in keys, (probe, flag)
        assert flags["tls-ca"] == env["OUTRIG_TLS_CLIENT_CA"]
        assert "server-name" in flags
    assert "--service=outrig.v1.Space" in container["readinessProbe"]["exec"]["command"]

    # Take the differences away, and the two are the same StatefulSet.
    def without_differences(sts: dict[str, Any]) -> dict[str, Any]:
        sts = copy.deepcopy(sts)
        pod = sts["spec"]["template"]["spec"]
        c = pod["containers"][0]
        for key in ("env", "startupProbe", "livenessProbe", "readinessProbe"):
            del c[key]
        c["volumeMounts"] = [m for m in c["volumeMounts"] if m["name"] != "tls"]
        pod["volumes"] = [v for v in pod["volumes"] if v["name"] != "tls"]
        return sts

    assert without_differences(plain) == without_differences(mtls)
    shared = {k: v for k, v in _env(_container(plain)).items() if k != "OUTRIG_INSECURE"}
    assert shared.items() <= env.items()


def test_services_select_the_server(resources: Resources) -> None:
    labels = resources[("kubernetes", "StatefulSet", "outrig")]["spec"]["template"]["metadata"]["labels"]
    service = resources[("kubernetes", "Service", "outrig")]
    headless = resources[("kubernetes", "Service", "outrig-headless")]
    assert headless["spec"]["clusterIP"] == "None"
    for svc in (service, headless):
        assert svc["spec"]["selector"].items() <= labels.items()
        assert svc["spec"]["ports"][0]["port"] == 7480 and svc["spec"]["ports"][0]["targetPort"] == "grpc"
    pdb = resources[("kubernetes", "PodDisruptionBudget", "outrig")]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()


def test_the_policy_configmap_is_a_policy_outrig_accepts(resources: Resources) -> None:
    config_map = resources[("kubernetes", "ConfigMap", "outrig-policy")]
    policy = parse_policy(tomllib.loads(config_map["data"]["policy.toml"]), "configmap-policy.yaml")
    assert len(policy.grants) == 2
    container = _container(resources[("kubernetes", "StatefulSet", "outrig")])
    directory, _, key = _env(container)["OUTRIG_POLICY"].rpartition("/")
    mount = next(m for m in container["volumeMounts"] if m["mountPath"] == directory)
    assert "subPath" not in mount, "a subPath mount never sees an edited ConfigMap"
    assert key in config_map["data"]


def test_the_secret_holds_placeholders_only() -> None:
    text = (KUBERNETES / "secret-tls.yaml").read_text()
    assert "BEGIN" not in text and "PRIVATE KEY" not in text
    (secret,) = load_yaml_documents(KUBERNETES / "secret-tls.yaml")
    assert all(str(v).startswith("REPLACE") for v in secret["stringData"].values())


def test_the_job_runs_the_stress_campaign(resources: Resources) -> None:
    job = resources[("kubernetes", "Job", "outrig-stress")]
    (container,) = job["spec"]["template"]["spec"]["containers"]
    args = container["args"]
    assert args[:4] == ["-f", "loadtest/locustfile.py", "--campaign", "stress"]
    assert args[args.index("--host") + 1] == "outrig:7480"
    assert "--headless" in args
    assert job["spec"]["backoffLimit"] == 0
    assert job["spec"]["template"]["spec"]["restartPolicy"] == "Never"


def test_the_postgres_tier_is_replicas_of_a_deployment(resources: Resources) -> None:
    deployment = resources[("postgres", "Deployment", "outrig-pg")]
    secret = resources[("postgres", "Secret", "outrig-postgres")]
    pdb = resources[("postgres", "PodDisruptionBudget", "outrig-pg")]
    assert deployment["spec"]["replicas"] >= 2
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"] == labels == pdb["spec"]["selector"]["matchLabels"]
    assert pdb["spec"]["minAvailable"] < deployment["spec"]["replicas"]
    container = _container(deployment)
    env = {item["name"]: item for item in container["env"]}
    assert env["OUTRIG_BACKEND"]["value"] == "postgres"
    # One database for every replica: the same Secret's DSN.
    reference = env["OUTRIG_DSN"]["valueFrom"]["secretKeyRef"]
    assert (reference["name"], reference["key"]) == (secret["metadata"]["name"], "dsn")
    assert set(secret["stringData"]) == {"dsn"}
    assert float(env["OUTRIG_OWNER_LEASE"]["value"]) > 0
    assert "volumeClaimTemplates" not in deployment["spec"]  # the database holds the spaces durably
    grace = float(env["OUTRIG_GRACE_SECONDS"]["value"])
    assert deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] > grace + 10


def test_each_replica_advertises_its_pod_ip(resources: Resources) -> None:
    """The others forward calls to a space's owner at the address it advertises: the pod's own IP
    (from the downward API), at the port it listens on. Kubernetes expands $(POD_IP) only when
    POD_IP is defined earlier in the list."""
    container = _container(resources[("postgres", "Deployment", "outrig-pg")])
    names = [item["name"] for item in container["env"]]
    env = {item["name"]: item for item in container["env"]}
    assert env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    port = next(p["containerPort"] for p in container["ports"] if p["name"] == "grpc")
    assert env["OUTRIG_ADVERTISE"]["value"] == f"$(POD_IP):{port}"
    assert names.index("POD_IP") < names.index("OUTRIG_ADVERTISE")
    host, _, listen_port = env["OUTRIG_LISTEN"]["value"].rpartition(":")
    assert (host, int(listen_port)) == ("0.0.0.0", port)  # reachable at the pod IP, not loopback only


def test_the_tier_is_probed_as_the_embedded_server_is(resources: Resources) -> None:
    """Native gRPC probes; readiness asks outrig.v1.Space, which the server reports NOT_SERVING
    while it cannot reach PostgreSQL (docs/deploy.md)."""
    tier = _container(resources[("postgres", "Deployment", "outrig-pg")])
    embedded = _container(resources[("kubernetes", "StatefulSet", "outrig")])
    port = next(p["containerPort"] for p in tier["ports"] if p["name"] == "grpc")
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert tier[probe]["grpc"]["port"] == port, probe
    assert tier["readinessProbe"]["grpc"]["service"] == "outrig.v1.Space"
    assert "service" not in tier["livenessProbe"]["grpc"]
    assert tier["readinessProbe"] == embedded["readinessProbe"]
    assert tier["livenessProbe"] == embedded["livenessProbe"]
    assert tier["env"][[e["name"] for e in tier["env"]].index("OUTRIG_INSECURE")]["value"] == "true"


def test_the_tier_has_a_client_service_and_a_headless_one(resources: Resources) -> None:
    deployment = resources[("postgres", "Deployment", "outrig-pg")]
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    ports = {p["name"]: p["containerPort"] for p in _container(deployment)["ports"]}
    client = resources[("postgres", "Service", "outrig-pg")]
    headless = resources[("postgres", "Service", "outrig-pg-headless")]
    assert client["spec"]["type"] == "ClusterIP" and "clusterIP" not in client["spec"]
    assert headless["spec"]["clusterIP"] == "None"
    # Clients are sent to ready servers only: one that cannot reach the database is left out.
    assert not headless["spec"].get("publishNotReadyAddresses", False)
    for svc in (client, headless):
        assert svc["spec"]["selector"] == labels
        (port,) = svc["spec"]["ports"]
        assert port["targetPort"] == "grpc" and port["port"] == ports["grpc"]
        assert port["appProtocol"] == "grpc"


def test_every_outrig_variable_is_a_setting(resources: Resources) -> None:
    """A misspelt OUTRIG_* variable would be ignored silently by the server."""
    settings = {f"OUTRIG_{name.upper()}" for name in config._SCALARS}
    for key, resource in resources.items():
        if resource["kind"] not in ("StatefulSet", "Deployment"):
            continue
        variables = {e["name"] for e in _container(resource)["env"] if e["name"].startswith("OUTRIG_")}
        assert variables <= settings, (key, variables - settings)
