"""`outrig certs dev`, `outrig keys ed25519` and `outrig token issue`, run as the CLI runs them."""

from __future__ import annotations

from pathlib import Path

import pytest

from outrig.service.cli import main
from outrig.service.security import certs, tokens


def test_keys_then_token_issue(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["keys", "ed25519", str(tmp_path)]) == 0
    capsys.readouterr()
    argv = ["token", "issue", "--key", str(tmp_path / "token.key"), "--principal", "alice"]
    assert main([*argv, "--ttl", "15m", "--groups", "ops, dev"]) == 0
    token = capsys.readouterr().out.strip()
    verifier = tokens.TokenVerifier(tokens.load_public_key(tmp_path / "token.pub"))
    principal = verifier.principal(token)
    assert principal.name == "alice" and principal.groups == {"ops", "dev"}
    assert main([*argv, "--ttl", "soon"]) == 2
    assert "ttl" in capsys.readouterr().err
    assert main(["keys", "ed25519", str(tmp_path)]) == 2  # never overwrites a key
    assert "already exists" in capsys.readouterr().err


def test_certs_dev(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["certs", "dev", str(tmp_path), "--client", "carol", "--client-uri", "spiffe://x/carol"]) == 0
    assert len(capsys.readouterr().out.split()) == 6
    assert certs.certificate_principal((tmp_path / "client.pem").read_bytes()) == "spiffe://x/carol"
    assert main(["certs", "dev", str(tmp_path)]) == 2


@pytest.mark.parametrize("name", ["group:admins", "*", "tab\there"])
def test_token_issue_refuses_a_principal_named_like_a_group(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    assert main(["keys", "ed25519", str(tmp_path)]) == 0
    capsys.readouterr()
    assert main(["token", "issue", "--key", str(tmp_path / "token.key"), "--principal", name]) == 2
    out, err = capsys.readouterr()
    assert out == ""  # no token printed
    assert err.startswith("outrig token: ") and "principal name" in err and "'group:'" in err


@pytest.mark.parametrize(
    "flags",
    [["--client", "group:admins"], ["--client", "*"], ["--client-uri", "group:admins"], ["--client", "a\nb"]],
)
def test_certs_dev_refuses_a_client_named_like_a_group(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str]
) -> None:
    assert main(["certs", "dev", str(tmp_path / "pki"), *flags]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("outrig certs: ") and "principal name" in err
    assert not (tmp_path / "pki").exists() or not any((tmp_path / "pki").iterdir())  # nothing written
