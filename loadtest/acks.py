"""The at-least-once campaign's users and one process's side of it (`outrig stress --profile
at-least-once`; loadtest/acks_coordinator.py is the master's side).

Writers write their share of jobs (a `Job` each; a ``poison_share`` of them poison, a tenth
written with a short delay) and record every acknowledged one. Workers take jobs with an
acknowledgement deadline (``ack=ack_deadline``, ``max_deliveries``) and settle each delivery:

- a poison job is always nacked (the space's backoff), until its ``max_deliveries``-th delivery
  ends and the server moves it to the dead-letter space;
- a good job, while it has more than two deliveries left, is abandoned by an ``abandon_share``
  of its workers (the receipt walks away, as with a killed worker: the deadline returns it) and
  nacked by a ``nack_share`` (at once); otherwise it is "processed" (a pause, sometimes long
  enough to need `Delivery.extend`) and acked. The last two deliveries are always processed, so
  that no good job reaches the dead-letter space by the dice alone (a kill may still cost one).

Every successful ack is recorded with the job's identity, so the master can tell a job acked
twice (which fencing forbids) from one acked once. Calls a kill breaks are retried by the SDK
with their request ids; an ack refused with DeliveryExpiredError (its deadline passed during the
restart) is counted, and the job is delivered again.
"""

from __future__ import annotations

import itertools
import os
import random
import socket
import uuid
from dataclasses import dataclass
from typing import Any, ClassVar

import gevent
from locust import User, constant, task
from locust.env import Environment

import outrig
from outrig import DeliveryExpiredError, OutrigError
from outrig.loadtest.link import Link
from outrig.loadtest.options import AckParams
from outrig.loadtest.report import AckTally, measured
from outrig.loadtest.stress import Writer

__all__ = ["AckWorker", "Job", "JobWorker", "JobWriter"]

_FLUSH_SECONDS = 0.1
_RESTART_GRACE = 120.0
_DELAYED_SHARE = 0.1
_DELAY = 0.5  # seconds a delayed job stays hidden
_LONG_SHARE = 0.05  # processed jobs that take long enough to extend their deadline first
_REPORT_WAIT = 10.0


@dataclass
class Job(outrig.Entry, type_name="outrig.stress.Job"):
    """A job: where it was made and its number there (its identity), whether it always fails,
    and some payload."""

    origin: str | None = None
    serial: int | None = None
    poison: bool | None = None
    payload: str | None = None


class AckWorker:
    """One process's jobs, its workers' calls and the account it sends the master. The process's
    one instance, made at test start (loadtest/campaign.py), is `AckWorker.running()`."""

    _running: ClassVar[AckWorker | None] = None

    @classmethod
    def run(cls, worker: AckWorker | None) -> None:
        cls._running = worker

    @classmethod
    def running(cls) -> AckWorker:
        if cls._running is None:
            raise RuntimeError("the at-least-once campaign has not started in this process")
        return cls._running

    def __init__(self, environment: Environment, params: AckParams, link: Link) -> None:
        self.params = params
        self._fire = environment.events.request.fire
        self._link = link
        # Where this process's jobs come from (host, process, a token) and their numbers there.
        self.origin = f"{socket.gethostname()}/{os.getpid()}/{uuid.uuid4().hex[:8]}"
        self._serials = itertools.count(1)
        self.space = outrig.connect(
            str(environment.host), space=params.space, retry_deadline=params.restart_wait + _RESTART_GRACE
        )
        self.tally = AckTally()
        self._written: list[tuple[int, bool]] = []
        self._acked: list[tuple[str, int]] = []
        self.writers_started = 0
        self.writers_finished = 0
        self.stopping = False
        self.in_flight = 0
        self._sent: dict[str, int] = {}
        self._flusher = gevent.spawn(self._flush_forever)

    # -- progress and the account ------------------------------------------------------------

    def progress(self) -> dict[str, int]:
        return {
            "written": self.tally.written,
            "acked": self.tally.acked,
            "writers_finished": self.writers_finished,
        }

    def flush(self) -> None:
        progress = self.progress()
        if progress != self._sent:
            self._sent = progress
            self._link.to_master("outrig-progress", progress)

    def _flush_forever(self) -> None:
        while True:
            gevent.sleep(_FLUSH_SECONDS)
            self.flush()

    def report(self) -> dict[str, Any]:
        """Stop taking, let the calls in flight finish, and account for every job."""
        self.stopping = True
        waited = 0.0
        while self.in_flight and waited < _REPORT_WAIT:
            gevent.sleep(0.05)
            waited += 0.05
        tally = AckTally(**self.tally.as_dict())
        tally.retries = self.space.retries
        return {
            "tally": tally.as_dict(),
            "origin": self.origin,
            "written": self._written,
            "acked": self._acked,
        }

    def close(self) -> None:
        self._flusher.kill(block=False)
        self.space.close()

    # -- the calls ---------------------------------------------------------------------------

    def write_one(self) -> None:
        serial = next(self._serials)
        poison = random.random() < self.params.poison_share
        job = Job(origin=self.origin, serial=serial, poison=poison, payload="x" * random.randint(16, 256))
        delay = _DELAY if random.random() < _DELAYED_SHARE else None
        with measured(self._fire, "write (delayed)" if delay else "write") as measure:
            measure.size = len(job.payload or "")
            self.space.write(job, lease=self.params.lease, delay=delay)
        self.tally.written += 1
        self.tally.poison_written += poison
        self.tally.delayed += delay is not None
        self._written.append((serial, poison))

    def work_once(self) -> None:
        """Take one job with an acknowledgement deadline and settle it; a take that found
        nothing in ``query_timeout`` seconds does nothing."""
        if self.stopping:
            gevent.sleep(0.1)
            return
        self.in_flight += 1
        try:
            self._work()
        except DeliveryExpiredError:
            self.tally.expired += 1
        except OutrigError:
            self.tally.failed += 1
        finally:
            self.in_flight -= 1

    def _work(self) -> None:
        params = self.params
        with measured(self._fire, "take (ack)") as measure:
            delivery = self.space.take(
                Job(),
                timeout=params.query_timeout,
                ack=params.ack_deadline,
                max_deliveries=params.max_deliveries,
            )
            measure.size = 0 if delivery is None else len(getattr(delivery.entry, "payload", "") or "")
        if delivery is None:
            return
        job: Any = delivery.entry
        self.tally.delivered += 1
        self.tally.redelivered += delivery.deliveries > 1
        if job.poison:
            self._nack(delivery, None)
            return
        if delivery.deliveries < params.max_deliveries - 1:
            draw = random.random()
            if draw < params.abandon_share:
                self.tally.abandoned += 1  # the receipt walks away: the deadline returns the job
                return
            if draw < params.abandon_share + params.nack_share:
                self._nack(delivery, 0.0)
                return
        self._process(delivery, job)

    def _nack(self, delivery: outrig.Delivery, delay: float | None) -> None:
        with measured(self._fire, "nack"):
            returned = delivery.nack(delay=delay)
        self.tally.nacked += 1
        self.tally.dead_seen += bool(returned.dead_letter)

    def _process(self, delivery: outrig.Delivery, job: Any) -> None:
        if random.random() < _LONG_SHARE:
            with measured(self._fire, "extend"):
                delivery.extend(self.params.ack_deadline * 2)
            self.tally.extended += 1
        gevent.sleep(random.random() * 0.005)  # the work
        with measured(self._fire, "ack"):
            delivery.ack()
        self.tally.acked += 1
        self._acked.append((str(job.origin), int(job.serial)))


class JobWriter(Writer):
    """Writes num_entries/num_writers jobs, then stops (the stress campaign's writer, writing
    jobs)."""

    def _campaign(self) -> AckWorker:
        return AckWorker.running()

    def _write_next(self) -> None:
        self._side.write_one()


class JobWorker(User):
    """Takes jobs with an acknowledgement deadline and settles them, until the campaign ends."""

    wait_time = constant(0)
    fixed_count = 1

    def on_start(self) -> None:
        self._side = AckWorker.running()

    @task
    def work_once(self) -> None:
        self._side.work_once()
