"""Crash harness with worker kills: `outrig serve --workers 2 --data-dir` under load, the worker
that serves the space SIGKILLed at random moments and restarted by its supervisor, loses,
duplicates and resurrects nothing.

The clients (tests/durability/load.py: writers, takers and movers, whose transactions take an item
and write its `Moved`) connect to the public port both workers share; the SDK sends the space's
calls to its worker's own port (Locate), and, when that worker is gone, back to the public port,
where the other worker forwards them, until the restarted worker serves again. Then the load
stops, the supervisor is stopped with SIGTERM and started again on the data dir, and what is left
is checked against what the clients were told (load.check).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import outrig

from ..worker_processes import start_workers
from .load import Clients, Item, Moved, check, load_through_kills

SEED = 20261201
KILLS = 3
CLIENTS = Clients(space="crash", seed=SEED, retry_deadline=30.0, movers=2)


def test_worker_sigkilled_under_load_loses_duplicates_and_resurrects_nothing(tmp_path: Path) -> None:
    data_dir = str(tmp_path / "data")
    workers = start_workers(2, "--data-dir", data_dir)
    serving = workers.owner(CLIENTS.space)

    def kill() -> None:
        os.kill(workers.pids[serving], signal.SIGKILL)
        workers.wait_restarted(serving)

    tally, loaded = load_through_kills(lambda: workers.public, CLIENTS, KILLS, kill, pause=1.2)
    assert workers.stop() == 0, "the supervisor did not stop cleanly on SIGTERM"

    left, moved = _after_a_restart(CLIENTS.space, "--data-dir", data_dir)
    check(
        tally, left, "remaining", f"worker crash harness: seed {SEED}, {KILLS} kills in {loaded:.1f} s", moved
    )


def test_single_workers_sigkilled_under_a_partitioned_space_lose_nothing(tmp_path: Path) -> None:
    """The space in 4 partitions by uid over the two workers (two each): writes split over
    partitions (write_many: one atomic write per partition), fan-out takes, movers' transactions
    in a partition each; either worker is SIGKILLed in turn, the other serving on."""
    config = tmp_path / "partitions.toml"
    config.write_text('[spaces.crash]\npartition_by = "uid"\npartitions = 4\n')
    clients = Clients(space="crash", seed=SEED + 1, retry_deadline=30.0, movers=2, routed=True)
    data_dir = str(tmp_path / "data")
    workers = start_workers(2, "--data-dir", data_dir, "--config", str(config))
    kills = 0

    def kill() -> None:
        nonlocal kills
        victim = kills % 2
        kills += 1
        os.kill(workers.pids[victim], signal.SIGKILL)
        workers.wait_restarted(victim)

    tally, loaded = load_through_kills(lambda: workers.public, clients, 4, kill, pause=1.2)
    assert workers.stop() == 0
    left, moved = _after_a_restart(clients.space, "--data-dir", data_dir, "--config", str(config))
    run = f"partitioned worker crash harness: seed {SEED + 1}, 4 kills of either worker in {loaded:.1f} s"
    check(tally, left, "remaining", run, moved)


def _after_a_restart(space_name: str, *flags: str) -> tuple[list[str | None], list[str | None]]:
    """The uids of the items and of the Moved entries a fresh supervisor on the data dir serves."""
    again = start_workers(2, *flags)
    try:
        with outrig.connect(again.public, space=space_name) as space:
            left = [item.uid for item in space.contents(Item()) if isinstance(item, Item)]
            moved = [entry.uid for entry in space.contents(Moved()) if isinstance(entry, Moved)]
    finally:
        assert again.stop() == 0
    return left, moved
