"""Where spaces live: one protocol (base.SpaceBackend), two implementations.

`embedded/` serves each space from the pure engine in this process and records it in SQLite
(its `store/`); `postgres/` keeps every space in PostgreSQL, shared by many servers. Neither imports
gRPC: the transport above translates calls into the engine objects they take.
"""

from __future__ import annotations

from outrig.service.backends.base import SpaceBackend
from outrig.service.config import ServerConfig
from outrig.service.engine.clock import Clock
from outrig.service.exceptions import ConfigError


def backend_for(config: ServerConfig, clock: Clock | None = None) -> SpaceBackend:
    """The backend `config` names (its `backend`: "embedded" or "postgres")."""
    if config.backend == "postgres":
        try:
            from outrig.service.backends.postgres.backend import PostgresBackend
        except ImportError as err:  # pragma: no cover - depends on the install
            raise ConfigError(
                f"backend: postgres needs its extra: pip install 'outrig[postgres]' ({err})"
            ) from err
        return PostgresBackend(config, config.dsn, clock)
    from outrig.service.backends.embedded.backend import EmbeddedBackend

    return EmbeddedBackend(config, clock)
