"""The random mix: users doing random writes, reads, takes, take_many, transactions and notify with
random templates as fast as they can, while a step shape adds users; then an account of every entry.

Templates are drawn at random: a wildcard of one of the 11 campaign classes (which also matches
its subclasses), an entry this process wrote recently, used as its own template, or a random
range or prefix template (`matcher_template`). Reads and
takes wait at most ``_WAIT`` seconds, so an empty draw is cheap.

At the end the master takes whatever is left and checks the whole history: every acknowledged
write was taken exactly once, by a user or by that final drain (``lost``, ``duplicated``), and
the space is empty afterwards.
"""

from __future__ import annotations

import random
import time
from collections import Counter, deque
from typing import Any

import gevent
from locust import User, constant, task
from locust.env import Environment

import outrig
from outrig import OutrigError
from outrig.loadtest.control import Controller
from outrig.loadtest.entries import (
    ENTRY_CLASSES,
    ROOT_TEMPLATES,
    EntryFactory,
    StressEntry,
    identity_of,
    matcher_template,
)
from outrig.loadtest.link import Link, ReportCollector
from outrig.loadtest.options import MixParams
from outrig.loadtest.report import Tally, Verdict, measured

__all__ = ["MixCoordinator", "MixUser", "MixWorker"]

_WAIT = 0.2
_NOTIFY_SECONDS = 0.5
_LEASE = 3600.0
_RECENT = 256
_REPORT_WAIT = 10.0
_ENDED_BY_KILLS = (outrig.TransactionNotFoundError, outrig.TransactionAbortedError, outrig.LeaseNotFoundError)


class MixWorker:
    """One process's side of the mix: its connection, recent entries, and the account."""

    def __init__(self, environment: Environment, params: MixParams, link: Link) -> None:
        self.params = params
        self._fire = environment.events.request.fire
        self._link = link
        self.factory = EntryFactory()
        self._random = random.Random()
        self.space = outrig.connect(str(environment.host), space=params.space)
        # A partitioned space's transactions name their partition (docs/scaling.md).
        self.partitioned = self.space.locate().partitions > 1
        self.tally = Tally()
        self.events = 0
        self._recent: deque[StressEntry] = deque(maxlen=_RECENT)
        self._written: list[int] = []
        self._taken: list[tuple[str, int]] = []
        self.stopping = False
        self.in_flight = 0

    def run(self, operation: Any) -> None:
        """Run one operation, unless the mix is stopping (then pause instead)."""
        if self.stopping:
            gevent.sleep(0.1)
            return
        self.in_flight += 1
        try:
            operation()
        except _ENDED_BY_KILLS:
            # What a kill ends (docs/loadtest.md): counted, not failed, when the mix kills.
            if self.params.mix_kills:
                self.tally.interrupted += 1
            else:
                self.tally.failed += 1
        except OutrigError:
            self.tally.failed += 1
        finally:
            self.in_flight -= 1

    def report(self) -> dict[str, Any]:
        """Stop starting operations, let those in flight finish, and account for them all: a
        take cut off by stopping its user could remove an entry nobody records."""
        self.stopping = True
        deadline = time.monotonic() + _REPORT_WAIT
        while self.in_flight and time.monotonic() < deadline:
            gevent.sleep(0.05)
        tally = Tally(**self.tally.as_dict())
        tally.retries = self.space.retries
        return {
            "tally": tally.as_dict(),
            "origin": self.factory.origin,
            "written": self._written,
            "taken": self._taken,
            "events": self.events,
        }

    def close(self) -> None:
        self.space.close()

    def template(self) -> StressEntry:
        draw = random.random()
        if self._recent and draw < 0.4:
            return random.choice(self._recent)
        if draw < 0.7:
            return matcher_template(self._random)
        return random.choice(ENTRY_CLASSES)()

    def _took(self, entries: list[Any]) -> int:
        size = 0
        for entry in entries:
            self._taken.append(identity_of(entry))
            size += len(outrig.entry_to_bytes(entry))
        self.tally.taken += len(entries)
        return size

    def write(self) -> None:
        entry = self.factory.make()
        with measured(self._fire, "write") as measure:
            measure.size = len(outrig.entry_to_bytes(entry))
            self.space.write(entry, lease=_LEASE)
        self.tally.written += 1
        self._written.append(identity_of(entry)[1])
        self._recent.append(entry)

    def read(self) -> None:
        """read_nowait or a read that waits up to ``_WAIT``, half the time each."""
        wait = random.random() < 0.5
        with measured(self._fire, "read" if wait else "read_nowait") as measure:
            template = self.template()
            got = self.space.read(template, timeout=_WAIT) if wait else self.space.read_nowait(template)
            measure.size = len(outrig.entry_to_bytes(got)) if got is not None else 0
        if got is not None:
            self.tally.read += 1

    def take(self) -> None:
        """take_nowait or a take that waits up to ``_WAIT``, half the time each."""
        wait = random.random() < 0.5
        with measured(self._fire, "take" if wait else "take_nowait") as measure:
            template = self.template()
            got = self.space.take(template, timeout=_WAIT) if wait else self.space.take_nowait(template)
            measure.size = self._took([got] if got is not None else [])

    def take_many(self) -> None:
        with measured(self._fire, "take_many") as measure:
            got = self.space.take_many(self.template(), max_entries=10, timeout=_WAIT)
            measure.size = self._took(got)

    def transaction(self) -> None:
        """Under a transaction: take_nowait with a random template and write one or two entries,
        then commit (four times in five) or abort. Only a commit counts its takes and writes."""
        entries = [self.factory.make() for _ in range(random.randint(1, 2))]
        template = self.template()
        route = None
        if self.partitioned:
            # A transaction works in one partition (docs/scaling.md): the partition of its one
            # entry's serial, with a template that names no serial.
            entries, template = entries[:1], random.choice(ENTRY_CLASSES)()
            route = identity_of(entries[0])[1]
        with measured(self._fire, "transaction") as measure:
            txn = self.space.transaction(lease=10.0, route=route)
            got = txn.take_nowait(template)
            txn.write_many(entries, lease=_LEASE)
            if random.random() < 0.8:
                txn.commit()
                measure.size = self._took([got] if got is not None else [])
                self.tally.written += len(entries)
                self._written.extend(identity_of(entry)[1] for entry in entries)
                self._recent.extend(entries)
            else:
                txn.abort()

    def notify(self) -> None:
        """Register for a random template (the request timed is the registration), count the
        events of half a second, and end the registration."""
        with measured(self._fire, "notify"):
            notification = self.space.notify(self.template(), lease=10.0)
            notification.__enter__()
        try:
            with gevent.Timeout(_NOTIFY_SECONDS, False):
                for _event in notification:
                    self.events += 1
        finally:
            notification.close()


class MixUser(User):
    """A user of the random mix: weighted random operations, no pause between them."""

    wait_time = constant(0)

    def on_start(self) -> None:
        self._side = mix_worker()

    def _run(self, operation: Any) -> None:
        self._side.run(operation)

    @task(4)
    def write(self) -> None:
        self._run(self._side.write)

    @task(3)
    def read(self) -> None:
        self._run(self._side.read)

    @task(3)
    def take(self) -> None:
        self._run(self._side.take)

    @task(1)
    def take_many(self) -> None:
        self._run(self._side.take_many)

    @task(1)
    def transaction(self) -> None:
        self._run(self._side.transaction)

    @task(1)
    def notify(self) -> None:
        self._run(self._side.notify)


_worker: MixWorker | None = None


def set_mix_worker(worker: MixWorker | None) -> None:
    global _worker
    _worker = worker


def mix_worker() -> MixWorker:
    if _worker is None:
        raise RuntimeError("the random mix has not started in this process")
    return _worker


class MixCoordinator(ReportCollector):
    """The master's side of the mix: the step shape's clock, and the final account."""

    def __init__(
        self, params: MixParams, link: Link, host: str, controller: Controller | None = None
    ) -> None:
        self.params = params
        self.host = host
        self._link = link
        self._reports: dict[str, dict[str, Any]] = {}
        self.verdict: Verdict | None = None
        self.started = time.monotonic()
        self._asked_at: float | None = None
        self._controller = controller
        self._kills_due = params.kill_times()
        self._killing: Any = None  # the greenlet of a kill and restart in progress
        self.kills: list[str] = []

    def maybe_kill(self, elapsed: float) -> None:
        """Kill the server (one worker) and bring it back, once each kill's time has come."""
        if not self._kills_due or elapsed < self._kills_due[0] or self._controller is None:
            return
        if self._killing is not None and not self._killing.ready():
            return
        self._kills_due.pop(0)
        self._killing = gevent.spawn(self._kill_and_restart, len(self.kills) + 1, elapsed)

    def _kill_and_restart(self, number: int, elapsed: float) -> None:
        assert self._controller is not None
        began = time.monotonic()
        try:
            self._controller.kill()
            self._controller.restart()
        except Exception as err:  # the account says so; the verdict fails on it
            self.kills.append(f"kill {number}: at {elapsed:.1f} s failed: {err}")
            return
        self.kills.append(
            f"kill {number}: SIGKILL at {elapsed:.1f} s; serving again {time.monotonic() - began:.1f} s later"
        )

    @property
    def finished(self) -> bool:
        return self.verdict is not None

    def conclude(self) -> Verdict:
        """Take what is left, then account for every acknowledged write."""
        if self.verdict is not None:
            return self.verdict
        tally = Tally()
        events = 0
        written: set[tuple[str, int]] = set()
        taken: Counter[tuple[str, int]] = Counter()
        for report in self._reports.values():
            tally.add(Tally.from_dict(report["tally"]))
            events += int(report.get("events", 0))
            written.update((report["origin"], serial) for serial in report["written"])
            taken.update((origin, serial) for origin, serial in report["taken"])
        notes = []
        drained = 0
        left = 0
        try:
            with outrig.connect(self.host, space=self.params.space, retry_deadline=30.0) as space:
                while batch := space.take_many(list(ROOT_TEMPLATES), max_entries=1000, timeout=0):
                    drained += len(batch)
                    taken.update(identity_of(entry) for entry in batch)
                left = space.count(list(ROOT_TEMPLATES))
        except OutrigError as err:
            notes.append(f"could not drain the space at the end: {err}")
            tally.failed += 1
        lost = len(written - set(taken))
        unaccounted = len(set(taken) - written)
        if unaccounted:
            notes.append(f"{unaccounted} entries taken were never acknowledged to their writer")
        if self._killing is not None:
            self._killing.join(timeout=120)
        notes.extend(self.kills)
        if tally.interrupted:
            notes.append(f"kills ended {tally.interrupted} open transactions or notify registrations")
        if len(self.kills) < self.params.mix_kills or any("failed" in kill for kill in self.kills):
            tally.failed += 1
        notes.append(f"notify: {events} events received; final drain took {drained} entries")
        notes.append(f"retry path: sdk (the SDK retried {tally.retries} attempts)")
        self.verdict = Verdict(
            written=tally.written,
            read=tally.read,
            taken=tally.taken,
            lost=lost,
            duplicated=sum(count - 1 for count in taken.values() if count > 1),
            retries=tally.retries,
            left=left,
            expected=None,
            failed=tally.failed,
            notes=notes,
        )
        return self.verdict
