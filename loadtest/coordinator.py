"""The master's side of StressTestWithShutdown: the shared list, when to kill, when readers go,
when it is over, and the verdict.

The master (or the single process of a local run) sums the workers' progress and holds the shared
list: each worker sends the entries its writers got acknowledged, and the master hands them out
to the workers that run readers, in proportion to their readers. Without
``--interleave`` the readers wait until every write is acknowledged and, if there is a kill, until
the server is back from it; with it they start at once and the kill comes after half the writes.
Each kill is a SIGKILL of the server, ``restart_wait`` seconds of nothing, and a restart on the same
data. When every reader is done the master asks each worker for its account, lists what is left
in the space, and works out the verdict.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from typing import Any

import gevent

import outrig
from outrig.loadtest.control import ControlError, Controller
from outrig.loadtest.entries import ROOT_TEMPLATES, identity_of
from outrig.loadtest.link import Link
from outrig.loadtest.options import StressParams
from outrig.loadtest.report import Tally, Verdict

__all__ = ["StressCoordinator"]

log = logging.getLogger("outrig.loadtest")

# How long the master waits for the workers' accounts when the campaign is cut short.
_REPORT_WAIT = 10.0


class StressCoordinator:
    """Decides the campaign's phases from the workers' progress, and reaches the verdict."""

    def __init__(self, params: StressParams, link: Link, host: str, controller: Controller | None) -> None:
        self.params = params
        self.host = host
        self._link = link
        self._controller = controller
        self._progress: dict[str, dict[str, int]] = {}
        self._pending: list[bytes] = []  # acknowledged entries not yet handed to a reader's worker
        self._handed: dict[str, int] = {}  # worker -> entries handed to it
        self._kill_writes = params.kill_after_writes()
        self._kill_takes = params.kill_after_takes()
        self.kills = 0
        self.restarts = 0
        self._killing: gevent.Greenlet | None = None
        self.writes_complete = False
        self.readers_go = params.interleave
        self._reports: dict[str, dict[str, Any]] = {}
        self._asked = False
        self.notes: list[str] = []
        self.aborted: str | None = None
        self.verdict: Verdict | None = None
        self.started = time.monotonic()

    # -- messages from the workers -----------------------------------------------------------

    def on_progress(self, data: dict[str, Any], sender: str) -> None:
        self._pending.extend(data.pop("entries", ()))
        self._progress[sender] = data
        self._hand_out()
        self.advance()

    def _hand_out(self) -> None:
        """Give each pending entry to the worker with the fewest entries per reader so far."""
        readers = {sender: p.get("readers_started", 0) for sender, p in self._progress.items()}
        readers = {sender: count for sender, count in readers.items() if count > 0}
        if not readers or not self._pending:
            return
        batches: dict[str, list[bytes]] = {sender: [] for sender in readers}
        for entry in self._pending:
            sender = min(readers, key=lambda s: self._handed.get(s, 0) / readers[s])
            batches[sender].append(entry)
            self._handed[sender] = self._handed.get(sender, 0) + 1
        self._pending = []
        for sender, batch in batches.items():
            if batch:
                self._link.to_worker(sender, "outrig-entries", batch)

    def on_report(self, data: dict[str, Any], sender: str) -> None:
        self._reports[sender] = data
        if self._asked and len(self._reports) >= len(self._progress):
            self._conclude()

    # -- phases ------------------------------------------------------------------------------

    def totals(self) -> dict[str, int]:
        sums = {"written": 0, "taken": 0, "writers_finished": 0, "readers_started": 0, "readers_finished": 0}
        for progress in self._progress.values():
            for name in sums:
                sums[name] += progress.get(name, 0)
        return sums

    @property
    def finished(self) -> bool:
        return self.verdict is not None

    def advance(self) -> None:
        """Move to the next phase if the progress allows: start a kill, let readers go, end."""
        if self.finished or self._asked:
            return
        totals = self.totals()
        if (
            not self.writes_complete
            and totals["writers_finished"] >= self.params.num_writers
            and not self._pending  # a reader that sees the writes complete must have its entries
        ):
            self.writes_complete = True
            log.info("all %d writes acknowledged", totals["written"])
            self._broadcast()
        if self._killing is not None:
            return
        if self.aborted is None and self._kill_due(totals):
            self._killing = gevent.spawn(self._kill_and_restart, totals)
            return
        if not self.readers_go and self.writes_complete and (self.kills > 0 or not self._kill_takes):
            self.readers_go = True
            self._broadcast()
        if (self.readers_go and totals["readers_finished"] >= self.params.num_readers) or self.aborted:
            self.ask_for_reports()

    def _kill_due(self, totals: dict[str, int]) -> bool:
        if self.kills < len(self._kill_writes):
            return totals["written"] >= self._kill_writes[self.kills]
        if self.kills < len(self._kill_takes) and self.writes_complete:
            return totals["taken"] >= self._kill_takes[self.kills]
        return False

    def _kill_and_restart(self, totals: dict[str, int]) -> None:
        number = self.kills + 1
        where = f"after {totals['written']} writes and {totals['taken']} takes"
        try:
            if self._controller is None:
                raise ControlError(
                    "no way to kill the server: use `outrig stress`, or --kill-command and --restart-command"
                )
            self.kills = number
            log.info("kill %d of %d: SIGKILL the server %s", number, self.params.try_shutdown, where)
            killed = time.monotonic()
            self._controller.kill()
            gevent.sleep(self.params.restart_wait)
            self._controller.restart()
            back = time.monotonic() - killed
            self.restarts += 1
            self.notes.append(f"kill {number}: SIGKILL {where}; serving again {back:.1f} s later")
            log.info("kill %d: the server serves again, %.1f s after the kill", number, back)
        except ControlError as err:
            self.aborted = f"kill {number} failed: {err}"
            log.error("%s", self.aborted)
        finally:
            self._killing = None
        self._broadcast()
        self.advance()

    def _broadcast(self) -> None:
        self._link.to_workers(
            "outrig-phase",
            {
                "writes_complete": self.writes_complete,
                "readers_go": self.readers_go,
                "restarts": self.restarts,
            },
        )

    # -- the end -----------------------------------------------------------------------------

    def ask_for_reports(self) -> None:
        if self._asked:
            return
        self._asked = True
        self._link.to_workers("outrig-report-request", {})
        if len(self._reports) >= len(self._progress):
            self._conclude()

    def conclude_now(self) -> Verdict:
        """The verdict, also for a campaign cut short: ask for whatever accounts there are."""
        if self.verdict is None:
            self.ask_for_reports()
            deadline = time.monotonic() + _REPORT_WAIT
            while self.verdict is None and time.monotonic() < deadline:
                gevent.sleep(0.1)
            if self.verdict is None:
                self._conclude()
        assert self.verdict is not None
        return self.verdict

    def _conclude(self) -> None:
        if self.verdict is not None:
            return
        tally = Tally()
        written: set[tuple[str, int]] = set()
        taken: Counter[tuple[str, int]] = Counter()
        for report in self._reports.values():
            tally.add(Tally.from_dict(report["tally"]))
            written.update((report["origin"], serial) for serial in report["written"])
            taken.update((origin, serial) for origin, serial in report["taken"])
        not_taken = written - set(taken)
        # Each entry goes to one reader, so the same identity in two processes' takes is a duplicate.
        tally.duplicated += sum(count - 1 for count in taken.values())
        left: int | None = 0
        duplicated_left = unaccounted = 0
        found: set[tuple[str, int]] = set()
        try:
            with outrig.connect(self.host, space=self.params.space, retry_deadline=30.0) as space:
                for entry in space.contents(list(ROOT_TEMPLATES)):
                    identity = identity_of(entry)
                    left = (left or 0) + 1
                    if identity in taken:
                        duplicated_left += 1  # a second copy of an entry a take already returned
                    elif identity in not_taken:
                        found.add(identity)
                    else:
                        unaccounted += 1  # written, but the write was never acknowledged
        except outrig.OutrigError as err:
            self.notes.append(f"could not list the space at the end: {err}")
            left = None
        lost = len(not_taken) - len(found)
        if unaccounted:
            self.notes.append(f"{unaccounted} entries in the space were never acknowledged to their writer")
        if self.aborted:
            self.notes.append(self.aborted)
        self.verdict = Verdict(
            written=tally.written,
            read=tally.read,
            taken=tally.taken,
            lost=lost,
            duplicated=tally.duplicated + duplicated_left,
            retries=tally.retries,
            left=left or 0,
            expected=self.params.num_entries,
            failed=tally.failed + (1 if self.aborted else 0) + (1 if left is None else 0),
            notes=[*self.notes, self._path_line(tally)],
        )

    def _path_line(self, tally: Tally) -> str:
        if self.params.retry == "sdk":
            return (
                f"retry path: sdk (calls carry request ids; the SDK retried {tally.retries} attempts; "
                "nothing was guessed)"
            )
        return (
            f"retry path: original ({tally.retries} calls retried once after a restart: writes found landed "
            f"{tally.writes_found}, written again {tally.writes_again}; takes found gone and assumed done "
            f"{tally.takes_gone}, taken again {tally.takes_again}; reads again {tally.reads_again})"
        )
