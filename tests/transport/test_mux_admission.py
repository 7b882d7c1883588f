"""A Mux stream asks once whether its operations are let in with nothing to check per operation
(servicer.py's `admits_all`, which spares each operation `_admitted`): only on a lone server with
no partitioned space and an open guard, for a stream that presents no peer secret. Wherever it
answers false, every operation still goes through `_admitted` (its refusals:
tests/transport/test_mux_peer.py, tests/security)."""

from __future__ import annotations

import asyncio
from typing import Any

from outrig.service.config import Limits, ServerConfig
from outrig.service.engine import SpaceSettings
from outrig.service.security.guard import Authenticator, Guard
from outrig.service.transport import handlers
from outrig.service.transport.peers import PEER_KEY
from outrig.service.transport.server import OutrigServer
from outrig.service.transport.servicer import SpaceServicer


class _StreamCall:
    """What a StreamContext reads of a Mux call's gRPC context when it is made: its metadata."""

    def __init__(self, metadata: tuple[tuple[str, str], ...]) -> None:
        self._metadata = metadata

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._metadata


def _context(*metadata: tuple[str, str]) -> Any:
    call: Any = _StreamCall(metadata)
    secrets = [value for key, value in metadata if key == PEER_KEY]
    return handlers.StreamContext(call, secrets[0] if secrets else None)


async def _servicer(config: ServerConfig) -> SpaceServicer:
    """The servicer of an in-memory server built from `config` (not started)."""
    return OutrigServer(config)._servicer


def _in_memory(**options: Any) -> SpaceServicer:
    return asyncio.run(_servicer(ServerConfig(in_memory=True, listen="127.0.0.1:0", **options)))


def test_a_lone_open_server_admits_every_operation_of_a_stream_without_a_peer_secret() -> None:
    servicer = _in_memory()
    assert servicer.admits_all(_context())
    assert servicer.admits_all(_context(("x-other", "1")))
    assert not servicer.admits_all(_context((PEER_KEY, "guessed")))  # checked per operation


def test_a_guarded_or_partitioned_server_checks_each_operation() -> None:
    servicer = _in_memory()
    limits = Limits()
    guarded = SpaceServicer(
        servicer._backend, limits, guard=Guard(Authenticator(None, client_certificates=True), None, limits)
    )
    assert not guarded.admits_all(_context())
    partitioned = _in_memory(spaces={"jobs": SpaceSettings(partition_by="region", partitions=2)})
    assert not partitioned.admits_all(_context())
