"""Crash harness: a durable server SIGKILLed under load loses, duplicates and resurrects nothing.

A real `outrig serve --data-dir` runs on one fixed port. Writer and taker threads, each with its
own connection through the blocking SDK (which retries UNAVAILABLE with request ids), keep
writing and taking while the test kills the server at random moments and restarts it at once on
the same directory and port. Then the load stops, the server restarts once more cleanly, and what
is left in the space is checked against what the clients were told:

- every acknowledged write is either still in the space or was taken (none lost);
- no entry was taken twice, and no taken entry is still in the space (a take is not undone);
- nothing in the space or taken was never written (sanity).

The kill moments come from a seeded random; the load's timing does not, so each run crashes the
server at different points of its calls. Change SEED to explore others.
"""

from __future__ import annotations

import random
import signal
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import outrig

from ..conftest import ServerProcess

SEED = 20240611
KILLS = 5
WRITERS = 3
TAKERS = 3
RETRY_DEADLINE = 20.0  # long enough to span any restart here by far
SPACE = "crash"


@dataclass
class Item(outrig.Entry, type_name="crash.Item"):
    uid: str | None = None
    writer: int | None = None


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class Tally:
    """What the client threads saw; each thread appends only to lists of its own."""

    attempted: list[list[str]] = field(default_factory=list)  # uids sent in a write, acknowledged or not
    acknowledged: list[list[str]] = field(default_factory=list)  # uids whose write call returned
    taken: list[list[str]] = field(default_factory=list)  # uids a take returned
    errors: list[str] = field(default_factory=list)
    retries: list[int] = field(default_factory=list)

    def slot(self, lists: list[list[str]]) -> list[str]:
        own: list[str] = []
        lists.append(own)
        return own


def _writer(address: str, number: int, stop: threading.Event, tally: Tally) -> None:
    rng = random.Random(SEED + number)
    attempted, acknowledged = tally.slot(tally.attempted), tally.slot(tally.acknowledged)
    with outrig.connect(address, space=SPACE, retry_deadline=RETRY_DEADLINE) as space:
        try:
            sequence = 0
            while not stop.is_set():
                # Mostly single writes, some write_many: both carry a request id.
                size = 3 if rng.random() < 0.25 else 1
                uids = [f"w{number}-{sequence + k}" for k in range(size)]
                sequence += size
                items = [Item(uid=uid, writer=number) for uid in uids]
                attempted.extend(uids)
                if size == 1:
                    space.write(items[0], lease=outrig.FOREVER)
                else:
                    space.write_many(items, lease=outrig.FOREVER)
                acknowledged.extend(uids)  # only once the call has returned
        except Exception as err:
            tally.errors.append(f"writer {number}: {err!r}")
        finally:
            tally.retries.append(space.retries)


def _taker(address: str, number: int, stop: threading.Event, tally: Tally) -> None:
    rng = random.Random(SEED + 100 + number)
    taken = tally.slot(tally.taken)
    with outrig.connect(address, space=SPACE, retry_deadline=RETRY_DEADLINE) as space:
        try:
            while not stop.is_set():
                if rng.random() < 0.25:
                    got = space.take_many(Item(), max_entries=3, timeout=0.2)
                else:
                    one = space.take(Item(), timeout=0.2)
                    got = [] if one is None else [one]
                taken.extend(item.uid for item in got if isinstance(item, Item) and item.uid is not None)
        except Exception as err:
            tally.errors.append(f"taker {number}: {err!r}")
        finally:
            tally.retries.append(space.retries)


def test_sigkill_under_load_loses_duplicates_and_resurrects_nothing(
    server_factory: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    address = f"127.0.0.1:{_free_port()}"  # fixed, so the clients' channels reconnect to each restart
    data_dir = tmp_path / "data"

    def start() -> ServerProcess:
        return server_factory("--listen", address, "--data-dir", str(data_dir))

    server = start()
    stop = threading.Event()
    tally = Tally()
    threads = [
        threading.Thread(target=_writer, args=(address, n, stop, tally), name=f"writer-{n}")
        for n in range(WRITERS)
    ] + [
        threading.Thread(target=_taker, args=(address, n, stop, tally), name=f"taker-{n}")
        for n in range(TAKERS)
    ]
    for thread in threads:
        thread.start()
    started = time.monotonic()
    rng = random.Random(SEED)
    try:
        for _ in range(KILLS):
            time.sleep(rng.uniform(0.3, 1.5))
            server.stop(signal.SIGKILL)
            server = start()
        time.sleep(0.5)  # some load on the last incarnation too
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=RETRY_DEADLINE + 10)
    loaded = time.monotonic() - started
    assert not any(thread.is_alive() for thread in threads), "a client thread did not stop"
    assert not tally.errors, f"client calls failed despite retries: {tally.errors}"

    assert server.stop() == 0, "the server did not shut down cleanly on SIGTERM"
    server = start()
    with outrig.connect(server.address, space=SPACE) as space:
        remaining_entries = list(space.contents(Item()))
    remaining = [item.uid for item in remaining_entries if isinstance(item, Item)]

    attempted = {uid for uids in tally.attempted for uid in uids}
    acknowledged = {uid for uids in tally.acknowledged for uid in uids}
    taken_list = [uid for uids in tally.taken for uid in uids]
    taken = set(taken_list)
    left = set(remaining)
    retries = sum(tally.retries)
    print(
        f"crash harness: seed {SEED}, {KILLS} kills in {loaded:.1f} s; written {len(acknowledged)} "
        f"acknowledged ({len(attempted)} attempted), taken {len(taken_list)}, remaining {len(remaining)}, "
        f"retries {retries}"
    )

    assert len(acknowledged) >= 100 and len(taken) >= 100, (
        f"too little load to mean anything: {len(acknowledged)} written, {len(taken)} taken"
    )
    assert retries > 0, "no call was interrupted by the kills, so nothing was tested"
    lost = acknowledged - taken - left
    assert not lost, f"{len(lost)} of {len(acknowledged)} acknowledged writes were lost: {sorted(lost)[:20]}"
    twice = [uid for uid, n in Counter(taken_list).items() if n > 1]
    assert not twice, f"{len(twice)} of {len(taken)} taken entries were returned by two takes: {twice[:20]}"
    doubled = [uid for uid, n in Counter(remaining).items() if n > 1]
    assert not doubled, (
        f"{len(doubled)} of {len(remaining)} remaining entries are stored twice: {doubled[:20]}"
    )
    back = taken & left
    assert not back, f"{len(back)} of {len(taken)} taken entries are back in the space: {sorted(back)[:20]}"
    unknown = (taken | left) - attempted
    assert not unknown, f"{len(unknown)} entries were never written: {sorted(unknown, key=str)[:20]}"


def test_in_memory_restart_loses_everything(
    server_factory: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    """The contrast: `--in-memory` wins over `--data-dir`, keeps nothing, and leaves the dir alone."""
    args = ("--data-dir", str(tmp_path), "--in-memory")
    server = server_factory(*args)
    with outrig.connect(server.address, space=SPACE, retry_deadline=0) as space:
        space.write_many([Item(uid=str(n)) for n in range(10)], lease=outrig.FOREVER)
        assert space.count(Item()) == 10
    server.stop(signal.SIGKILL)
    server = server_factory(*args)
    with outrig.connect(server.address, space=SPACE, retry_deadline=0) as space:
        assert space.count(Item()) == 0
    assert list(tmp_path.iterdir()) == []
