"""The embedded backend: the memory backend (backends/memory) recorded in SQLite in the data dir,
with group commit (store/journal.py), rebuilt from it at start (store/recovery.py). Without a
data dir, or with `in_memory`, it is the memory backend alone."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from pathlib import Path

from outrig.service import software_version
from outrig.service.backends.embedded.store.journal import Journal
from outrig.service.backends.embedded.store.recovery import RecoveryReport, recover
from outrig.service.backends.embedded.store.schema import DataDirLock, database_path, open_store
from outrig.service.backends.memory.backend import MemoryBackend
from outrig.service.config import ServerConfig
from outrig.service.engine.clock import Clock
from outrig.service.protocol import codec

log = logging.getLogger("outrig.service")


class EmbeddedBackend(MemoryBackend):
    """Spaces in memory, recorded in SQLite when the configuration names a data dir."""

    def __init__(self, config: ServerConfig, clock: Clock | None = None) -> None:
        super().__init__(config, clock)
        self._lock: DataDirLock | None = None
        self.recovery: RecoveryReport | None = None

    async def open_store(self) -> None:
        data_dir = self.config.data_dir
        if data_dir is not None and not self.config.in_memory:
            self._open_store(data_dir)  # blocks, but nothing is served before start() returns

    def _open_store(self, data_dir: Path) -> None:
        data_dir.mkdir(parents=True, exist_ok=True)
        self._lock = DataDirLock(data_dir)
        self._lock.acquire()
        interval = self.config.commit_interval_ms / 1000 if self.config.durability == "interval" else 0.0
        connection: sqlite3.Connection | None = None
        try:
            connection = open_store(data_dir, software_version())
            journal = Journal(
                database_path(data_dir),
                connection,
                codec.entry_bytes,
                wait=self.config.durability == "always",
                interval=interval,
            )
            self.use_journal(journal)
            self.recovery = recover(connection, self, self.clock.time())
        except BaseException:
            self._recorder = None
            if connection is not None:
                connection.close()
            self._lock.release()
            raise
        journal.start(asyncio.get_running_loop())
        log.info(
            "data dir %s: %s; durability %s",
            data_dir,
            self.recovery,
            "always" if interval == 0 else f"interval ({self.config.commit_interval_ms} ms)",
        )

    async def shutdown(self) -> None:
        await super().shutdown()
        if self._lock is not None:
            self._lock.release()
            self._lock = None
