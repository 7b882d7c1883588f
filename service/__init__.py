"""The outrig server: `outrig serve`, or `OutrigServer(config)` from Python.

Layers, outermost first: server (grpc.aio, health, reflection) -> servicer (protobuf <-> engine
objects, errors -> status codes) -> backend (where spaces live) -> engine (pure matching).
"""

from __future__ import annotations


def software_version() -> str:
    """The installed outrig's version (recorded in the stores it creates)."""
    import importlib.metadata  # here: 30 ms that `outrig serve` need not pay before its re-exec

    try:
        return importlib.metadata.version("outrig")
    except importlib.metadata.PackageNotFoundError:
        return "0+unknown"
