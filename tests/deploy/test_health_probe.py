"""`outrig health`: the probe behind the image's HEALTHCHECK and the mutual-TLS exec probes."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from outrig.service.cli import commands as cli
from outrig.service.cli.health import default_address
from outrig.service.security.certs import write_dev_certificates

from ..conftest import ServerProcess, start_server
from .files import BIN


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("pki")
    write_dev_certificates(directory, "probe", None)
    return directory


@pytest.fixture(scope="module")
def mtls_server(pki: Path) -> Iterator[ServerProcess]:
    running = start_server(
        "--tls-cert", str(pki / "server.pem"), "--tls-key", str(pki / "server.key"),
        "--tls-client-ca", str(pki / "ca.pem"),
    )  # fmt: skip
    yield running
    assert running.stop() == 0


def client_flags(pki: Path) -> list[str]:
    return [
        f"--tls-ca={pki / 'ca.pem'}",
        f"--tls-cert={pki / 'client.pem'}",
        f"--tls-key={pki / 'client.key'}",
    ]


def test_serving_under_mutual_tls(
    mtls_server: ServerProcess, pki: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["health", mtls_server.address, *client_flags(pki)]) == 0
    assert cli.main(["health", mtls_server.address, *client_flags(pki), "--service=outrig.v1.Space"]) == 0
    # The exec probes' form: an IP address, and the name to check the certificate against.
    port = mtls_server.address.rpartition(":")[2]
    assert cli.main(["health", f"127.0.0.1:{port}", *client_flags(pki), "--server-name=localhost"]) == 0
    assert "is SERVING" in capsys.readouterr().out


def test_refused_without_what_mutual_tls_needs(
    mtls_server: ServerProcess, pki: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    address = mtls_server.address
    assert cli.main(["health", address, "--timeout=2"]) == 1  # plaintext
    assert cli.main(["health", address, f"--tls-ca={pki / 'ca.pem'}", "--timeout=2"]) == 1  # no client cert
    assert cli.main(["health", address, *client_flags(pki), "--server-name=elsewhere", "--timeout=2"]) == 1
    assert cli.main(["health", address, *client_flags(pki), "--service=no.such.Service"]) == 1
    assert "NOT_FOUND" in capsys.readouterr().err


def test_nothing_there_or_bad_files(tmp_path: Path, pki: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["health", "127.0.0.1:1", "--timeout=2"]) == 1
    assert "UNAVAILABLE" in capsys.readouterr().err
    missing = tmp_path / "missing.pem"
    assert cli.main(["health", "127.0.0.1:1", f"--tls-ca={missing}"]) == 1
    assert "missing.pem" in capsys.readouterr().err
    assert (
        cli.main(["health", "127.0.0.1:1", f"--tls-ca={pki / 'ca.pem'}", f"--tls-cert={pki / 'client.pem'}"])
        == 1
    )
    assert "together" in capsys.readouterr().err
    assert cli.main(["health", "127.0.0.1:1", "--quiet", "--timeout=1"]) == 1
    assert capsys.readouterr() == ("", "")


def test_the_default_address_follows_outrig_listen() -> None:
    assert default_address({}) == "127.0.0.1:7480"
    assert default_address({"OUTRIG_LISTEN": "0.0.0.0:9000"}) == "127.0.0.1:9000"
    assert default_address({"OUTRIG_LISTEN": "[::]:9000"}) == "[::1]:9000"
    assert default_address({"OUTRIG_LISTEN": "10.1.2.3:7480"}) == "10.1.2.3:7480"


def test_the_command_line(tmp_path: Path) -> None:
    """As the image runs it: the console script, exit 1 (not Docker's reserved 2) when unreachable."""
    done = subprocess.run(
        [str(BIN / "outrig"), "health", "--timeout=1"],
        env={"OUTRIG_LISTEN": "0.0.0.0:1", "PATH": str(BIN)},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 1 and "127.0.0.1:1" in done.stderr
