"""The SDK's behaviour suites (tests/integration/test_sdk_sync.py and test_transactions.py,
collected again by the modules here) run again through `outrig serve --workers 2`, every
connection made to the public port that both workers share:

- `forwarded`: the SDK with `direct=False`: a call that reaches the worker which does not serve
  its space is forwarded by it to the other;
- `direct`: the SDK as it comes, which asks Locate and sends a space's calls to its worker's own
  port.

The suites' spaces are spread over both workers, so the `server` they see has, as its metrics
address, a small HTTP server in this process that answers /metrics with both workers' samples
(where blocked calls park: tests/polling.py reads `outrig_waiters` there).
"""

from __future__ import annotations

import dataclasses
import functools
import http.server
import socket
import threading
import urllib.request
from collections.abc import Iterator

import pytest

import outrig
import outrig.aio

from ...conftest import ServerProcess, free_port
from ...worker_processes import start_workers
from ..entries import Task


def _merged_metrics(addresses: list[str]) -> http.server.ThreadingHTTPServer:
    """An HTTP server whose /metrics is the concatenation of the workers' (a space's samples come
    from the one worker that serves it)."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            parts = []
            for address in addresses:
                with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as reply:
                    parts.append(reply.read())
            body = b"\n".join(parts)
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            return

    merged = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=merged.serve_forever, name="merged-metrics", daemon=True).start()
    return merged


@pytest.fixture(scope="module", params=["forwarded", "direct"])
def server(request: pytest.FixtureRequest) -> Iterator[ServerProcess]:
    metrics = free_port()
    while True:  # the workers serve metrics on this port and the next
        try:
            with socket.create_server(("127.0.0.1", metrics + 1)):
                break
        except OSError:
            metrics = free_port()
    workers = start_workers(2, "--metrics-listen", f"127.0.0.1:{metrics}")
    merged = _merged_metrics([f"127.0.0.1:{metrics}", f"127.0.0.1:{metrics + 1}"])
    try:
        with pytest.MonkeyPatch.context() as patch:
            if request.param == "forwarded":
                patch.setattr(outrig, "connect", functools.partial(outrig.connect, direct=False))
                patch.setattr(outrig.aio, "connect", functools.partial(outrig.aio.connect, direct=False))
            address = f"127.0.0.1:{merged.server_address[1]}"
            yield dataclasses.replace(workers.server, metrics=address)
            # Under pytest-xdist this process may have run a few of the suite's tests only, which
            # may have made no space of one worker's (or none at all): a space of each worker's,
            # written to through the shared port as the suite's are, keeps the check below one of
            # routing, whichever tests ran here.
            for index in (0, 1):
                (name,) = workers.spaces_of(index, prefix="spread.")
                with outrig.connect(workers.server.address, space=name) as space:
                    space.write(Task(n=index), lease=60)
        # The suites' spaces were served by both workers, each its own share.
        owners = set()
        for index, own in enumerate(workers.addresses):
            with outrig.connect(own, direct=False) as asked:
                spaces = [p.space for p in asked.list_spaces()]
            assert all(workers.owner(space) == index for space in spaces)
            if spaces:
                owners.add(index)
        assert owners == {0, 1}
    finally:
        merged.shutdown()
        merged.server_close()
        assert workers.stop() == 0
