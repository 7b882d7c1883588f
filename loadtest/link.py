"""Messages between the campaign's workers and its master, the same in one process or many.

Under Locust's distributed mode the users run on workers while the master decides when to kill
the server and when the campaign is over, so the two talk through Locust's custom messages. In a
single process (LocalRunner) the same messages are plain calls.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Literal

from locust.env import Environment
from locust.runners import MasterRunner, WorkerRunner

__all__ = ["LOCAL", "Link", "ReportCollector", "Role"]

Role = Literal["local", "master", "worker"]
#: The sender id of messages within one process.
LOCAL = "local"

MasterHandler = Callable[[Any, str], None]
WorkerHandler = Callable[[Any], None]


class Link:
    """Sends a campaign's messages to the master or to every worker."""

    def __init__(self, environment: Environment) -> None:
        self._runner = environment.runner
        if isinstance(self._runner, MasterRunner):
            self.role: Role = "master"
        elif isinstance(self._runner, WorkerRunner):
            self.role = "worker"
        else:
            self.role = "local"
        self._master: dict[str, MasterHandler] = {}
        self._workers: dict[str, WorkerHandler] = {}

    @property
    def runs_users(self) -> bool:
        return self.role != "master"

    @property
    def decides(self) -> bool:
        """Whether this process kills the server and ends the campaign."""
        return self.role != "worker"

    def on_master(self, kind: str, handler: MasterHandler) -> None:
        """Call ``handler(data, sender)`` on the master for each ``kind`` message."""
        if self.role == "master":
            assert self._runner is not None
            self._runner.register_message(kind, lambda environment, msg, **kw: handler(msg.data, msg.node_id))
        self._master[kind] = handler

    def on_worker(self, kind: str, handler: WorkerHandler) -> None:
        """Call ``handler(data)`` on every worker for each ``kind`` message."""
        if self.role == "worker":
            assert self._runner is not None
            self._runner.register_message(kind, lambda environment, msg, **kw: handler(msg.data))
        self._workers[kind] = handler

    def to_master(self, kind: str, data: Any) -> None:
        if self.role == "worker":
            assert self._runner is not None
            self._runner.send_message(kind, data)
        elif self.role == "local":
            self._master[kind](data, LOCAL)

    def to_worker(self, worker: str, kind: str, data: Any) -> None:
        """Send to one worker, named by the sender id its messages carried."""
        if self.role == "master":
            assert self._runner is not None
            self._runner.send_message(kind, data, client_id=worker)
        elif self.role == "local":
            self._workers[kind](data)

    def to_workers(self, kind: str, data: Any) -> None:
        if self.role == "master":
            assert self._runner is not None
            self._runner.send_message(kind, data)
        elif self.role == "local":
            self._workers[kind](data)


class ReportCollector:
    """The master's side of the end of a campaign that runs until the master stops it: ask every
    worker once for its account (``outrig-report-request``), and collect the accounts. A
    coordinator that uses it sets ``_link``, ``_reports`` ({}) and ``_asked_at`` (None)."""

    #: How long the master waits for the accounts before it concludes without the missing ones.
    REPORT_WAIT = 10.0

    _link: Link
    _reports: dict[str, dict[str, Any]]
    _asked_at: float | None

    def on_report(self, data: dict[str, Any], sender: str) -> None:
        self._reports[sender] = data

    def ask_for_reports(self) -> None:
        if self._asked_at is None:
            self._asked_at = time.monotonic()
            self._link.to_workers("outrig-report-request", {})

    def ready(self, workers: int) -> bool:
        """Whether every worker's account is in (or waiting longer is pointless)."""
        if self._asked_at is None:
            return False
        return len(self._reports) >= workers or time.monotonic() - self._asked_at > self.REPORT_WAIT
