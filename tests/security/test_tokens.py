"""Bearer tokens: issued and checked with real Ed25519 keys."""

from __future__ import annotations

import time
from collections.abc import Callable
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
def test_bad_tokens_are_refused_saying_why(
    key: Ed25519PrivateKey, make: Callable[[Ed25519PrivateKey], str], needle: str
) -> None:
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

    def counting(token: str, now: float) -> tuple[Principal, float]:
        calls.append(now)
        return real(token, now)

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


REFUSED_NAMES = ["group:admins", "group:", "*", "bob\n", "a\x00b", "\x7f", "\u0085x"]


@pytest.mark.parametrize("name", REFUSED_NAMES)
def test_a_token_naming_a_principal_no_policy_could_tell_from_a_group_is_refused(
    key: Ed25519PrivateKey, name: str
) -> None:
    # Signed with the right key (a token from an identity provider with free-text subjects):
    # still refused, naming the rule.
    token = jwt.encode({"sub": name, "aud": "outrig", "exp": int(time.time()) + 60}, key, algorithm="EdDSA")
    verifier = tokens.TokenVerifier(key.public_key())
    for _ in range(2):  # refused every time: a refusal is not cached as a principal
        with pytest.raises(UnauthenticatedError, match="token: claim 'sub'") as info:
            verifier.principal(token)
        assert "principal name" in str(info.value) and "'group:'" in str(info.value)


@pytest.mark.parametrize("name", REFUSED_NAMES)
def test_issue_token_refuses_to_mint_such_a_principal(key: Ed25519PrivateKey, name: str) -> None:
    with pytest.raises(ValueError, match="principal name"):
        tokens.issue_token(key, name, 60)


def test_a_principal_name_like_a_uri_or_with_a_colon_is_fine(key: Ed25519PrivateKey) -> None:
    verifier = tokens.TokenVerifier(key.public_key())
    for name in ("spiffe://example.org/ns/jobs/sa/worker", "groups:x", "Group:x", "user:alice", "élodie"):
        assert verifier.principal(tokens.issue_token(key, name, 60)).name == name
