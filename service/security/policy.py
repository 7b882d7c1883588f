"""The grant policy: who may do what to which resources, parsed once, decided once per key.

A policy file (TOML)::

    [groups]
    ops = ["alice", "bob"]                   # principal names; [] is a group with no members

    [[grant]]
    principals = ["alice", "group:ops"]      # a name, group:NAME, or "*" (anyone authenticated)
    resources = ["outrig://jobs/*"]          # outrig://SPACE/TYPE patterns
    actions = ["write", "read", "take"]      # or "*"

A resource is `outrig://SPACE/TYPE` for a call about entries of TYPE in SPACE, and
`outrig://SPACE` for a call about the space itself (renew and cancel, which name leases, not types;
resuming a notify registration). A pattern's space part is a space name or `*` (any space). Its
type part is a type name, or ends in a wildcard segment: `*` matches exactly one more `/`-separated
segment, `-` one or more (River's convention). A pattern ending in `/*` or `/-` also covers the
space itself. Without a policy everything authenticated is allowed; with one, what no grant allows
is denied.

Principals and groups are two namespaces. A grant's `principals` entry is read once, at load, into
a tagged subject: `("principal", NAME)`, `("group", NAME)` for `group:NAME`, or `EVERYONE` for `*`;
a principal is looked up as `("principal", its name)` and its groups as `("group", each)`, so no
principal's name can equal a group's subject or `*`'s, whatever the name (a principal named
`group:ops` is `("principal", "group:ops")`, not group ops). Authentication also refuses such names
(principal.py), so that whoever can call can be named in a policy as itself.

Everything about a grant is worked out at load time: patterns are parsed into `Pattern`s and filed
by (subject, action), so deciding looks only at the grants naming this principal, its groups or
`*`, for this action or `*`. Decisions are kept in an LRU cache keyed by (principal, action, space,
type), the principal being the whole `Principal` (name and token groups), that belongs to the
policy object: a reload builds a new `Policy`, so swapping it drops the old decisions in the same
step.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cachetools import LRUCache

from outrig.service.exceptions import PolicyError, excerpt
from outrig.service.security.principal import (
    GROUP_PREFIX,
    NAME_RULE,
    Principal,
    control_fault,
    name_fault,
)

ACTIONS = ("write", "read", "take", "notify", "renew", "cancel", "admin")
ANY = "*"
SCHEME = "outrig://"
_SPACE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")

# Who a grant is for, tagged so that the namespaces cannot meet: ("principal", name),
# ("group", name), or EVERYONE.
Subject = tuple[str, str]
EVERYONE: Subject = ("everyone", "")


def subject(text: str) -> Subject:
    """The subject a grant's `principals` entry names: `*`, `group:NAME` or a principal's name."""
    if text == ANY:
        return EVERYONE
    if text.startswith(GROUP_PREFIX):
        return ("group", text[len(GROUP_PREFIX) :])
    return ("principal", text)


@dataclass(frozen=True, slots=True)
class Pattern:
    """A parsed resource pattern. `space` None is any space; `tail` is "" (exactly `prefix`),
    "*" (one segment after `prefix`), "-" (one or more), or "space" (the space itself only)."""

    space: str | None
    prefix: tuple[str, ...]
    tail: str

    def covers(self, space: str, type_name: str | None) -> bool:
        if self.space is not None and self.space != space:
            return False
        if type_name is None:  # the space itself
            return self.tail == "space" or (not self.prefix and self.tail in ("*", "-"))
        if self.tail == "space":
            return False
        segments = type_name.split("/")
        n = len(self.prefix)
        if tuple(segments[:n]) != self.prefix:
            return False
        if self.tail == "":
            return len(segments) == n
        return len(segments) == n + 1 if self.tail == "*" else len(segments) > n


def parse_pattern(text: str, where: str = "resource") -> Pattern:
    """`outrig://SPACE[/TYPE]` with `*` as the whole space part and `*` or `-` as a last type segment."""
    if not isinstance(text, str) or not text.startswith(SCHEME):
        raise PolicyError(f"{where}: {text!r} is not an {SCHEME}SPACE/TYPE pattern")
    space, slash, type_part = text[len(SCHEME) :].partition("/")
    if space != ANY and not _SPACE.fullmatch(space):
        raise PolicyError(f"{where}: {text!r}: the space part must be a space name or '*'")
    if not slash:
        return Pattern(None if space == ANY else space, (), "space")
    segments = type_part.split("/")
    tail = ""
    if segments[-1] in ("*", "-"):
        tail = segments.pop()
    for segment in segments:
        if not segment or "*" in segment or segment == "-":
            raise PolicyError(
                f"{where}: {text!r}: empty segment or misplaced wildcard "
                "('*' and '-' are whole last segments)"
            )
    return Pattern(None if space == ANY else space, tuple(segments), tail)


def _strings(value: Any, where: str, *, empty: bool = False) -> list[str]:
    """A list of non-empty strings; an empty list only if `empty` (a group may have no members)."""
    if (
        not isinstance(value, list)
        or (not value and not empty)
        or not all(isinstance(v, str) and v for v in value)
    ):
        kind = "list" if empty else "non-empty list"
        raise PolicyError(f"{where}: expected a {kind} of non-empty strings, got {value!r}")
    return value


def _principal_names(names: list[str], where: str) -> list[str]:
    """Refuse a name authentication never lets a principal have: it could only match no one."""
    for name in names:
        fault = name_fault(name)
        if fault is not None:
            nesting = " (groups do not nest)" if name.startswith(GROUP_PREFIX) else ""
            raise PolicyError(
                f"{where}: {excerpt(name)} is not a principal name: it {fault}{nesting}; {NAME_RULE}"
            )
    return names


@dataclass(frozen=True, slots=True)
class Grant:
    principals: tuple[str, ...]
    patterns: tuple[Pattern, ...]
    actions: tuple[str, ...]


class Policy:
    """A loaded policy and its decision cache. Immutable once built (except the cache)."""

    def __init__(
        self,
        grants: Iterable[Grant],
        groups: Mapping[str, Iterable[str]] | None = None,
        *,
        cache_size: int = 100_000,
        source: str = "<policy>",
    ) -> None:
        self.source = source
        self.grants = tuple(grants)
        members: dict[str, set[str]] = {}
        for group, names in (groups or {}).items():
            for name in names:
                members.setdefault(name, set()).add(group)
        self._groups_of = {name: frozenset(found) for name, found in members.items()}
        self._index: dict[tuple[Subject, str], list[Pattern]] = {}
        for grant in self.grants:
            for text in grant.principals:
                for action in grant.actions:
                    self._index.setdefault((subject(text), action), []).extend(grant.patterns)
        self._decisions: LRUCache[tuple[Principal, str, str, str | None], bool] = LRUCache(maxsize=cache_size)

    def allows(self, principal: Principal, action: str, space: str, type_name: str | None) -> bool:
        """May `principal` do `action` to outrig://space/type_name (type None: the space itself)?"""
        key = (principal, action, space, type_name)
        decision = self._decisions.get(key)
        if decision is None:
            decision = self._decide(principal, action, space, type_name)
            self._decisions[key] = decision
        return decision

    def _decide(self, principal: Principal, action: str, space: str, type_name: str | None) -> bool:
        groups = principal.groups | self._groups_of.get(principal.name, frozenset())
        subjects: list[Subject] = [("principal", principal.name), EVERYONE]
        subjects += [("group", group) for group in groups]
        for who in subjects:
            for granted in (action, ANY):
                for pattern in self._index.get((who, granted), ()):
                    if pattern.covers(space, type_name):
                        return True
        return False

    def statistics(self) -> dict[str, int]:
        return {"grants": len(self.grants), "cached_decisions": len(self._decisions)}


def _group_name_fault(name: str) -> str | None:
    """A group's name is any non-empty text without control characters; it lives in its own
    namespace, so unlike a principal's it may even be `*` or start with `group:`."""
    if not name:
        return "is empty ('group:' needs a group name)"
    return control_fault(name)


def parse_policy(data: Mapping[str, Any], source: str = "<policy>") -> Policy:
    """Build a Policy from a parsed TOML document; PolicyError names what is wrong and where."""
    unknown = set(data) - {"grant", "groups"}
    if unknown:
        raise PolicyError(
            f"{source}: unknown key(s) {', '.join(sorted(unknown))} (expected [groups], [[grant]])"
        )
    groups = data.get("groups", {})
    if not isinstance(groups, Mapping):
        raise PolicyError(f"{source}: groups: expected a table of group = [names]")
    checked_groups = {}
    for group, names in groups.items():
        where = f"{source}: groups.{group}"
        fault = _group_name_fault(group)
        if fault is not None:
            raise PolicyError(f"{where}: the group name {excerpt(group)} {fault}")
        checked_groups[group] = _principal_names(_strings(names, where, empty=True), where)
    grants_data = data.get("grant", [])
    if not isinstance(grants_data, list):
        raise PolicyError(f"{source}: grant: expected [[grant]] tables")
    grants = []
    for i, item in enumerate(grants_data):
        where = f"{source}: grant[{i}]"
        if not isinstance(item, Mapping):
            raise PolicyError(f"{where}: expected a table")
        extra = set(item) - {"principals", "resources", "actions"}
        if extra:
            raise PolicyError(f"{where}: unknown key(s) {', '.join(sorted(extra))}")
        principals = _strings(item.get("principals"), f"{where}.principals")
        for name in principals:
            if name == ANY:
                continue
            if name.startswith(GROUP_PREFIX):
                fault = _group_name_fault(name[len(GROUP_PREFIX) :])
                if fault is not None:
                    raise PolicyError(f"{where}.principals: {excerpt(name)}: the group name {fault}")
            else:
                _principal_names([name], f"{where}.principals")
        resources = _strings(item.get("resources"), f"{where}.resources")
        patterns = tuple(parse_pattern(r, f"{where}.resources[{j}]") for j, r in enumerate(resources))
        actions = _strings(item.get("actions"), f"{where}.actions")
        for action in actions:
            if action != ANY and action not in ACTIONS:
                raise PolicyError(
                    f"{where}.actions: unknown action {action!r} (expected {', '.join(ACTIONS)} or '*')"
                )
        grants.append(Grant(tuple(principals), patterns, tuple(actions)))
    return Policy(grants, checked_groups, source=source)


def load_policy(path: Path) -> Policy:
    """Read and parse a policy file; PolicyError (naming the file) if it cannot be used."""
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as err:
        raise PolicyError(f"{path}: {err}") from err
    return parse_policy(data, str(path))
