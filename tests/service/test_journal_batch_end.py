"""The embedded journal's batch end (store/journal.py, `Journal.when_done`): the callbacks a batch's
end runs are called in the callback that resolves the batch, in the order given, before any of
its callers resumes; one that raises is logged and the others still run; a failed batch's future
holds its error, retrieved (nobody need await it); a future that is no open or written batch's
gets an ordinary done callback."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from outrig.service import software_version
from outrig.service.backends.embedded.store.journal import Journal
from outrig.service.backends.embedded.store.schema import database_path, open_store
from outrig.service.exceptions import StoreUnavailableError
from outrig.service.protocol import codec

from .test_embedded_changes import _refuse_writes


def _journal(data_dir: Path) -> Journal:
    connection = open_store(data_dir, software_version())
    journal = Journal(database_path(data_dir), connection, codec.entry_bytes, probe_interval=3600.0)
    journal.start(asyncio.get_running_loop())
    return journal


def _put(space: str, entry_id: int) -> tuple[object, ...]:
    return ("put", space, entry_id, 0.0, None, b"payload")


async def test_a_batch_s_callbacks_run_in_order_before_its_callers_resume(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    journal = _journal(tmp_path)
    seen: list[str] = []
    try:
        future, first = journal.submit([_put("s", 1)])
        _, second = journal.submit([_put("s", 2)])
        assert first is not None and second is not None

        def failing(done: asyncio.Future[None]) -> None:
            seen.append("failing")
            raise RuntimeError("a bug in a callback")

        journal.when_done(future, lambda done: seen.append(f"one {done.result()}"))
        journal.when_done(future, failing)
        journal.when_done(future, lambda done: seen.append("two"))

        async def caller(name: str, waiter: asyncio.Future[None]) -> None:
            await waiter
            seen.append(name)

        with caplog.at_level(logging.ERROR, logger="outrig.service.backends.embedded.store"):
            await asyncio.gather(caller("first caller", first), caller("second caller", second))
        assert seen == ["one None", "failing", "two", "first caller", "second caller"]
        assert "a callback of a batch's end failed" in caplog.text
    finally:
        await journal.close()


async def test_a_failed_batch_s_callbacks_see_its_error_and_its_future_is_retrieved(tmp_path: Path) -> None:
    journal = _journal(tmp_path)
    try:
        _refuse_writes(database_path(tmp_path))
        future, waiter = journal.submit([_put("s", 1)])
        errors: list[BaseException | None] = []
        journal.when_done(future, lambda done: errors.append(done.exception()))
        assert waiter is not None
        with pytest.raises(StoreUnavailableError):
            await waiter
        assert len(errors) == 1 and isinstance(errors[0], StoreUnavailableError)
        assert not future._log_traceback  # nothing logged at its collection
    finally:
        await journal.close()


async def test_a_callback_for_a_batch_already_done_runs_as_a_done_callback(tmp_path: Path) -> None:
    journal = _journal(tmp_path)
    try:
        future, waiter = journal.submit([_put("s", 1)])
        assert waiter is not None
        await waiter
        assert future.done()
        called = asyncio.Event()
        journal.when_done(future, lambda done: called.set())
        assert not called.is_set()  # not called at once: on the loop's next iteration
        await called.wait()
    finally:
        await journal.close()
