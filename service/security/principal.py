"""Who is calling: a principal's name and the groups its credentials put it in."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Principal:
    """An authenticated caller. `groups` come from its token (a certificate names none); a
    policy's own [groups] table adds more by name."""

    name: str
    groups: frozenset[str] = frozenset()

    def __str__(self) -> str:
        return self.name


# The caller on a server with no authentication configured: grants to "*" apply to it.
ANONYMOUS = Principal("anonymous")
