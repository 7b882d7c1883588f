"""Transactions on a durable server that is SIGKILLed: a committed transaction's effects survive
together, an uncommitted one leaves no trace, and a crash in the middle of commits splits none.

A real `outrig serve --data-dir` is killed and restarted on the same directory and port, with
the blocking SDK retrying UNAVAILABLE as usual.
"""

from __future__ import annotations

import random
import signal
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import outrig

from ..conftest import ServerProcess

SEED = 20261130
SPACE = "txn-crash"
OUTPUTS = 5  # entries each transaction writes


@dataclass
class Input(outrig.Entry, type_name="txncrash.Input"):
    tag: str | None = None


@dataclass
class Output(outrig.Entry, type_name="txncrash.Output"):
    tag: str | None = None
    n: int | None = None


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_committed_effects_survive_together_and_uncommitted_ones_leave_no_trace(
    server_factory: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    args = ("--data-dir", str(tmp_path / "data"))
    server = server_factory(*args)
    with outrig.connect(server.address, space=SPACE, retry_deadline=0) as space:
        space.write_many([Input(tag="committed"), Input(tag="open")], lease=outrig.FOREVER)
        with space.transaction() as txn:
            assert txn.take(Input(tag="committed")) is not None
            txn.write_many([Output(tag="committed", n=n) for n in range(OUTPUTS)], lease=outrig.FOREVER)
        open_txn = space.transaction(lease=600.0)
        assert open_txn.take(Input(tag="open")) is not None
        open_txn.write(Output(tag="open", n=0), lease=outrig.FOREVER)
    server.stop(signal.SIGKILL)
    server = server_factory(*args)
    with outrig.connect(server.address, space=SPACE, retry_deadline=0) as space:
        # Read back as Any: to the type checker an entry's fields are optional, and these are set.
        inputs: list[Any] = list(space.contents(Input()))
        assert sorted(e.tag for e in inputs) == ["open"]  # the open take is undone
        outputs: list[Any] = list(space.contents(Output()))
        assert sorted((e.tag, e.n) for e in outputs) == [("committed", n) for n in range(OUTPUTS)]
        with space.transaction() as txn:  # and the space works on, ids not reused
            txn.write(Output(tag="after", n=0), lease=outrig.FOREVER)
        assert space.count(Output(tag="after")) == 1


@dataclass
class Outcomes:
    committed: set[str]  # the commit call returned
    attempted: set[str]  # a transaction for this tag began (its fate may be unknown)
    errors: list[str]


def _committer(address: str, number: int, stop: threading.Event, outcomes: Outcomes) -> None:
    with outrig.connect(address, space=SPACE, retry_deadline=20.0) as space:
        sequence = 0
        while not stop.is_set():
            tag = f"c{number}-{sequence}"
            sequence += 1
            try:
                space.write(Input(tag=tag), lease=outrig.FOREVER)
                outcomes.attempted.add(tag)
                txn = space.transaction(lease=60.0)
                if txn.take(Input(tag=tag), timeout=5.0) is None:
                    outcomes.errors.append(f"{tag}: its own input was not there")
                    continue
                txn.write_many([Output(tag=tag, n=n) for n in range(OUTPUTS)], lease=outrig.FOREVER)
                txn.commit()
                outcomes.committed.add(tag)
            except (outrig.NotFoundError, outrig.FailedPreconditionError, outrig.UnavailableError):
                continue  # the transaction died with the server: its fate is checked below


def test_a_crash_during_commits_splits_no_transaction(
    server_factory: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    address = f"127.0.0.1:{_free_port()}"
    args = ("--listen", address, "--data-dir", str(tmp_path / "data"))
    server = server_factory(*args)
    stop = threading.Event()
    outcomes = Outcomes(set(), set(), [])
    threads = [threading.Thread(target=_committer, args=(address, n, stop, outcomes)) for n in range(3)]
    for thread in threads:
        thread.start()
    rng = random.Random(SEED)
    try:
        for _ in range(4):
            time.sleep(rng.uniform(0.3, 1.2))
            server.stop(signal.SIGKILL)
            server = server_factory(*args)
        time.sleep(0.5)
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=60)
    assert not any(thread.is_alive() for thread in threads)
    assert not outcomes.errors, outcomes.errors
    server.stop(signal.SIGKILL)
    server = server_factory(*args)
    with outrig.connect(server.address, space=SPACE, retry_deadline=0) as space:
        inputs = {cast(Input, e).tag for e in space.contents(Input())}
        outputs: dict[str | None, int] = {}
        for entry in space.contents(Output()):
            tag = cast(Output, entry).tag
            outputs[tag] = outputs.get(tag, 0) + 1
    assert len(outcomes.committed) >= 20, f"too few commits to mean anything: {len(outcomes.committed)}"
    print(
        f"transaction crash harness: {len(outcomes.committed)} commits acknowledged, "
        f"{len(outcomes.attempted)} begun, {len(outputs)} committed in the store"
    )
    for tag in outcomes.attempted:
        done = outputs.get(tag, 0)
        assert done in (0, OUTPUTS), f"transaction {tag} is split: {done} of {OUTPUTS} outputs"
        assert (tag in inputs) == (done == 0), f"transaction {tag}: input and outputs disagree"
        if tag in outcomes.committed:
            assert done == OUTPUTS, f"transaction {tag} was acknowledged as committed but is not in the store"
