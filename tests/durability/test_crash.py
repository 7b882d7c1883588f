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

import signal
import socket
from collections.abc import Callable
from pathlib import Path

import outrig

from ..conftest import ServerProcess
from .load import Clients, Item, check, load_through_kills

SEED = 20240611
KILLS = 5
RETRY_DEADLINE = 20.0  # long enough to span any restart here by far
CLIENTS = Clients(space="crash", seed=SEED, retry_deadline=RETRY_DEADLINE)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_sigkill_under_load_loses_duplicates_and_resurrects_nothing(
    server_factory: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    address = f"127.0.0.1:{_free_port()}"  # fixed, so the clients' channels reconnect to each restart
    data_dir = tmp_path / "data"

    def start() -> ServerProcess:
        return server_factory("--listen", address, "--data-dir", str(data_dir))

    running = [start()]

    def kill() -> None:
        running[0].stop(signal.SIGKILL)
        running[0] = start()

    tally, loaded = load_through_kills(lambda: address, CLIENTS, KILLS, kill)
    server = running[0]
    assert server.stop() == 0, "the server did not shut down cleanly on SIGTERM"
    server = start()
    with outrig.connect(server.address, space=CLIENTS.space) as space:
        remaining_entries = list(space.contents(Item()))
    remaining = [item.uid for item in remaining_entries if isinstance(item, Item)]
    check(tally, remaining, "remaining", f"crash harness: seed {SEED}, {KILLS} kills in {loaded:.1f} s")


def test_in_memory_restart_loses_everything(
    server_factory: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    """The contrast: `--in-memory` wins over `--data-dir`, keeps nothing, and leaves the dir alone."""
    args = ("--data-dir", str(tmp_path), "--in-memory")
    server = server_factory(*args)
    with outrig.connect(server.address, space=CLIENTS.space, retry_deadline=0) as space:
        space.write_many([Item(uid=str(n)) for n in range(10)], lease=outrig.FOREVER)
        assert space.count(Item()) == 10
    server.stop(signal.SIGKILL)
    server = server_factory(*args)
    with outrig.connect(server.address, space=CLIENTS.space, retry_deadline=0) as space:
        assert space.count(Item()) == 0
    assert list(tmp_path.iterdir()) == []
