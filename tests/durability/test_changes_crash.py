"""The change log through SIGKILLs under load: after a burst of writes, takes and transactional
moves during which a durable server is killed and restarted at random moments (the crash
harness's load, load.py), the store's log holds exactly the acknowledged changes:

- it is gap-free from 1 to its head, under one epoch;
- every acknowledged write is logged once as a `write`, and no write that was never attempted;
- every take a taker was answered is logged once as a `take`, every committed move as the
  transaction's `take` of its item and `write` of its Moved, under the transaction's id, and
  nothing else is (a take that was not answered, an aborted move, leave no change);
- replaying the log from the empty space gives exactly what the space holds.

The log is read back in process, from the data dir the killed servers left (once the last one
stopped cleanly), through the embedded backend's own recovery.
"""

from __future__ import annotations

import asyncio
import signal
import sqlite3
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from outrig.service.backends.embedded.backend import EmbeddedBackend
from outrig.service.backends.embedded.store.schema import database_path
from outrig.service.config import ServerConfig
from outrig.service.engine.changes import Change

from ..conftest import ServerProcess
from .load import Clients, check, load_through_kills
from .test_crash import _free_port

SEED = 20261201
KILLS = 4
CLIENTS = Clients(space="changes", seed=SEED, retry_deadline=20.0, movers=2)


def _uid(change: Change) -> str:
    uid = change.entry.fields["uid"].data
    assert isinstance(uid, str)
    return uid


async def _read_log(data_dir: Path) -> tuple[list[Change], dict[str, list[str]]]:
    """The space's log as recovery loads it, and what the space holds, by type."""
    backend = EmbeddedBackend(ServerConfig(data_dir=data_dir))
    await backend.start()
    try:
        engine = backend.engine(CLIENTS.space)
        log = engine.changes
        assert log is not None and log.oldest == 1, "retention dropped changes: the test needs them all"
        held: dict[str, list[str]] = {}
        for stored in engine.snapshot():
            uid = stored.fields["uid"].data
            assert isinstance(uid, str)
            held.setdefault(stored.type_name, []).append(uid)
        return log.after(0, log.head), held
    finally:
        await backend.close()
        await backend.shutdown()


def test_after_sigkills_in_a_burst_the_log_holds_exactly_the_acknowledged_changes(
    server_factory: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    address = f"127.0.0.1:{_free_port()}"
    data_dir = tmp_path / "data"

    def start() -> ServerProcess:
        return server_factory("--listen", address, "--data-dir", str(data_dir))

    running = [start()]

    def kill() -> None:
        running[0].stop(signal.SIGKILL)
        running[0] = start()

    tally, loaded = load_through_kills(lambda: address, CLIENTS, KILLS, kill)
    assert running[0].stop() == 0, "the server did not shut down cleanly on SIGTERM"
    changes, held = asyncio.run(_read_log(data_dir))
    left, moved_left = held.get("crash.Item", []), held.get("crash.Moved", [])
    check(
        tally,
        left,
        "remaining",
        f"change log crash: seed {SEED}, {KILLS} kills in {loaded:.1f} s",
        moved_left,
    )

    assert [change.seq for change in changes] == list(range(1, len(changes) + 1)), "the log has a gap"
    with sqlite3.connect(database_path(data_dir)) as db:  # one epoch, kept across every restart
        assert db.execute("SELECT count(*) FROM change_logs").fetchone()[0] == 1
    attempted = {uid for uids in tally.attempted for uid in uids}
    acknowledged = {uid for uids in tally.acknowledged for uid in uids}
    taken = Counter(uid for uids in tally.taken for uid in uids)
    moved = Counter(uid for uids in tally.moved for uid in uids)

    def logged(kind: str, type_name: str, *, transactional: bool) -> Counter[str]:
        return Counter(
            _uid(c)
            for c in changes
            if c.kind == kind and c.entry.type_name == type_name and bool(c.transaction) == transactional
        )

    writes = logged("write", "crash.Item", transactional=False)
    assert max(writes.values()) == 1, "a write was logged twice"
    assert acknowledged <= set(writes) <= attempted
    assert logged("take", "crash.Item", transactional=False) == taken
    assert logged("take", "crash.Item", transactional=True) == moved
    assert logged("write", "crash.Moved", transactional=True) == moved
    assert {c.kind for c in changes} <= {"write", "take"}
    # A move's take and write are one commit: consecutive, under one transaction id.
    by_transaction: dict[int, list[Change]] = {}
    for change in changes:
        if change.transaction:
            by_transaction.setdefault(change.transaction, []).append(change)
    for commit in by_transaction.values():
        assert [c.entry.type_name for c in commit] == ["crash.Moved", "crash.Item"]
        assert commit[1].seq == commit[0].seq + 1 and _uid(commit[0]) == _uid(commit[1])

    state: dict[str, set[str]] = {"crash.Item": set(), "crash.Moved": set()}
    for change in changes:
        uids = state[change.entry.type_name]
        if change.kind == "write":
            assert _uid(change) not in uids
            uids.add(_uid(change))
        else:
            uids.remove(_uid(change))
    assert state == {"crash.Item": set(left), "crash.Moved": set(moved_left)}
