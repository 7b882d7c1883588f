"""The one check every outrig.v1.Space call passes: who is calling, and may they do this.

`Guard.check` runs in the servicer's `unary`/`streaming` wrappers (service/transport/servicer.py) before a
method's body, with the gRPC context and the decoded request. It is there rather than in a server
interceptor because a grpc.aio interceptor does not see the peer's TLS identity. It

1. authenticates: a bearer token in the `authorization` metadata (verified once, then cached
   until it expires), else the client certificate's principal (its SAN URI, else its CN, as gRPC
   reports them: no certificate is parsed per call), else, on a server with no authentication
   configured, `ANONYMOUS`. No identity where one is required, or one whose name breaks the name
   rule (principal.py: empty, `*`, `group:...`, control characters): UnauthenticatedError.
2. works out the `Access` (action, space, types) from the request's names (security/access.py);
3. asks the current `Policy` about (principal, action, space, type) for each type, from its
   decision cache after the first time. A refusal is PermissionDeniedError and a log line
   naming principal, action and resource.

Health checking and reflection are other services on the same server and are not checked: a load
balancer must be able to probe, and reflection describes only the protocol.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

from outrig.service.config import Limits
from outrig.service.exceptions import PermissionDeniedError, UnauthenticatedError
from outrig.service.security.access import ACCESS
from outrig.service.security.policy import SCHEME
from outrig.service.security.policy_file import PolicyFile
from outrig.service.security.principal import ANONYMOUS, Principal, refusal
from outrig.service.security.tokens import TokenVerifier

log = logging.getLogger("outrig.service.security")

_BEARER = "bearer "


class CallContext(Protocol):
    """What the guard reads of a call's context (a grpc.aio.ServicerContext): its metadata, its
    peer, and the TLS identity gRPC verified."""

    def invocation_metadata(self) -> Iterable[tuple[str, str | bytes]] | None: ...

    def peer(self) -> str: ...

    def auth_context(self) -> Mapping[str, Iterable[bytes]]: ...


class Authenticator:
    """Finds the principal of a call: token first, then client certificate."""

    def __init__(self, tokens: TokenVerifier | None, client_certificates: bool) -> None:
        self._tokens = tokens
        self._certificates = client_certificates
        self.required = tokens is not None or client_certificates

    def principal(self, context: CallContext) -> Principal:
        if not self.required:
            return ANONYMOUS
        token = _bearer_token(context)
        if token is not None:
            if self._tokens is None:
                raise UnauthenticatedError("token: this server does not accept bearer tokens")
            return self._tokens.principal(token)
        if self._certificates:
            name = _certificate_name(context.auth_context())
            if name is None:
                raise UnauthenticatedError("client certificate: names no principal (no SAN URI, no CN)")
            refused = refusal(name)
            if refused is not None:  # a CA signing a CN 'group:ops' must not hand out group ops
                raise UnauthenticatedError(f"client certificate: {refused}")
            return Principal(name)
        raise UnauthenticatedError("no credential: send a bearer token in the 'authorization' metadata")


def _bearer_token(context: CallContext) -> str | None:
    for key, value in context.invocation_metadata() or ():
        if key == "authorization":
            text = value if isinstance(value, str) else value.decode("ascii", "replace")
            if text[: len(_BEARER)].lower() != _BEARER:
                raise UnauthenticatedError("authorization: expected 'Bearer <token>'")
            return text[len(_BEARER) :].strip()
    return None


def _certificate_name(auth: Mapping[str, Iterable[bytes]]) -> str | None:
    for key in ("peer_uri", "x509_common_name"):  # gRPC's names for the SAN URI and the CN
        for value in auth.get(key, ()):  # the first, if any
            return value.decode("utf-8", "replace")
    return None


class Guard:
    """Authentication, then authorization against the current policy (if any)."""

    def __init__(self, authenticator: Authenticator, policy: PolicyFile | None, limits: Limits) -> None:
        self._authenticator = authenticator
        self.policy = policy
        self._limits = limits
        self.open = not authenticator.required and policy is None
        self.authenticates = authenticator.required
        self.on_denied: Callable[[str], None] | None = None  # told the action of each denial (metrics)

    def check(self, context: CallContext, method: str, request: Any) -> None:
        """Raise UnauthenticatedError or PermissionDeniedError unless the call may go ahead."""
        if self.open:
            return
        try:
            principal = self._authenticator.principal(context)
        except UnauthenticatedError as err:
            log.warning("unauthenticated: %s from %s: %s", method, context.peer(), err)
            raise
        if self.policy is None:
            return
        access = ACCESS[method](request, self._limits)
        policy = self.policy.current
        for type_name in access.types:
            if not policy.allows(principal, access.action, access.space, type_name):
                resource = _resource(access.space, type_name)
                log.warning(
                    "denied: principal=%r action=%s resource=%s (%s)",
                    principal.name,
                    access.action,
                    resource,
                    method,
                )
                if self.on_denied is not None:
                    self.on_denied(access.action)
                raise PermissionDeniedError(
                    f"{principal.name!r} may not {access.action} {resource} (no grant allows it)"
                )


def _resource(space: str, type_name: str | None) -> str:
    return f"{SCHEME}{space}" if type_name is None else f"{SCHEME}{space}/{type_name}"
