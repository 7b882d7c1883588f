"""Signed bearer tokens: JWTs signed with Ed25519 (EdDSA), made and checked by PyJWT.

A token's claims: `sub` (the principal, held to the name rule of principal.py), `aud` (the
server's audience, "outrig" unless configured), `iat`, `exp`, and optionally `groups` (a list of
group names). `outrig keys ed25519 DIR` writes a key pair; `outrig token issue --key DIR/token.key
--principal alice --ttl 1h` prints a token; the server is given the public key
(`--token-public-key DIR/token.pub`).

Verifying a signature costs tens of microseconds, so `TokenVerifier` keeps each verified token
(by its exact text) until it expires: a client that sends the same token on every call pays the
signature check once. Bad tokens are not cached.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jwt
from cachetools import LRUCache
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from outrig.service.exceptions import UnauthenticatedError
from outrig.service.security.principal import Principal, check_name, refusal

DEFAULT_AUDIENCE = "outrig"
ALGORITHM = "EdDSA"
_TTL = re.compile(r"(\d+(?:\.\d+)?)([smhd]?)")
_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_ttl(text: str) -> float:
    """'90', '90s', '15m', '1h', '7d' as seconds."""
    match = _TTL.fullmatch(text.strip())
    if match is None or float(match.group(1)) <= 0:
        raise ValueError(f"ttl: expected a positive duration like 90s, 15m, 1h or 7d, got {text!r}")
    return float(match.group(1)) * _UNITS[match.group(2)]


def write_key_pair(directory: Path) -> tuple[Path, Path]:
    """Write a new Ed25519 key pair: DIR/token.key (private, mode 600) and DIR/token.pub."""
    directory.mkdir(parents=True, exist_ok=True)
    private_path, public_path = directory / "token.key", directory / "token.pub"
    for path in (private_path, public_path):
        if path.exists():
            raise FileExistsError(f"{path} already exists; not overwriting")
    key = Ed25519PrivateKey.generate()
    private_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    private_path.chmod(0o600)
    public_path.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return private_path, public_path


def load_private_key(path: Path) -> Ed25519PrivateKey:
    try:
        key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    except (ValueError, TypeError) as err:
        raise ValueError(f"{path}: not a PEM private key ({err})") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise ValueError(f"{path}: not an Ed25519 private key")
    return key


def load_public_key(path: Path) -> Ed25519PublicKey:
    try:
        key = serialization.load_pem_public_key(path.read_bytes())
    except ValueError as err:
        raise ValueError(f"{path}: not a PEM public key ({err})") from None
    if not isinstance(key, Ed25519PublicKey):
        raise ValueError(f"{path}: not an Ed25519 public key")
    return key


def issue_token(
    key: Ed25519PrivateKey,
    principal: str,
    ttl: float,
    groups: Sequence[str] = (),
    audience: str = DEFAULT_AUDIENCE,
    now: float | None = None,
) -> str:
    """A signed token naming `principal`, valid for `ttl` seconds; ValueError if `principal` breaks
    the name rule (principal.py): no server would accept the token."""
    check_name(principal)
    issued = int(time.time() if now is None else now)
    claims: dict[str, Any] = {"sub": principal, "aud": audience, "iat": issued, "exp": issued + int(ttl)}
    if groups:
        claims["groups"] = list(groups)
    return jwt.encode(claims, key, algorithm=ALGORITHM)


class TokenVerifier:
    """Checks a token's signature, expiry and audience; remembers verified tokens until they expire."""

    def __init__(
        self,
        public_key: Ed25519PublicKey,
        audience: str = DEFAULT_AUDIENCE,
        *,
        cache_size: int = 10_000,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._key = public_key
        self._audience = audience
        self._clock = clock
        self._verified: LRUCache[str, tuple[Principal, float]] = LRUCache(maxsize=cache_size)

    def principal(self, token: str) -> Principal:
        """The principal a valid token names; UnauthenticatedError saying why otherwise."""
        hit = self._verified.get(token)
        now = self._clock()
        if hit is not None:
            principal, expires = hit
            if now < expires:
                return principal
            del self._verified[token]
        principal, expires = self._verify(token, now)
        self._verified[token] = (principal, expires)
        return principal

    def _verify(self, token: str, now: float) -> tuple[Principal, float]:
        try:
            claims = jwt.decode(
                token,
                self._key,
                algorithms=[ALGORITHM],
                audience=self._audience,
                options={"require": ["exp", "sub", "aud"], "verify_iat": False},
                leeway=0,
            )
        except jwt.ExpiredSignatureError:
            raise UnauthenticatedError("token: expired") from None
        except jwt.InvalidAudienceError:
            raise UnauthenticatedError(
                f"token: not for this server (audience must be {self._audience!r})"
            ) from None
        except jwt.InvalidSignatureError:
            raise UnauthenticatedError("token: signature does not verify") from None
        except jwt.MissingRequiredClaimError as err:
            raise UnauthenticatedError(f"token: missing claim {err.claim!r}") from None
        except jwt.InvalidTokenError as err:
            raise UnauthenticatedError(f"token: invalid ({err})") from None
        subject, groups = claims.get("sub"), claims.get("groups", [])
        if not isinstance(subject, str) or not subject:
            raise UnauthenticatedError("token: claim 'sub' must be a non-empty string")
        refused = refusal(subject)
        if refused is not None:  # e.g. 'group:ops': never a group's grants by being called so
            raise UnauthenticatedError(f"token: claim 'sub': {refused}")
        if not isinstance(groups, list) or not all(isinstance(g, str) for g in groups):
            raise UnauthenticatedError("token: claim 'groups' must be a list of strings")
        expires = float(claims["exp"])
        if expires <= now:  # PyJWT compares with its own clock; ours is the one the cache uses
            raise UnauthenticatedError("token: expired")
        return Principal(subject, frozenset(groups)), expires
