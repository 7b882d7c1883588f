"""What the campaigns tell Locust and the user: request events, tallies and the verdict line.

Every outrig call a user makes becomes one Locust request event (request type ``outrig``, a name
per operation, response time in ms, response size in bytes, the exception if it failed), so that
Locust's statistics, CSV files, HTML report and web UI show outrig's calls like any others.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, ClassVar, Self

__all__ = ["AckTally", "AckVerdict", "CheckFailedError", "Tally", "Verdict", "measured"]

REQUEST_TYPE = "outrig"


class CheckFailedError(Exception):
    """A call that returned, but not what the campaign requires (a read that found nothing)."""


@dataclass
class Measure:
    """What `measured` reports: set ``size`` to the response's size in bytes once known."""

    size: int = 0


@contextmanager
def measured(fire: Callable[..., Any], name: str) -> Iterator[Measure]:
    """Time the block and fire one request event named ``name`` for it. The block's exception,
    if any, is the event's exception, and is raised again."""
    measure = Measure()
    start = time.perf_counter()
    failure: Exception | None = None
    try:
        yield measure
    except Exception as err:
        failure = err
        raise
    finally:
        fire(
            request_type=REQUEST_TYPE,
            name=name,
            response_time=(time.perf_counter() - start) * 1000.0,
            response_length=measure.size,
            exception=failure,
            context={},
        )


class _Counts:
    """Counts that add up field by field, and travel as a plain dict (a Locust message)."""

    __dataclass_fields__: ClassVar[dict[str, Any]]

    def add(self, other: Self) -> None:
        for name in self.__dataclass_fields__:
            setattr(self, name, getattr(self, name) + getattr(other, name))

    def as_dict(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Self:
        return cls(**{name: int(data.get(name, 0)) for name in cls.__dataclass_fields__})


@dataclass
class Tally(_Counts):
    """One process's counts; summed over the workers by the master. Plain data, so that a
    worker can send it as a Locust message."""

    written: int = 0
    read: int = 0
    taken: int = 0
    duplicated: int = 0
    failed: int = 0
    retries: int = 0
    # The original path's retries, by what the check after the restart found.
    writes_found: int = 0
    writes_again: int = 0
    takes_gone: int = 0
    takes_again: int = 0
    reads_again: int = 0
    # The random mix's calls a kill ended as documented: a transaction that was open (embedded
    # transactions live in memory until they commit), a notify registration it ended.
    interrupted: int = 0


class _Outcome:
    """A campaign's outcome: it passed when nothing in `reasons` says otherwise."""

    def reasons(self) -> list[str]:
        raise NotImplementedError

    @property
    def passed(self) -> bool:
        return not self.reasons()


@dataclass
class Verdict(_Outcome):
    """The campaign's outcome. ``lost``: acknowledged writes never taken and not in the space at
    the end; ``duplicated``: entries obtained twice (by a second take, by the verify_takes read,
    or left in the space after a take had already returned their identity)."""

    written: int
    read: int
    taken: int
    lost: int
    duplicated: int
    retries: int
    left: int
    expected: int | None  # None: a free-running campaign, with no count to reach
    failed: int
    notes: list[str] = field(default_factory=list)

    def line(self) -> str:
        return (
            f"verdict: written={self.written} read={self.read} taken={self.taken} lost={self.lost} "
            f"duplicated={self.duplicated} retries={self.retries} empty={'yes' if self.left == 0 else 'no'}"
        )

    def reasons(self) -> list[str]:
        """Why the campaign failed, one phrase per reason (empty if it passed)."""
        reasons = []
        if self.expected is not None:
            if self.written != self.expected:
                reasons.append(f"{self.written} of {self.expected} entries written")
            if self.read != self.written:
                reasons.append(f"{self.written - self.read} written entries not read")
            if self.taken != self.written:
                reasons.append(f"{self.written - self.taken} written entries not taken")
        if self.lost:
            reasons.append(f"{self.lost} acknowledged entries lost")
        if self.duplicated:
            reasons.append(f"{self.duplicated} entries obtained twice")
        if self.left:
            reasons.append(f"{self.left} entries left in the space")
        if self.failed:
            reasons.append(f"{self.failed} calls failed for good")
        return reasons


@dataclass
class AckTally(_Counts):
    """One process's counts in the at-least-once campaign (loadtest/acks.py); summed by the master."""

    written: int = 0
    poison_written: int = 0
    delayed: int = 0
    delivered: int = 0
    redelivered: int = 0  # deliveries of a job delivered before (count > 1)
    acked: int = 0
    nacked: int = 0
    abandoned: int = 0
    extended: int = 0
    expired: int = 0  # acks, nacks or extends refused: the delivery had ended (a kill, a slow worker)
    dead_seen: int = 0  # nacks answered with the dead-letter space
    failed: int = 0
    retries: int = 0


@dataclass
class AckVerdict(_Outcome):
    """The at-least-once campaign's outcome. ``acked``: jobs acknowledged (each once); ``dead``:
    poison jobs in the dead-letter space with ``max_deliveries`` deliveries; ``lost``: jobs
    acknowledged to their writer that are neither acked, nor in the dead-letter space, nor left;
    ``duplicated_acks``: acks that succeeded for a job already acked."""

    jobs: int
    expected: int
    poison: int
    acked: int
    dead: int
    redelivered: int
    lost: int
    duplicated_acks: int
    failed: int
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def line(self) -> str:
        return (
            f"verdict: jobs={self.jobs} acked={self.acked} dead={self.dead} redelivered={self.redelivered} "
            f"lost={self.lost} duplicated_acks={self.duplicated_acks}"
        )

    def reasons(self) -> list[str]:
        """Why the campaign failed, one phrase per reason (empty if it passed)."""
        reasons = []
        if self.jobs != self.expected:
            reasons.append(f"{self.jobs} of {self.expected} jobs written")
        if self.acked != self.jobs - self.poison:
            reasons.append(f"{self.acked} of {self.jobs - self.poison} good jobs acked")
        if self.dead != self.poison:
            reasons.append(f"{self.dead} of {self.poison} poison jobs dead-lettered with their count")
        if self.lost:
            reasons.append(f"{self.lost} jobs lost")
        if self.duplicated_acks:
            reasons.append(f"{self.duplicated_acks} jobs acked twice")
        if self.failed:
            reasons.append(f"{self.failed} calls failed for good")
        return [*reasons, *self.problems]
