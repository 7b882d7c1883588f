"""Bearer tokens: issued and checked with real Ed25519 keys."""

from __future__ import annotations

import time
from pathlib import Path

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from outrig.service.exceptions import UnauthenticatedError
from outrig.service.security import tokens
from outrig.service.security.principal import Principal


@pytest.fixture(scope="module")
def key() -> Ed25519PrivateKey:
    return Ed25519PrivateKey.generate()


def test_a_token_names_its_principal_and_groups(key: Ed25519PrivateKey) -> None:
    token = tokens.issue_token(key, "alice", 3600, ["ops", "dev"])
    verifier = tokens.TokenVerifier(key.public_key())
    assert verifier.principal(token) == Principal("alice", frozenset({"ops", "dev"}))


@pytest.mark.parametrize(
    ("make", "needle"),
    [
        (lambda k: tokens.issue_token(Ed25519PrivateKey.generate(), "alice", 3600), "signature"),
        (lambda k: tokens.issue_token(k, "alice", 60, now=time.time() - 3600), "expired"),
        (lambda k: tokens.issue_token(k, "alice", 3600, audience="elsewhere"), "audience"),
        (lambda k: "not.a.token", "invalid"),
        (lambda k: jwt.encode({"sub": "alice", "aud": "outrig"}, k, algorithm="EdDSA"), "'exp'"),
        (
            lambda k: jwt.encode({"sub": "a", "aud": "outrig", "exp": 2**40}, "s" * 32, algorithm="HS256"),
            "invalid",
        ),
    ],
)
def test_bad_tokens_are_refused_saying_why(key: Ed25519PrivateKey, make, needle: str) -> None:  # type: ignore[no-untyped-def]
    verifier = tokens.TokenVerifier(key.public_key())
    with pytest.raises(UnauthenticatedError, match="token") as info:
        verifier.principal(make(key))
    assert needle in str(info.value)


def test_a_verified_token_is_checked_once_until_it_expires(key: Ed25519PrivateKey) -> None:
    now = [time.time()]
    verifier = tokens.TokenVerifier(key.public_key(), clock=lambda: now[0])
    token = tokens.issue_token(key, "alice", 60, now=now[0])
    calls = []
    real = verifier._verify

    def counting(text: str, at: float) -> tuple[Principal, float]:
        calls.append(at)
        return real(text, at)

    verifier._verify = counting  # type: ignore[method-assign]
    for _ in range(5):
        assert verifier.principal(token).name == "alice"
    assert len(calls) == 1
    now[0] += 61  # past its expiry: the cached entry is dropped and the token checked again
    with pytest.raises(UnauthenticatedError, match="expired"):
        verifier.principal(token)
    assert len(calls) == 2


def test_key_files_and_ttls(tmp_path: Path) -> None:
    private, public = tokens.write_key_pair(tmp_path)
    assert private.stat().st_mode & 0o777 == 0o600
    token = tokens.issue_token(tokens.load_private_key(private), "bob", tokens.parse_ttl("15m"))
    assert tokens.TokenVerifier(tokens.load_public_key(public)).principal(token).name == "bob"
    with pytest.raises(FileExistsError):
        tokens.write_key_pair(tmp_path)
    assert [tokens.parse_ttl(t) for t in ("90", "90s", "15m", "1h", "7d")] == [90, 90, 900, 3600, 604800]
    for bad in ("", "0", "1w", "-5m", "h"):
        with pytest.raises(ValueError, match="ttl"):
            tokens.parse_ttl(bad)
    with pytest.raises(ValueError, match=r"token\.key"):
        tokens.load_public_key(tmp_path / "token.key")  # not a public key
    with pytest.raises(ValueError, match="not an Ed25519 private key"):
        _ec_key(tmp_path)


def _ec_key(tmp_path: Path) -> None:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    path = tmp_path / "ec.key"
    key = ec.generate_private_key(ec.SECP256R1())
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    tokens.load_private_key(path)
