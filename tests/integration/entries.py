"""Entry classes shared by the SDK integration tests (explicit type names, as other languages see them)."""

from __future__ import annotations

import array
from dataclasses import dataclass
from typing import Any

import numpy as np

import outrig


@dataclass
class Animal(outrig.Entry, type_name="it.Animal"):
    name: str | None = None
    legs: int | None = None


@dataclass
class Dog(Animal, type_name="it.Dog"):
    breed: str | None = None


@dataclass
class Puppy(Dog, type_name="it.Puppy"):
    age_weeks: int | None = None


@dataclass
class Task(outrig.Entry, type_name="it.Task"):
    job: str | None = None
    n: int | None = None


@dataclass
class Everything(outrig.Entry, type_name="it.Everything"):
    flag: bool | None = None
    count: int | None = None
    ratio: float | None = None
    text: str | None = None
    blob: bytes | None = None
    ints: array.array[int] | array.array[float] | None = None
    samples: np.ndarray[Any, Any] | None = None
    items: list[Any] | None = None
    meta: dict[str, Any] | None = None
