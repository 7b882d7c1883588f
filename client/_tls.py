"""`TLS`: how the client proves the server is who it says (and, with a certificate, who it is),
and the channel credentials `connect` builds from it and a bearer token. Shared by both clients."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import grpc

PemSource = str | Path | bytes


@dataclass(frozen=True, slots=True)
class TLS:
    """TLS settings for `outrig.connect` and `outrig.aio.connect`.

    Args:
        ca: the CA certificate(s) that signed the server's certificate (a PEM file's path, or PEM
            bytes); None trusts the system's roots.
        cert: this client's certificate chain (path or PEM bytes), for servers that require client
            certificates (mutual TLS). Give ``key`` with it.
        key: this client's private key (path or PEM bytes).
        server_name: the name to check the server's certificate against when it differs from the
            target's host (for example when connecting by IP address to a certificate for a name).
    """

    ca: PemSource | None = None
    cert: PemSource | None = None
    key: PemSource | None = None
    server_name: str | None = None

    def __post_init__(self) -> None:
        if (self.cert is None) != (self.key is None):
            raise ValueError("TLS: give cert and key together (a client certificate needs its key)")

    def credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(
            root_certificates=_pem(self.ca, "ca"),
            private_key=_pem(self.key, "key"),
            certificate_chain=_pem(self.cert, "cert"),
        )

    def options(self) -> list[tuple[str, str]]:
        return [] if self.server_name is None else [("grpc.ssl_target_name_override", self.server_name)]


def _pem(source: PemSource | None, what: str) -> bytes | None:
    if source is None or isinstance(source, bytes):
        return source
    if not isinstance(source, str | Path):
        raise TypeError(f"TLS.{what} must be a path or PEM bytes, got {type(source).__name__}")
    try:
        return Path(source).read_bytes()
    except OSError as err:
        raise ValueError(f"TLS.{what}: cannot read {source}: {err}") from err


def token_metadata(token: str | None) -> list[tuple[str, str]]:
    """The metadata every call sends for a bearer token (none without one)."""
    return [] if token is None else [("authorization", f"Bearer {token}")]


def channel_credentials(tls: TLS | None, token: str | None) -> grpc.ChannelCredentials | None:
    """Credentials for a secure channel, or None for a plaintext one. A token rides on TLS only:
    sent in clear it would be anyone's. The token itself is not part of the credentials: the
    client sends it as call metadata (`token_metadata`), which costs less per call than gRPC's
    call-credentials plugin."""
    if tls is not None and not isinstance(tls, TLS):
        raise TypeError(f"tls must be an outrig.TLS, got {type(tls).__name__}")
    if token is not None and (not isinstance(token, str) or not token):
        raise TypeError("token must be a non-empty str (from `outrig token issue`)")
    if tls is None:
        if token is not None:
            raise ValueError("token: a bearer token needs TLS; pass tls=outrig.TLS(ca=...) as well")
        return None
    return tls.credentials()
