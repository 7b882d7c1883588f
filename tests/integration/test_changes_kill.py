"""A durable server SIGKILLed during a burst of writes, restarted on its data dir and port: a
change stream read through the SDK resumes by itself from its last cursor and sees every write
exactly once, in order.

A real `outrig serve --data-dir` (a process, so that SIGKILL is a real crash) on a fixed port;
one writer thread writes numbered entries one call at a time (the SDK retries UNAVAILABLE with
the same request id, so each acts once), a subscriber thread reads the space's changes, and the
test kills the server twice while both run. Under `durability = always` a stream shows a change
only once its batch is durable, so whatever the subscriber saw before a kill is still in the log
after it: the resume from its cursor neither misses nor repeats anything.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import outrig

from ..conftest import ServerProcess, free_port
from ..polling import wait_until

WRITES = 1_500
KILLS = 2
RETRY_DEADLINE = 30.0  # far longer than a restart here


@dataclass
class Burst(outrig.Entry, type_name="kill.Burst"):
    n: int | None = None


def test_a_change_stream_sees_every_write_once_in_order_across_sigkills(
    server_factory: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    address = f"127.0.0.1:{free_port()}"

    def start() -> ServerProcess:
        return server_factory("--listen", address, "--data-dir", str(tmp_path / "data"))

    running = [start()]
    with (
        outrig.connect(address, space="burst", retry_deadline=RETRY_DEADLINE) as space,
        space.changes() as stream,
    ):
        head = stream.cursor
    acknowledged: list[int] = []
    seen: list[int] = []
    failures: list[BaseException] = []

    def write() -> None:
        try:
            with outrig.connect(address, space="burst", retry_deadline=RETRY_DEADLINE) as writer:
                for n in range(WRITES + 1):  # the last one (WRITES) ends the reading
                    writer.write(Burst(n=n), lease=3600)
                    acknowledged.append(n)
        except BaseException as err:
            failures.append(err)

    def read() -> None:
        try:
            with (
                outrig.connect(address, space="burst", retry_deadline=RETRY_DEADLINE) as reader,
                reader.changes(Burst(), since=head, kinds=["write"]) as changes,
            ):
                for change in changes:
                    seen.append(change.entry.n)  # type: ignore[union-attr]
                    if change.entry.n == WRITES:  # type: ignore[union-attr]
                        return
        except BaseException as err:
            failures.append(err)

    threads = [threading.Thread(target=write), threading.Thread(target=read)]
    for thread in threads:
        thread.start()
    for kill in range(KILLS):
        at = (kill + 1) * WRITES // (KILLS + 1)
        wait_until(lambda: len(acknowledged) >= at or bool(failures), timeout=120, what=f"{at} writes")  # noqa: B023
        running[0].stop(signal.SIGKILL)
        running[0] = start()
    for thread in threads:
        thread.join(timeout=300)
    assert not failures, failures
    assert acknowledged == list(range(WRITES + 1))
    assert seen == list(range(WRITES + 1))  # none lost, none twice, in order, across the kills
    assert running[0].stop() == 0
