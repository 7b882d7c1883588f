"""The embedded backend: the memory backend (backends/memory) recorded in SQLite in the data dir,
with group commit (store/journal.py), rebuilt from it at start (store/recovery.py). Without a
data dir, or with `in_memory`, it is the memory backend alone.

A worker of `outrig serve --workers N` (the configuration's `worker`, service/workers.py) serves
the spaces `worker_of` places on it, from a store of its own; `locate` names the worker that
serves any other, and the workers forward calls to each other with the secret the supervisor
made. A dead-letter space's partition is placed with the partition whose dead letters it takes
("jobs.dead~3" on the worker of "jobs~3"), so that moving an entry there is one change of one
worker's store."""

from __future__ import annotations

import asyncio
import hmac
import logging
import sqlite3
from pathlib import Path

from outrig.service import software_version
from outrig.service.backends.base import Placement
from outrig.service.backends.embedded.store.journal import Journal
from outrig.service.backends.embedded.store.recovery import RecoveryReport, recover
from outrig.service.backends.embedded.store.schema import DataDirLock, database_path, open_store
from outrig.service.backends.memory.backend import MemoryBackend
from outrig.service.config import ServerConfig
from outrig.service.engine.clock import Clock
from outrig.service.engine.partitions import partition_name, split_name
from outrig.service.protocol import codec
from outrig.service.workers import check_layout, worker_of

log = logging.getLogger("outrig.service")


class EmbeddedBackend(MemoryBackend):
    """Spaces in memory, recorded in SQLite when the configuration names a data dir."""

    def __init__(self, config: ServerConfig, clock: Clock | None = None) -> None:
        super().__init__(config, clock)
        self._lock: DataDirLock | None = None
        self.recovery: RecoveryReport | None = None
        self._role = config.worker
        # A partitioned space's dead-letter space -> that space (config.py partitions it alike).
        self._dead_letter_sources = {
            settings.dead_letter or f"{name}.dead": name
            for name, settings in config.spaces.items()
            if settings.partitions > 1
        }

    # ------------------------------------------------------------------ a worker's placement

    @property
    def forwards(self) -> bool:
        """A worker's `locate` names the other workers' spaces (a subclass's may name anything)."""
        return self._role is not None or type(self).locate is not EmbeddedBackend.locate

    async def locate(self, space: str) -> str | None:
        """A worker's spaces are its own; any other is served by the worker `worker_of` names."""
        role = self._role
        if role is None:
            return None
        index = worker_of(self._placed_as(space), role.count)
        return None if index == role.index else role.addresses[index]

    def _placed_as(self, space: str) -> str:
        """The name `worker_of` places `space` by: a dead-letter space's partition goes where the
        partition it takes dead letters from goes (followed along a chain, never around one)."""
        seen = {space}
        while True:
            base, k = split_name(space)
            source = None if k is None else self._dead_letter_sources.get(base)
            if source is None or k is None:
                return space
            placed = partition_name(source, k)
            if placed in seen:
                return space
            space = placed
            seen.add(space)

    async def placements(self) -> list[Placement]:
        """A lone server's spaces; a worker's own (those of the others: ask them)."""
        role = self._role
        if role is None:
            return await super().placements()
        return [Placement(name, role.name, role.address, 0, None, True) for name in self._spaces]

    @property
    def peer_secret(self) -> str:
        return "" if self._role is None else self._role.secret

    def accepts_peer(self, secret: str) -> bool:
        """A worker accepts the calls its fellow workers forward (the supervisor's secret)."""
        role = self._role
        return role is not None and hmac.compare_digest(secret.encode(), role.secret.encode())

    async def open_store(self) -> None:
        data_dir = self.config.data_dir
        if data_dir is not None and not self.config.in_memory:
            self._open_store(data_dir)  # blocks, but nothing is served before start() returns

    def _open_store(self, data_dir: Path) -> None:
        if self._role is None:
            check_layout(data_dir, 1)  # not the stores of several workers
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
