"""Security settings come from flags, OUTRIG_* and the TOML file like every other setting."""

from __future__ import annotations

from pathlib import Path

import pytest

from outrig.service.config import load_config
from outrig.service.exceptions import ConfigError
from outrig.service.security.settings import is_loopback, server_credentials


def test_security_settings_from_each_source(tmp_path: Path) -> None:
    file = tmp_path / "outrig.toml"
    file.write_text('tls_cert = "/etc/outrig/server.pem"\ntoken_audience = "jobs"\ninsecure = true\n')
    config = load_config(
        file,
        environ={"OUTRIG_TLS_KEY": "/etc/outrig/server.key", "OUTRIG_POLICY": "/etc/outrig/policy.toml"},
        flags={"tls_client_ca": "/etc/outrig/ca.pem", "token_public_key": None},
    )
    assert config.tls_cert == Path("/etc/outrig/server.pem")
    assert config.tls_key == Path("/etc/outrig/server.key")
    assert config.tls_client_ca == Path("/etc/outrig/ca.pem")
    assert config.policy == Path("/etc/outrig/policy.toml")
    assert config.token_public_key is None
    assert config.token_audience == "jobs"
    assert config.insecure is True


def test_bad_security_settings_are_named() -> None:
    with pytest.raises(ConfigError, match="token_audience"):
        load_config(environ={"OUTRIG_TOKEN_AUDIENCE": ""})
    with pytest.raises(ConfigError, match="insecure"):
        load_config(environ={"OUTRIG_INSECURE": "maybe"})
    with pytest.raises(ConfigError, match="tls_cert and tls_key"):
        server_credentials(load_config(environ={"OUTRIG_TLS_CERT": "/x.pem"}))
    with pytest.raises(ConfigError, match="tls_client_ca"):
        server_credentials(load_config(environ={"OUTRIG_TLS_CLIENT_CA": "/x.pem"}))
    with pytest.raises(ConfigError, match="cannot read"):
        server_credentials(
            load_config(environ={"OUTRIG_TLS_CERT": "/no/x.pem", "OUTRIG_TLS_KEY": "/no/x.key"})
        )


@pytest.mark.parametrize(
    ("host", "loopback"),
    [("127.0.0.1", True), ("127.1.2.3", True), ("::1", True), ("[::1]", True), ("localhost", True),
     ("0.0.0.0", False), ("10.0.0.1", False), ("example.org", False), ("::", False)],
)  # fmt: skip
def test_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback
