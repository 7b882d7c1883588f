"""Who is calling: a principal's name and the groups its credentials put it in, and the rule a
principal's name follows.

**The name rule.** A policy names three kinds of subject in the same list, by their spelling:
`*` (anyone authenticated), `group:NAME` (a group's members) and anything else (the principal of
that name). So that every principal can be named in a policy as itself, and nothing else, a
principal's name must

- not be empty,
- not be `*`,
- not start with `group:` (exactly that prefix, as the policy reads it),
- contain no control character (Unicode category Cc: C0, DEL, C1), which would make log lines and
  denial messages say something other than what happened.

Anything else is a name: `spiffe://example.org/ns/jobs/sa/worker`, `user:alice`, `Group:x`.
Authentication refuses a credential that names a principal against the rule (UNAUTHENTICATED),
`outrig token issue` and `outrig certs dev` refuse to mint one, and a policy that lists such a
name as a grantee or a group member is malformed. The policy does not rely on the rule: it keeps
principals and groups apart whatever a principal is called (service/security/policy.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from outrig.service.exceptions import excerpt

GROUP_PREFIX = "group:"
ANYONE = "*"
NAME_RULE = (
    f"a principal name must be non-empty, not {ANYONE!r}, not start with {GROUP_PREFIX!r} "
    "and contain no control characters"
)
# Unicode category Cc, all of it: C0 controls, DEL and C1 controls. A regex: the certificate path
# checks the name on every call.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


@dataclass(frozen=True, slots=True)
class Principal:
    """An authenticated caller. `groups` come from its token (a certificate names none); a
    policy's own [groups] table adds more by name. Any string is accepted here, so the policy can
    be tested on names authentication refuses; `name_fault` is the rule credentials are held to."""

    name: str
    groups: frozenset[str] = frozenset()

    def __str__(self) -> str:
        return self.name


# The caller on a server with no authentication configured: grants to "*" apply to it.
ANONYMOUS = Principal("anonymous")


def name_fault(name: str) -> str | None:
    """What is wrong with `name` as a principal's name (a phrase), or None if nothing is."""
    if not name:
        return "is empty"
    if name == ANYONE:
        return f"is {ANYONE!r}, which a policy reads as anyone"
    if name.startswith(GROUP_PREFIX):
        return f"starts with {GROUP_PREFIX!r}, which a policy reads as a group"
    return control_fault(name)


def control_fault(name: str) -> str | None:
    """'contains the control character ...' if `name` has one (a group's name is held to this)."""
    control = _CONTROL.search(name)
    return None if control is None else f"contains the control character {control.group()!r}"


def refusal(name: str) -> str | None:
    """The message refusing `name` as a principal's name ("principal name 'x' starts with ...:
    the rule"), or None if the name follows the rule."""
    fault = name_fault(name)
    if fault is None:
        return None
    return f"principal name {excerpt(name)} {fault} ({NAME_RULE})"


def check_name(name: str) -> str:
    """`name`, if it may name a principal; ValueError stating the rule otherwise."""
    message = refusal(name)
    if message is not None:
        raise ValueError(message)
    return name
