"""StressTestWithShutdown's writers and readers, and one process's side of the campaign.

Writers each write their share of random campaign entries (a one-week lease each) and put every
acknowledged one on the shared list. The list is the master's: Locust may place all writers on one
worker and all readers on another, so acknowledged entries go to the master with the progress
counts, and the master hands them out to the processes that run readers. Readers remove a random
entry from their process's part of the list and
use the entry itself as the template: a read must return it, then a take must return it (with
``--use-if-exists``, read_nowait and take_nowait instead of blocking calls with
``--query-timeout``); with ``--verify-takes`` a read_nowait after the take must find nothing.

Retries around the kill take one of two paths:

- ``sdk`` (the default): the SDK retries a call that failed with UNAVAILABLE until the server is
  back, with the same request id, so that the server answers a retried write or take it already
  did with its first reply. Nothing is guessed.
- ``original``: the SDK does not retry, and a call the kill broke is retried exactly once after the
  restart, by the original's rules. A write first checks with read_nowait whether it landed (found:
  counted as written; else written again). A take first reads: still there, it is taken again;
  gone, the pre-crash take is assumed to have succeeded. A failure with no kill to blame, or a
  second failure, is a failure of the campaign.
"""

from __future__ import annotations

import random
from typing import Any

import gevent
import grpc
from gevent.event import Event
from locust import User, constant, task
from locust.env import Environment
from locust.exception import StopUser

import outrig
from outrig import OutrigError, UnavailableError
from outrig.loadtest.entries import EntryFactory, StressEntry, identity_of
from outrig.loadtest.link import Link
from outrig.loadtest.options import StressParams
from outrig.loadtest.report import CheckFailedError, Tally, measured

__all__ = ["Reader", "StressWorker", "Writer"]

_FLUSH_SECONDS = 0.1
# How long a call the kill broke waits for the restart before it counts as a failure.
_RESTART_GRACE = 120.0


class StressWorker:
    """One process's writers' entries, the calls with their retry rules, and the tallies."""

    def __init__(self, environment: Environment, params: StressParams, link: Link) -> None:
        self.params = params
        self.link = link
        self._fire = environment.events.request.fire
        self.factory = EntryFactory()
        retry_deadline = 0.0 if params.retry == "original" else params.restart_wait + _RESTART_GRACE
        # The channel is ours, so that the original path can wait until it has reconnected; its
        # options are `outrig.connect`'s, which reconnect within a second of the restart.
        self._channel = grpc.insecure_channel(str(environment.host), options=outrig.channel_options())
        self.space = outrig.Space(
            self._channel, params.space, owns_channel=True, retry_deadline=retry_deadline
        )
        self.tally = Tally()
        self._pool: list[bytes] = []
        self._pool_changed = Event()
        self._outbox: list[bytes] = []
        self._written: set[int] = set()
        self._taken: set[tuple[str, int]] = set()
        self.writers_started = 0
        self.readers_started = 0
        self.writers_finished = 0
        self.readers_finished = 0
        self.writes_complete = Event()
        self.readers_go = Event()
        if params.interleave:
            self.readers_go.set()
        self.restarts = 0
        self._restarted = Event()
        self._sent: dict[str, int] = {}
        self._flusher = gevent.spawn(self._flush_forever)

    # -- messages from the master ------------------------------------------------------------

    def on_phase(self, phase: dict[str, Any]) -> None:
        if phase.get("writes_complete"):
            self.writes_complete.set()
            self._pool_changed.set()
        if phase.get("readers_go"):
            self.readers_go.set()
        restarts = int(phase.get("restarts", 0))
        if restarts > self.restarts:
            self.restarts = restarts
            self._restarted.set()
            self._restarted = Event()

    def report(self) -> dict[str, Any]:
        """This process's final account, for the master's verdict."""
        self.flush()
        tally = Tally(**self.tally.as_dict())
        if self.params.retry == "sdk":
            tally.retries = self.space.retries
        return {
            "tally": tally.as_dict(),
            "origin": self.factory.origin,
            "written": sorted(self._written),
            "taken": sorted(self._taken),
        }

    def receive(self, entries: list[bytes]) -> None:
        """Entries the master handed to this process's readers."""
        self._pool.extend(entries)
        self._pool_changed.set()

    def close(self) -> None:
        self._flusher.kill(block=False)
        self.space.close()

    # -- progress to the master --------------------------------------------------------------

    def progress(self) -> dict[str, int]:
        return {
            "written": self.tally.written,
            "taken": self.tally.taken,
            "writers_finished": self.writers_finished,
            "readers_started": self.readers_started,
            "readers_finished": self.readers_finished,
        }

    def flush(self) -> None:
        """Send the counts, if they changed, with the entries acknowledged since the last flush."""
        progress = self.progress()
        if progress != self._sent or self._outbox:
            self._sent = progress
            entries, self._outbox = self._outbox, []
            self.link.to_master("outrig-progress", {**progress, "entries": entries})

    def _flush_forever(self) -> None:
        while True:
            gevent.sleep(_FLUSH_SECONDS)
            self.flush()

    # -- the shared list ---------------------------------------------------------------------

    def next_entry(self) -> tuple[StressEntry, int] | None:
        """Remove a random entry from this process's part of the list, waiting for one; None once
        every write is acknowledged and handed out, and the list is empty."""
        while True:
            if self._pool:
                index = random.randrange(len(self._pool))
                self._pool[index], self._pool[-1] = self._pool[-1], self._pool[index]
                encoded = self._pool.pop()
                entry: Any = outrig.entry_from_bytes(encoded)
                return entry, len(encoded)
            if self.writes_complete.is_set():
                return None
            self._pool_changed.clear()
            self._pool_changed.wait(1.0)

    # -- the calls ---------------------------------------------------------------------------

    def write(self, entry: StressEntry) -> None:
        """Write ``entry`` and, once acknowledged, put it on the list."""
        encoded = outrig.entry_to_bytes(entry)
        size = len(encoded)
        epoch = self.restarts
        try:
            with measured(self._fire, "write") as measure:
                measure.size = size
                self.space.write(entry, lease=self.params.lease)
        except UnavailableError as err:
            self._await_restart(epoch, err)
            self.tally.retries += 1
            with measured(self._fire, "write retry: read_nowait") as measure:
                found = self.space.read_nowait(entry)
                measure.size = size if found is not None else 0
            if found is not None:
                self.tally.writes_found += 1
            else:
                with measured(self._fire, "write retry: write") as measure:
                    measure.size = size
                    self.space.write(entry, lease=self.params.lease)
                self.tally.writes_again += 1
        self.tally.written += 1
        self._written.add(identity_of(entry)[1])
        self._outbox.append(encoded)

    def read_then_take(self, entry: StressEntry, size: int) -> None:
        """Read ``entry`` with itself as the template, then take it; verify the take if asked."""
        if self._read(entry, size, "read"):
            self.tally.read += 1
        got = self._take(entry, size)
        if got is None:
            return
        identity = identity_of(got)
        if identity in self._taken:
            self.tally.duplicated += 1
        else:
            self._taken.add(identity)
            self.tally.taken += 1
        if self.params.verify_takes:
            epoch = self.restarts
            try:
                self._verify_gone(entry, size, "verify take: read_nowait")
            except UnavailableError as err:
                self._await_restart(epoch, err)
                self.tally.retries += 1
                self.tally.reads_again += 1
                self._verify_gone(entry, size, "verify take: read_nowait (retry)")

    def _verify_gone(self, entry: StressEntry, size: int, name: str) -> None:
        with measured(self._fire, name) as measure:
            again = self.space.read_nowait(entry)
            if again is not None:
                self.tally.duplicated += 1
                measure.size = size
                raise CheckFailedError(f"entry {identity_of(entry)} is still in the space after its take")

    def _read(self, entry: StressEntry, size: int, name: str) -> bool:
        epoch = self.restarts
        try:
            return self._read_once(entry, size, name)
        except UnavailableError as err:
            self._await_restart(epoch, err)
            self.tally.retries += 1
            self.tally.reads_again += 1
            return self._read_once(entry, size, name + " (retry)")

    def _read_once(self, entry: StressEntry, size: int, name: str) -> bool:
        if self.params.use_if_exists:
            name = name.replace("read", "read_nowait", 1)
        return self._match_once(entry, size, name, take=False) is not None

    def _match_once(self, entry: StressEntry, size: int, name: str, *, take: bool) -> StressEntry | None:
        """One read or take of ``entry`` by itself as the template: the entry, or None (reported
        as a failed request: the entry should have been there)."""
        space, nowait = self.space, self.params.use_if_exists
        try:
            with measured(self._fire, name) as measure:
                if nowait:
                    got: Any = space.take_nowait(entry) if take else space.read_nowait(entry)
                else:
                    call = space.take if take else space.read
                    got = call(entry, timeout=self.params.query_timeout)
                if got is None:
                    verb = "take" if take else "read"
                    raise CheckFailedError(f"could not {verb} existing entry {identity_of(entry)}")
                measure.size = size
        except CheckFailedError:
            return None
        return got  # type: ignore[no-any-return]

    def _take(self, entry: StressEntry, size: int) -> StressEntry | None:
        epoch = self.restarts
        name = "take_nowait" if self.params.use_if_exists else "take"
        try:
            return self._match_once(entry, size, name, take=True)
        except UnavailableError as err:
            self._await_restart(epoch, err)
            self.tally.retries += 1
            with measured(self._fire, "take retry: read_nowait") as measure:
                still = self.space.read_nowait(entry)
                measure.size = size if still is not None else 0
            if still is None:
                self.tally.takes_gone += 1
                return entry  # gone: the take before the kill is assumed to have succeeded
            self.tally.takes_again += 1
            return self._match_once(entry, size, name + " (retry)", take=True)

    def _await_restart(self, epoch: int, err: UnavailableError) -> None:
        """On the original path, wait for the restart that follows the kill which broke a call
        begun at ``epoch``; on the SDK path, or with no kill to blame, ``err`` stands."""
        if self.params.retry != "original" or self.params.try_shutdown == 0:
            raise err
        if self.restarts <= epoch:
            self._restarted.wait(self.params.restart_wait + _RESTART_GRACE)
            if self.restarts <= epoch:
                raise err
        # The server is back, but the channel may still be in its reconnect backoff.
        try:
            grpc.channel_ready_future(self._channel).result(timeout=_RESTART_GRACE)
        except grpc.FutureTimeoutError:
            raise err from None


# The process's campaign side, made at test start (see locustfile.py).
_worker: StressWorker | None = None


def set_worker(worker: StressWorker | None) -> None:
    global _worker
    _worker = worker


def worker() -> StressWorker:
    if _worker is None:
        raise RuntimeError("the stress campaign has not started in this process")
    return _worker


class Writer(User):
    """Writes num_entries/num_writers entries, then stops."""

    wait_time = constant(0)
    fixed_count = 1

    def on_start(self) -> None:
        side = self._campaign()
        self._side = side
        self._left = side.params.share(side.writers_started)
        side.writers_started += 1
        self._finished = False

    def _campaign(self) -> Any:
        """This process's side of the campaign (the at-least-once JobWriter has its own)."""
        return worker()

    def _write_next(self) -> None:
        self._side.write(self._side.factory.make())

    @task
    def write_one(self) -> None:
        if self._left <= 0:
            self._finish()
        self._left -= 1
        try:
            self._write_next()
        except OutrigError:
            self._side.tally.failed += 1

    def _finish(self) -> None:
        if not self._finished:
            self._finished = True
            self._side.writers_finished += 1
            self._side.flush()
        raise StopUser()


class Reader(User):
    """Reads and takes entries from the shared list until the writes are complete and it is empty."""

    wait_time = constant(0)
    fixed_count = 1

    def on_start(self) -> None:
        self._side = worker()
        self._finished = False
        self._side.readers_started += 1
        self._side.flush()
        self._side.readers_go.wait()

    @task
    def read_and_take(self) -> None:
        item = self._side.next_entry()
        if item is None:
            if not self._finished:
                self._finished = True
                self._side.readers_finished += 1
                self._side.flush()
            raise StopUser()
        try:
            self._side.read_then_take(*item)
        except CheckFailedError:
            pass  # counted where it was found, and reported as a failed request
        except OutrigError:
            self._side.tally.failed += 1
