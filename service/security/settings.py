"""From the configuration to what the server runs with: its credentials, its `Guard`, and the rule
on where it may listen.

The rule: a server with no TLS, or with no authentication (no client CA, no token key), listens
on a loopback address only (127.0.0.0/8, ::1, localhost), with a warning in the log, unless
`insecure` is set. With mutual TLS, client certificates are required at the handshake; tokens, if
also configured, then name the principal when a call carries one (gRPC's Python server can ask
for a client certificate only by requiring it).
"""

from __future__ import annotations

import ipaddress
import logging
from pathlib import Path

import grpc

from outrig.service.config import ServerConfig
from outrig.service.exceptions import ConfigError
from outrig.service.security.guard import Authenticator, Guard
from outrig.service.security.policy_file import PolicyFile
from outrig.service.security.tokens import TokenVerifier, load_public_key

log = logging.getLogger("outrig.service.security")


def is_loopback(host: str) -> bool:
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _read(path: Path, what: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as err:
        raise ConfigError(f"{what}: cannot read {path}: {err}") from err


def server_credentials(config: ServerConfig) -> grpc.ServerCredentials | None:
    """TLS credentials for the listening port, or None for plaintext."""
    if config.tls_cert is None and config.tls_key is None:
        if config.tls_client_ca is not None:
            raise ConfigError("tls_client_ca: mutual TLS needs tls_cert and tls_key too")
        return None
    if config.tls_cert is None or config.tls_key is None:
        raise ConfigError("tls_cert and tls_key: give both (the server's certificate chain and its key)")
    cert, key = _read(config.tls_cert, "tls_cert"), _read(config.tls_key, "tls_key")
    client_ca = None if config.tls_client_ca is None else _read(config.tls_client_ca, "tls_client_ca")
    try:
        return grpc.ssl_server_credentials(
            [(key, cert)], root_certificates=client_ca, require_client_auth=client_ca is not None
        )
    except Exception as err:  # gRPC raises plain errors for unusable PEM
        raise ConfigError(f"tls_cert/tls_key: cannot use them: {err}") from err


def peer_credentials(config: ServerConfig) -> grpc.ChannelCredentials | None:
    """The credentials of a call this server forwards to another of its tier (the transport's
    peers.py), or None for plaintext: a server that serves TLS calls its peers over TLS, trusting
    `tls_client_ca` if it has one (the tier's CA) and else its own certificate (servers of a tier
    share their certificate, or a CA whose chain it includes), and presents its own certificate
    and key as a client's, which a peer that requires client certificates asks for."""
    if config.tls_cert is None or config.tls_key is None:
        return None
    cert, key = _read(config.tls_cert, "tls_cert"), _read(config.tls_key, "tls_key")
    roots = cert if config.tls_client_ca is None else _read(config.tls_client_ca, "tls_client_ca")
    try:
        return grpc.ssl_channel_credentials(root_certificates=roots, private_key=key, certificate_chain=cert)
    except Exception as err:  # gRPC raises plain errors for unusable PEM
        raise ConfigError(f"tls_cert/tls_key: cannot use them to call peers: {err}") from err


def build_guard(config: ServerConfig) -> Guard:
    """The guard for this configuration; ConfigError (or PolicyError) if a file cannot be used."""
    tokens = None
    if config.token_public_key is not None:
        try:
            key = load_public_key(config.token_public_key)
        except (OSError, ValueError) as err:
            raise ConfigError(f"token_public_key: {err}") from err
        tokens = TokenVerifier(key, config.token_audience)
    authenticator = Authenticator(tokens, client_certificates=config.tls_client_ca is not None)
    policy = PolicyFile(config.policy) if config.policy is not None else None
    return Guard(authenticator, policy, config.limits)


def check_listen(config: ServerConfig, host: str, tls: bool, authenticated: bool) -> None:
    """Refuse a non-loopback address without TLS and authentication, unless `insecure`; warn."""
    if not authenticated:
        where = "on loopback only" if is_loopback(host) else f"on {host} because of --insecure"
        if not is_loopback(host) and not config.insecure:
            raise ConfigError(
                f"listen: refusing to serve on {host} without authentication "
                "(configure --tls-cert/--tls-key with --tls-client-ca or --token-public-key, "
                "or pass --insecure)"
            )
        log.warning(
            "no authentication configured: every caller is 'anonymous' and %s (%s)",
            "gets the policy's grants to '*'" if config.policy is not None else "may do anything",
            where,
        )
    if not tls and not is_loopback(host):
        if not config.insecure:
            raise ConfigError(
                f"listen: refusing to serve on {host} without TLS "
                "(give --tls-cert and --tls-key, or --insecure)"
            )
        log.warning(
            "serving plaintext on %s (--insecure): credentials and entries cross the network in clear", host
        )
