"""The entry classes of the stress campaign, shaped like StressTestWithShutdown's, and a factory
of random instances that each carry a unique identity.

The original writes random instances of 11 entry classes: two three-level hierarchies
(``IntegerMatch > ChildOfIntegerMatch > GrandChildOfIntegerMatch`` and the same for strings),
classes with no parent entry class, an empty class, and classes whose object fields stay unset;
with int, str, float and short-array fields. Every entry carries its identity (where it was made,
and a counter), so that an entry used as its own template matches that entry and no other, and a
take that returns it twice can be told from two takes of different entries.

The identity lives in a plain dataclass mixed into every class rather than in a common entry
supertype, so the parentless classes really have no parent entry type: a template of one of them
matches its own type only.
"""

from __future__ import annotations

import array
import itertools
import os
import random
import socket
import uuid
from dataclasses import dataclass

import outrig

__all__ = [
    "ENTRY_CLASSES",
    "ROOT_TEMPLATES",
    "EntryFactory",
    "Identity",
    "StressEntry",
    "identity_of",
    "matcher_template",
]

_PREFIX = "outrig.stress."


@dataclass
class Identity:
    """Where an entry was made (host, process and a random token) and its number there."""

    origin: str | None = None
    serial: int | None = None


@dataclass
class IntegerMatch(Identity, outrig.Entry, type_name=_PREFIX + "IntegerMatch"):
    number: int | None = None
    ratio: float | None = None


@dataclass
class ChildOfIntegerMatch(IntegerMatch, type_name=_PREFIX + "ChildOfIntegerMatch"):
    count: int | None = None


@dataclass
class GrandChildOfIntegerMatch(ChildOfIntegerMatch, type_name=_PREFIX + "GrandChildOfIntegerMatch"):
    samples: array.array[int] | None = None


@dataclass
class StringMatch(Identity, outrig.Entry, type_name=_PREFIX + "StringMatch"):
    text: str | None = None


@dataclass
class ChildOfStringMatch(StringMatch, type_name=_PREFIX + "ChildOfStringMatch"):
    label: str | None = None


@dataclass
class GrandChildOfStringMatch(ChildOfStringMatch, type_name=_PREFIX + "GrandChildOfStringMatch"):
    weight: float | None = None


@dataclass
class Parentless(Identity, outrig.Entry, type_name=_PREFIX + "Parentless"):
    """No parent entry type, and a field of each kind."""

    number: int | None = None
    text: str | None = None
    ratio: float | None = None
    samples: array.array[float] | None = None


@dataclass
class Empty(Identity, outrig.Entry, type_name=_PREFIX + "Empty"):
    """Declares no field of its own: only the identity every campaign entry carries."""


@dataclass
class UnsetField(Identity, outrig.Entry, type_name=_PREFIX + "UnsetField"):
    """``note`` is never set, so it stays a wildcard when the entry is its own template."""

    number: int | None = None
    note: str | None = None


@dataclass
class FloatMatch(Identity, outrig.Entry, type_name=_PREFIX + "FloatMatch"):
    value: float | None = None
    scale: float | None = None


@dataclass
class ArrayMatch(Identity, outrig.Entry, type_name=_PREFIX + "ArrayMatch"):
    values: array.array[int] | None = None
    tag: str | None = None


StressEntry = (
    IntegerMatch
    | ChildOfIntegerMatch
    | GrandChildOfIntegerMatch
    | StringMatch
    | ChildOfStringMatch
    | GrandChildOfStringMatch
    | Parentless
    | Empty
    | UnsetField
    | FloatMatch
    | ArrayMatch
)

#: The 11 classes, in the order the factory draws from.
ENTRY_CLASSES: tuple[type[StressEntry], ...] = (
    IntegerMatch,
    ChildOfIntegerMatch,
    GrandChildOfIntegerMatch,
    StringMatch,
    ChildOfStringMatch,
    GrandChildOfStringMatch,
    Parentless,
    Empty,
    UnsetField,
    FloatMatch,
    ArrayMatch,
)

#: Templates that together match every campaign entry and nothing else: one per root class.
ROOT_TEMPLATES: tuple[StressEntry, ...] = tuple(
    cls()
    for cls in ENTRY_CLASSES
    if not any(cls is not other and issubclass(cls, other) for other in ENTRY_CLASSES)
)


def identity_of(entry: object) -> tuple[str, int]:
    """The (origin, serial) of a campaign entry read back from a space."""
    origin, serial = getattr(entry, "origin", None), getattr(entry, "serial", None)
    if not isinstance(origin, str) or not isinstance(serial, int):
        raise ValueError(f"not a campaign entry (no identity): {entry!r}")
    return origin, serial


class EntryFactory:
    """Random campaign entries, numbered from 1 under one origin per factory.

    A factory belongs to one process (one Locust runner); its origin names the host and process
    and adds a random token, so two runs, or two workers on one host, never share an identity.
    """

    def __init__(self, seed: int | None = None) -> None:
        self.origin = f"{socket.gethostname()}/{os.getpid()}/{uuid.uuid4().hex[:8]}"
        self._serials = itertools.count(1)
        self._random = random.Random(seed)

    def make(self) -> StressEntry:
        """A random instance of a random class of the 11, with every field but unset ones set."""
        rng = self._random
        cls = rng.choice(ENTRY_CLASSES)
        entry = cls(origin=self.origin, serial=next(self._serials))
        if isinstance(entry, IntegerMatch):
            entry.number = rng.randint(-(2**40), 2**40)
            entry.ratio = rng.random()
            if isinstance(entry, ChildOfIntegerMatch):
                entry.count = rng.randint(0, 1000)
            if isinstance(entry, GrandChildOfIntegerMatch):
                entry.samples = array.array("q", (rng.randint(0, 99) for _ in range(4)))
        elif isinstance(entry, StringMatch):
            entry.text = _word(rng)
            if isinstance(entry, ChildOfStringMatch):
                entry.label = _word(rng)
            if isinstance(entry, GrandChildOfStringMatch):
                entry.weight = rng.uniform(0, 100)
        elif isinstance(entry, Parentless):
            entry.number = rng.randint(0, 2**31)
            entry.text = _word(rng)
            entry.ratio = rng.random()
            entry.samples = array.array("d", (rng.random() for _ in range(3)))
        elif isinstance(entry, UnsetField):
            entry.number = rng.randint(0, 2**31)
        elif isinstance(entry, FloatMatch):
            entry.value = rng.uniform(-1e6, 1e6)
            entry.scale = rng.random()
        elif isinstance(entry, ArrayMatch):
            entry.values = array.array("i", (rng.randint(-1000, 1000) for _ in range(rng.randint(1, 8))))
            entry.tag = _word(rng)
        return entry


def matcher_template(rng: random.Random) -> StressEntry:
    """A random range or prefix template over the campaign classes' fields (their subclasses
    match too): an int range an eighth of the numbers wide, a one- or two-letter prefix, a float
    bound, a set of counts."""
    kind = rng.randrange(5)
    if kind == 0:
        low = rng.randint(-(2**40), 2**40)
        return IntegerMatch(number=outrig.Range(low, low + 2**38, high_inclusive=rng.random() < 0.5))
    if kind == 1:
        letters = "abcdefghijklmnopqrstuvwxyz"
        return StringMatch(text=outrig.Prefix("".join(rng.choice(letters) for _ in range(rng.randint(1, 2)))))
    if kind == 2:
        return FloatMatch(value=outrig.GE(rng.uniform(-1e6, 1e6)))
    if kind == 3:
        return ChildOfIntegerMatch(count=outrig.OneOf(*(rng.randint(0, 1000) for _ in range(20))))
    return Parentless(ratio=outrig.All(outrig.GT(rng.random() / 2), outrig.LE(0.5 + rng.random() / 2)))


def _word(rng: random.Random) -> str:
    return "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(3, 12)))
