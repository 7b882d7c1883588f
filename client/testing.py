"""Test against a real, in-process outrig server (needs `outrig[server]`).

    from outrig.testing import LocalServer

    with LocalServer() as server, outrig.connect(server.address) as space:
        space.write(Task(n=1), lease=10.0)
        server.clock.advance(11.0)          # with LocalServer(fake_clock=True): leases expire now
        assert space.read_nowait(Task()) is None

The server runs its own event loop in a background thread and listens on a free loopback port.
With `fake_clock=True`, leases read a clock that moves only when the test calls `advance`, so lease
tests need no sleeps.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from types import TracebackType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from outrig.service.config import ServerConfig
    from outrig.service.engine.clock import FakeClock
    from outrig.service.transport.server import OutrigServer


class LocalServer:
    """A real outrig server in this process, for tests. Use as a context manager."""

    def __init__(self, config: ServerConfig | None = None, *, fake_clock: bool = False) -> None:
        from outrig.service.config import ServerConfig
        from outrig.service.engine.clock import FakeClock

        base = config or ServerConfig()
        self.config = dataclasses.replace(
            base, listen="127.0.0.1:0", reap_interval=min(base.reap_interval, 0.05)
        )
        self.clock: FakeClock | None = FakeClock(time.time()) if fake_clock else None
        self.address = ""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="outrig-local-server", daemon=True
        )
        self._server: OutrigServer | None = None

    def start(self) -> str:
        """Start serving; returns the address to connect to."""
        from outrig.service.transport.server import OutrigServer

        self._thread.start()

        async def start() -> OutrigServer:
            server = OutrigServer(self.config, clock=self.clock)
            await server.start()
            return server

        self._server = asyncio.run_coroutine_threadsafe(start(), self._loop).result(timeout=30)
        self.address = self._server.address
        return self.address

    def stop(self, grace: float = 0.0) -> None:
        """Stop serving and end the background thread."""
        if self._server is not None:
            asyncio.run_coroutine_threadsafe(self._server.stop(grace), self._loop).result(timeout=30)
            self._server = None
        if self._thread.is_alive():
            # What the stop left on the loop (a call's handler cut off by a stop without grace):
            # cancelled and finished here, as asyncio.run does, not destroyed pending with the loop.
            asyncio.run_coroutine_threadsafe(_finish_the_rest(), self._loop).result(timeout=30)
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=30)
        if not self._loop.is_closed() and not self._loop.is_running():
            self._loop.close()

    def __enter__(self) -> LocalServer:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


async def _finish_the_rest() -> None:
    """Cancel every other task of the running loop and wait (a few seconds at most) for them to
    end, then close its asynchronous generators."""
    current = asyncio.current_task()
    rest = [task for task in asyncio.all_tasks() if task is not current]
    for task in rest:
        task.cancel()
    if rest:
        await asyncio.wait(rest, timeout=5.0)
    await asyncio.get_running_loop().shutdown_asyncgens()
