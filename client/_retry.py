"""Retrying calls that fail with UNAVAILABLE: the policy, one call's attempts, and the counter.

Nothing here does I/O or sleeps. Each client's ``_call`` runs a call as::

    attempts = self._attempts(request)
    while True:
        try:
            return call(attempts.request)       # with rpc_errors
        except UnavailableError:
            delay = attempts.backoff()
            if delay is None:
                raise                             # the deadline has passed
            sleep(delay)                          # time.sleep or asyncio.sleep

A retry sends the same request message, so calls that change the space (write, write_many and
the takes) carry a request id, made once per logical call by `new_request_id`: the server answers
a retry of an operation it already did with the first reply instead of doing it twice.
"""

from __future__ import annotations

import math
import os
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, Generic, TypeVar

from google.protobuf.message import Message

from outrig.v1 import space_pb2 as pb

__all__ = ["DEFAULT_RETRY_DEADLINE", "Attempts", "RetryCounter", "RetryPolicy", "new_request_id"]

#: How long, in seconds, a call keeps retrying by default.
DEFAULT_RETRY_DEADLINE: Final = 30.0


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Exponential backoff with full jitter, for `deadline` seconds from a call's first failure.

    The pause before retry ``n`` (from 0) is uniform in ``[0, min(maximum, initial * multiplier**n))``:
    full jitter, so that the clients of a server that restarts do not all come back at once.
    ``deadline=0`` disables retries.
    """

    deadline: float = DEFAULT_RETRY_DEADLINE
    initial: float = 0.05
    multiplier: float = 2.0
    maximum: float = 2.0

    @classmethod
    def with_deadline(cls, deadline: object) -> RetryPolicy:
        """The default policy with ``deadline`` (the ``retry_deadline`` argument), checked."""
        if isinstance(deadline, bool) or not isinstance(deadline, int | float):
            raise TypeError(f"retry_deadline must be a number of seconds, got {type(deadline).__name__}")
        if math.isnan(deadline) or deadline < 0:
            raise ValueError(f"retry_deadline must be >= 0 seconds (0: no retries), got {deadline}")
        return cls(deadline=float(deadline))

    def delay(self, retry: int, jitter: float) -> float:
        """The pause before retry number ``retry`` (from 0), for ``jitter`` drawn from [0, 1)."""
        # min() before the power would overflow: 2.0**1100 is an OverflowError, not inf.
        ceiling = self.initial * self.multiplier ** min(retry, 64)
        return jitter * min(self.maximum, ceiling)


class RetryCounter:
    """How many attempts a connection has retried; shared by its spaces and safe across threads."""

    __slots__ = ("_lock", "_value")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._value = 0

    @property
    def value(self) -> int:
        return self._value

    def add(self) -> None:
        with self._lock:  # += on an attribute is not atomic across threads
            self._value += 1


M = TypeVar("M", bound=Message)


class Attempts(Generic[M]):
    """The attempts of one logical call: the request each sends, and the pause before the next.

    A read or take that waits sends, on a retry, only what remains of the caller's timeout (counted
    from when the call began, so the time spent reconnecting counts too); once none remains, the
    retry asks only for an entry that matches now. A timeout of None stays None.
    """

    __slots__ = (
        "_clock",
        "_counter",
        "_failed_at",
        "_jitter",
        "_match",
        "_policy",
        "_request",
        "_retries",
        "_started",
        "_timeout",
    )

    def __init__(
        self,
        request: M,
        policy: RetryPolicy,
        counter: RetryCounter,
        *,
        clock: Callable[[], float] = time.monotonic,
        jitter: Callable[[], float] = random.random,
        started: float | None = None,
    ) -> None:
        self._request = request
        self._policy = policy
        self._counter = counter
        self._clock = clock
        self._jitter = jitter
        self._started = clock() if started is None else started  # given: made at a first failure
        self._failed_at: float | None = None
        self._retries = 0
        # Only a read or take that waits has a timeout to shorten on a retry.
        self._match: pb.MatchRequest | None = request if isinstance(request, pb.MatchRequest) else None
        self._timeout = (
            self._match.timeout if self._match is not None and self._match.HasField("timeout") else None
        )

    @property
    def request(self) -> M:
        """The request for the next attempt."""
        if self._retries and self._match is not None and self._timeout is not None:
            self._match.timeout = max(0.0, self._timeout - (self._clock() - self._started))
        return self._request

    def backoff(self) -> float | None:
        """After an UNAVAILABLE: the seconds to wait before retrying, or None when out of time.

        The deadline counts from the first failure, not from the start of the call, so that a
        take that blocked for an hour before the server restarted still gets its retries. A read
        or take with a timeout pauses no longer than what remains of it, so that the attempt
        that asks for an entry matching now comes when the timeout ends, not up to a backoff later.
        """
        now = self._clock()
        if self._failed_at is None:
            self._failed_at = now
        left = self._policy.deadline - (now - self._failed_at)
        if left <= 0:
            return None
        delay = min(left, self._policy.delay(self._retries, self._jitter()))
        if self._timeout is not None:
            # A take with a timeout tries once more when its timeout runs out, not a backoff later.
            remaining = self._timeout - (now - self._started)
            if remaining > 0:
                delay = min(delay, remaining)
        self._retries += 1
        self._counter.add()
        return delay


def new_request_id() -> str:
    """A fresh idempotency key for one logical call (the server accepts up to 128 characters):
    128 random bits as 32 hex digits, as `uuid.uuid4().hex` gave, which cost five times as much
    (1.4 us against 0.27, twice a write+take pair) for a version field nobody reads."""
    return os.urandom(16).hex()
