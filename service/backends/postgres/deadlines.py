"""Waiting for PostgreSQL no longer than a deadline, even over a silent link."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


async def within(seconds: float, work: Coroutine[Any, Any, T]) -> T:
    """The result of `work` if it comes within `seconds`, else TimeoutError at once.

    Unlike `asyncio.timeout`, the caller is not held up while the abandoned work winds down: a
    psycopg query that is cancelled sends PostgreSQL a cancel request and waits for it, which over a
    partitioned link takes a timeout of its own (many seconds). The work is cancelled and left to
    finish in the background; whatever it still does, its caller has been told it failed."""
    task = asyncio.ensure_future(work)
    try:
        done, _ = await asyncio.wait({task}, timeout=seconds)
    except asyncio.CancelledError:
        task.cancel()
        task.add_done_callback(_retrieve)
        raise
    if not done:
        task.cancel()
        task.add_done_callback(_retrieve)
        raise TimeoutError(f"PostgreSQL did not answer within {seconds:.1f} s")
    return task.result()


def _retrieve(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()
