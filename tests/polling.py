"""Waiting for a state instead of sleeping for it.

A test that needs the server to reach a state first (a take parked, a cancel arrived, a lease
reaped) polls for that state. `wait_until` calls a predicate until it returns something true, and
fails the test, saying what it waited for, if that takes longer than the timeout;
`wait_until_async` is its twin for a test on an event loop (the predicate may be async).

The state most tests wait for is "n reads and takes are parked in a space": `wait_for_waiters`
(and `wait_for_waiters_async`; `once_parked` acts from a thread once they are, for a test whose
own thread is the one parked), read from where the server reports it:

- a server process started with a metrics port (`start_server(metrics=True)`; the session's
  `server` is one): the `outrig_waiters` gauge of its /metrics;
- an in-process `outrig.testing.LocalServer`: its backend's figures, read on the server's event
  loop (LocalServer has no public call for them);
- a backend under test (conformance, postgres): its `space_figures()`, as the metrics read them
  (only the async twin: the figures are read on the test's own loop).
"""

from __future__ import annotations

import asyncio
import inspect
import threading
import time
import urllib.request
from collections.abc import Awaitable, Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, overload

if TYPE_CHECKING:
    from outrig.testing import LocalServer

__all__ = [
    "once_parked",
    "scrape",
    "wait_for_waiters",
    "wait_for_waiters_async",
    "wait_until",
    "wait_until_async",
    "waiters",
]

T = TypeVar("T")

INTERVAL = 0.01  # seconds between two looks
TIMEOUT = 10.0  # seconds a state may take to come: a bound, not a wait


class _WithMetrics(Protocol):
    """A server process (tests/conftest.py's ServerProcess): its metrics address, if it serves them."""

    @property
    def metrics(self) -> str | None: ...


def _failure(what: str | Callable[[], str], timeout: float) -> AssertionError:
    said = what() if callable(what) else what
    return AssertionError(f"not within {timeout} s: {said}")


def wait_until(
    predicate: Callable[[], T | None],
    timeout: float = TIMEOUT,
    *,
    what: str | Callable[[], str] = "the predicate",
    interval: float = INTERVAL,
) -> T:
    """The first true value `predicate()` returns, looking every `interval` seconds; an
    AssertionError saying `what` was awaited (a callable: computed then) after `timeout`."""
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        if time.monotonic() >= deadline:
            raise _failure(what, timeout)
        time.sleep(interval)
    return value


@overload
async def wait_until_async(
    predicate: Callable[[], Awaitable[T | None]],
    timeout: float = ...,
    *,
    what: str | Callable[[], str] = ...,
    interval: float = ...,
) -> T: ...
@overload
async def wait_until_async(
    predicate: Callable[[], T | None],
    timeout: float = ...,
    *,
    what: str | Callable[[], str] = ...,
    interval: float = ...,
) -> T: ...
async def wait_until_async(
    predicate: Callable[[], Any],
    timeout: float = TIMEOUT,
    *,
    what: str | Callable[[], str] = "the predicate",
    interval: float = INTERVAL,
) -> Any:
    """`wait_until` on an event loop: the loop runs on between two looks."""
    deadline = time.monotonic() + timeout
    while True:
        value: Any = predicate()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() >= deadline:
            raise _failure(what, timeout)
        await asyncio.sleep(interval)


def scrape(metrics: str) -> dict[str, float]:
    """A server's Prometheus samples now, by their name and labels as written."""
    with urllib.request.urlopen(f"http://{metrics}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            samples[name] = float(value)
    return samples


def _local_figures(server: LocalServer) -> dict[str, Any]:
    running = server._server
    assert running is not None, "the LocalServer is not started"
    figures = running.backend.space_figures()  # not in the SpaceBackend protocol; both backends have it
    return asyncio.run_coroutine_threadsafe(figures, server._loop).result(TIMEOUT)


def waiters(server: str | _WithMetrics | LocalServer, space: str) -> int:
    """How many reads and takes are parked in `space` now (a space the server has not seen: 0);
    `server` is a metrics address, a server process, or a LocalServer."""
    from outrig.testing import LocalServer

    if isinstance(server, LocalServer):
        figures = _local_figures(server).get(space)
        return 0 if figures is None else int(figures.waiters)
    address = server if isinstance(server, str) else server.metrics
    if address is None:
        raise ValueError("the server serves no metrics: start it with start_server(metrics=True)")
    return int(scrape(address).get(f'outrig_waiters{{space="{space}"}}', 0))


def wait_for_waiters(
    server: str | _WithMetrics | LocalServer, space: str, n: int, timeout: float = TIMEOUT
) -> None:
    """Wait until exactly `n` reads and takes are parked in `space` (from a thread other than the
    one that parks them, of course)."""
    seen: list[int] = []

    def parked() -> bool:
        seen.append(waiters(server, space))
        return seen[-1] == n

    wait_until(parked, timeout, what=lambda: f"{n} parked in space {space!r} (there are {seen[-1]})")


async def wait_for_waiters_async(server: Any, space: str, n: int, timeout: float = TIMEOUT) -> None:
    """`wait_for_waiters` on an event loop; `server` may also be a backend (its `space_figures()`)."""
    seen: list[int] = []

    async def parked() -> bool:
        if hasattr(server, "space_figures"):
            figures = (await server.space_figures()).get(space)
            seen.append(0 if figures is None else figures.waiters)
        else:  # a scrape or a look into another loop blocks: not on this one
            seen.append(await asyncio.to_thread(waiters, server, space))
        return seen[-1] == n

    await wait_until_async(
        parked, timeout, what=lambda: f"{n} parked in space {space!r} (there are {seen[-1]})"
    )


def once_parked(
    server: str | _WithMetrics | LocalServer, space: str, action: Callable[[], object], n: int = 1
) -> Future[float]:
    """Run `action` in a thread of its own once `n` reads and takes are parked in `space`: for
    a test that parks them in its own thread. The future gives the time.monotonic() at which the
    action began, or raises what the wait or the action raised."""
    done: Future[float] = Future()

    def run() -> None:
        try:
            wait_for_waiters(server, space, n)
            began = time.monotonic()
            action()
        except BaseException as err:
            done.set_exception(err)
        else:
            done.set_result(began)

    threading.Thread(target=run, name="once-parked", daemon=True).start()
    return done
