"""The master's side of the at-least-once campaign (loadtest/acks.py): when to kill the server,
when the campaign is over, and the verdict.

The master sums the workers' progress (jobs written, jobs acked). Each kill is a SIGKILL of the
server, ``restart_wait`` seconds of nothing and a restart on the same data, after an even share
of the good jobs has been acked. Once every write is acknowledged and the kills are done, the
master looks into the space each second: when it holds no job any more (`Space.browse` shows
hidden ones too: pending deliveries, delayed and returned jobs), every job has been acked or
dead-lettered, and it asks the workers for their accounts. Then it lists the dead-letter space
(each entry with its delivery count) and works out the verdict:

    verdict: jobs=N acked=A dead=M redelivered=R lost=0 duplicated_acks=0

It passes when every good job was acked exactly once and every poison job is in the dead-letter
space with ``max_deliveries`` deliveries, and nothing is left or lost.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from typing import Any

import gevent

import outrig
from outrig.loadtest.acks import Job
from outrig.loadtest.control import ControlError, Controller
from outrig.loadtest.link import Link, ReportCollector
from outrig.loadtest.options import AckParams
from outrig.loadtest.report import AckTally, AckVerdict

__all__ = ["AckCoordinator"]

log = logging.getLogger("outrig.loadtest")

# The campaign ends without its last jobs if no job was acked for this long (the verdict then
# counts what was left, and fails).
_STALL = 120.0


def _browse_all(space: outrig.Space) -> list[outrig.BrowsedEntry]:
    entries: list[outrig.BrowsedEntry] = []
    after = 0
    while True:
        page = space.browse(Job(), after=after, max_entries=1000)
        entries += page.entries
        if not page.next:
            return entries
        after = page.next


class AckCoordinator(ReportCollector):
    """Decides the kills and the end from the workers' progress, and reaches the verdict."""

    def __init__(self, params: AckParams, link: Link, host: str, controller: Controller | None) -> None:
        self.params = params
        self.host = host
        self._link = link
        self._controller = controller
        self._progress: dict[str, dict[str, int]] = {}
        self._reports: dict[str, dict[str, Any]] = {}
        good = round(params.num_entries * (1 - params.poison_share))
        self._kill_acks = params.kill_after_acks(good)
        self.kills: list[str] = []
        self._killing: gevent.Greenlet | None = None
        self._asked_at: float | None = None
        self._last_change = (time.monotonic(), -1)
        self.verdict: AckVerdict | None = None
        self._space: outrig.Space | None = None

    # -- messages from the workers -----------------------------------------------------------

    def on_progress(self, data: dict[str, Any], sender: str) -> None:
        self._progress[sender] = data
        if self._asked_at is None and not self._kill_busy():
            self._maybe_kill(self.totals())  # at once, not at the shape's next tick

    def totals(self) -> Counter[str]:
        """The workers' progress summed: jobs written and acked, writers finished."""
        return sum((Counter(progress) for progress in self._progress.values()), Counter())

    # -- phases (the shape calls `advance` every second) --------------------------------------

    @property
    def finished(self) -> bool:
        return self.verdict is not None

    def advance(self) -> None:
        if self._asked_at is not None or self.finished:
            return
        totals = self.totals()
        now = time.monotonic()
        if totals["acked"] != self._last_change[1]:
            self._last_change = (now, totals["acked"])
        if self._kill_busy() or self._maybe_kill(totals):
            return
        if totals["writers_finished"] < self.params.num_writers:
            return
        if len(self.kills) < len(self._kill_acks) and now - self._last_change[0] < _STALL:
            return  # a kill is still due
        if now - self._last_change[0] >= _STALL:
            self.kills.append(f"no job acked for {_STALL:.0f} s: the campaign ends without its last jobs")
            self.ask_for_reports()
        elif self._empty():
            self.ask_for_reports()

    def _kill_busy(self) -> bool:
        return self._killing is not None and not self._killing.ready()

    def _maybe_kill(self, totals: Counter[str]) -> bool:
        """Start the next kill if its share of acks is done; whether one started."""
        due = len(self.kills) < len(self._kill_acks) and totals["acked"] >= self._kill_acks[len(self.kills)]
        if due:
            self._killing = gevent.spawn(self._kill_and_restart, len(self.kills) + 1, totals)
        return due

    def _empty(self) -> bool:
        """Whether the space holds no job: neither visible, pending, delayed nor returned."""
        try:
            if self._space is None:
                self._space = outrig.connect(self.host, space=self.params.space, retry_deadline=5.0)
            page = self._space.browse(Job(), max_entries=1)
        except outrig.OutrigError as err:
            log.info("could not look into the space: %s", err)
            return False
        return not page.entries and not page.next

    def _kill_and_restart(self, number: int, totals: Counter[str]) -> None:
        where = f"after {totals['written']} writes and {totals['acked']} acks"
        began = time.monotonic()
        try:
            if self._controller is None:
                raise ControlError("no way to kill the server: use `outrig stress`, or --kill-command")
            log.info("kill %d: SIGKILL the server %s", number, where)
            self._controller.kill()
            gevent.sleep(self.params.restart_wait)
            self._controller.restart()
        except ControlError as err:
            self.kills.append(f"kill {number}: {where} failed: {err}")
            return
        back = time.monotonic() - began
        self.kills.append(f"kill {number}: SIGKILL {where}; serving again {back:.1f} s later")

    # -- the verdict -------------------------------------------------------------------------

    def conclude(self) -> AckVerdict:
        if self.verdict is not None:
            return self.verdict
        if self._killing is not None:
            self._killing.join(timeout=120)
        tally = AckTally()
        poison: dict[tuple[str, int], bool] = {}
        acked: Counter[tuple[str, int]] = Counter()
        for report in self._reports.values():
            tally.add(AckTally.from_dict(report["tally"]))
            poison.update(((report["origin"], serial), bool(bad)) for serial, bad in report["written"])
            acked.update((origin, serial) for origin, serial in report["acked"])
        notes, problems = list(self.kills), []
        dead: dict[tuple[str, int], int] = {}
        left: set[tuple[str, int]] = set()
        try:
            with outrig.connect(self.host, space=self.params.space, retry_deadline=30.0) as space:
                left = {_identity(e.entry) for e in _browse_all(space)}
                for entry in _browse_all(space.with_space(f"{self.params.space}.dead")):
                    dead[_identity(entry.entry)] = entry.deliveries
        except outrig.OutrigError as err:
            problems.append(f"could not list the spaces at the end: {err}")
        good = {job for job, bad in poison.items() if not bad}
        bad_jobs = set(poison) - good
        counted = {job for job in bad_jobs if dead.get(job) == self.params.max_deliveries}
        miscounted = sorted(f"{job}: {dead[job]}" for job in bad_jobs & set(dead) - counted)
        if miscounted:
            problems.append(
                f"poison jobs dead-lettered with another count than {self.params.max_deliveries}:"
            )
            problems.append("  " + ", ".join(miscounted[:5]))
        if good & set(dead):
            problems.append(f"{len(good & set(dead))} good jobs reached the dead-letter space")
        if bad_jobs & set(acked):
            problems.append(f"{len(bad_jobs & set(acked))} poison jobs were acked")
        if left:
            problems.append(f"{len(left)} jobs left in the space")
        unknown = (set(acked) | set(dead) | left) - set(poison)
        if unknown:
            problems.append(f"{len(unknown)} jobs seen that were never acknowledged to their writer")
        if len(self.kills) < self.params.try_shutdown or any("failed" in kill for kill in self.kills):
            problems.append("the server was not killed and restarted as asked")
        notes.append(
            f"deliveries: {tally.delivered} ({tally.redelivered} redelivered), acks {tally.acked}, nacks "
            f"{tally.nacked} ({tally.dead_seen} to the dead-letter space), abandoned {tally.abandoned}, "
            f"extended {tally.extended}, refused as expired {tally.expired}; delayed writes {tally.delayed}; "
            f"the SDK retried {tally.retries} attempts"
        )
        self.verdict = AckVerdict(
            jobs=len(poison),
            expected=self.params.num_entries,
            poison=len(bad_jobs),
            acked=len(good & set(acked)),
            dead=len(counted),
            redelivered=tally.redelivered,
            lost=len(set(poison) - set(acked) - set(dead) - left),
            duplicated_acks=sum(count - 1 for count in acked.values() if count > 1),
            failed=tally.failed,
            problems=problems,
            notes=notes,
        )
        if self._space is not None:
            self._space.close()
        return self.verdict


def _identity(entry: Any) -> tuple[str, int]:
    return (str(entry.origin), int(entry.serial))
