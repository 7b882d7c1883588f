"""The memory backend's change feeds (issue 24): readers of a space's change log, its durable
subscriptions, and the records that make the log durable (engine/changes.py has the log).

A mixin, as deliveries.py is: `MemoryBackend` inherits it and sets each engine's hooks: on a
durable server `on_change` to `_changed`, which records each change, and (but under `always`,
where a change's batch wakes them once it is durable) `on_logged`, told once per call that logged
changes, to `wake_feeds`, which wakes the space's feeds.

A feed is one loop over the log: from its position it reads the changes after it, in order, a
batch at a time, and at the head it waits on the space's signal, an `asyncio.Event` set (and
replaced) by the next append: no polling, no per-subscriber queue, so replay and live reading have
no seam and a slow reader costs nothing but its position. Under `durability = always` it reads
only as far as the space's changes are durable (`_readable`): a change is recorded in the batch of
the change itself (the hook submits its `change` record in the same loop iteration as the call's
own records, with an undo that rewinds the log if the batch fails), and the batch's completion
moves the space's durable head. Under `interval` or in memory only, it reads to the log's head.

Records (memory/journal.py): `change` per change, `change_epoch` with a space's first,
`change_trim` from the reaper's pass when the oldest held change moved, `subscription` and
`subscription_delete` for durable subscriptions (made, acked, deleted: awaited, so that an ack
answers once durable).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import TYPE_CHECKING

from outrig.service.backends.base import ChangeBatch
from outrig.service.backends.memory.journal import Record
from outrig.service.backends.memory.recorder import Recorder
from outrig.service.engine.changes import Change, ChangeLog
from outrig.service.engine.clock import Clock
from outrig.service.engine.model import Template
from outrig.service.engine.space import SpaceEngine
from outrig.service.exceptions import (
    ChangesOffError,
    CompactedError,
    ShuttingDownError,
    SpaceError,
)

__all__ = ["BATCH", "ChangesMixin", "MemoryChangeFeed"]

#: Changes a feed reads from the log at a time (then other calls run).
BATCH = 256


class MemoryChangeFeed:
    """One reader of a space's change log (see the module docstring; `ChangeFeed` in base.py)."""

    def __init__(
        self,
        backend: ChangesMixin,
        space: str,
        log: ChangeLog,
        templates: Sequence[Template],
        kinds: frozenset[str],
        start: int,
        durable: str = "",
    ) -> None:
        self._backend = backend
        self._space = space
        self._log = log
        self._templates = tuple(templates)
        self._kinds = kinds
        self._start = start
        self._durable = durable
        self._ended = False
        self._error: SpaceError | None = None
        self._iterator: AsyncIterator[ChangeBatch] | None = None

    @property
    def epoch(self) -> int:
        return self._log.epoch

    @property
    def start(self) -> int:
        return self._start

    @property
    def oldest(self) -> int:
        return self._log.oldest - 1

    def _wanted(self, change: Change) -> bool:
        if change.kind not in self._kinds:
            return False
        templates = self._templates
        return not templates or any(template.matches(change.entry) for template in templates)

    def __aiter__(self) -> AsyncIterator[ChangeBatch]:
        """One iterator: a loop that breaks off and iterates again goes on where it was."""
        if self._iterator is None:
            self._iterator = self._iterate()
        return self._iterator

    async def _iterate(self) -> AsyncIterator[ChangeBatch]:
        log, backend, position = self._log, self._backend, self._start
        while True:
            if self._error is not None:
                raise self._error
            if self._ended:
                return
            readable = backend.readable(self._space, log)
            if position < readable:
                log.check(position, "since")  # retention may have passed a slow reader by
                changes = log.after(position, min(BATCH, readable - position))
                position = changes[-1].seq
                yield ChangeBatch([change for change in changes if self._wanted(change)], position)
                continue
            signal = backend.change_signal(self._space)
            if backend.readable(self._space, log) <= position and not self._ended:
                await signal.wait()

    def end(self, error: SpaceError | None) -> None:
        """The backend closes, or no longer serves the space: the feed ends (with `error`)."""
        self._error = error
        self._ended = True
        self._backend.forget_feed(self)
        self._backend.wake_feeds(self._space)

    def close(self) -> None:
        if not self._ended:
            self._ended = True
            self._backend.forget_feed(self)
            self._backend.wake_feeds(self._space)

    @property
    def space(self) -> str:
        return self._space

    @property
    def durable(self) -> str:
        return self._durable


class ChangesMixin:
    """Change feeds and durable subscriptions of the memory backend's spaces."""

    clock: Clock
    closing: bool
    _recorder: Recorder | None
    _spaces: dict[str, SpaceEngine]

    if TYPE_CHECKING:  # MemoryBackend's, used here

        def engine(self, name: str) -> SpaceEngine: ...
        def note(self, records: Sequence[Record]) -> None: ...
        def _check_store(self) -> None: ...

        _commit: Callable[..., Awaitable[None]]

    def _init_changes(self) -> None:
        self._change_signals: dict[str, asyncio.Event] = {}
        self._feeds: dict[str, set[MemoryChangeFeed]] = {}
        # Under `always`: per space, the seq through which its changes are durable, and the batch
        # its newest recorded change is in with that change's seq.
        self._durable_through: dict[str, int] = {}
        self._change_batches: dict[str, list[object]] = {}
        self._epoch_recorded: set[str] = set()  # spaces whose log's epoch the store holds
        self._trim_recorded: dict[str, int] = {}  # the oldest seq the store was last told of

    def _watch_changes(self, name: str, engine: SpaceEngine) -> None:
        """Have `engine` tell this backend of the changes it logs: each change, if a store
        records them (`_changed`), and then, once per call, that there are new ones (which wakes
        the space's feeds). In memory only, no `Change` is made for the first (`use_journal`
        watches the spaces again when a store comes). Under `always` a feed reads only as far as
        the changes are durable (`readable`), and the end of their batch wakes it
        (`_track_batch`): waking it as they are logged would only have it find nothing new, so
        the engine is given no `on_logged` then (a call and a frame less per change)."""
        if engine.changes is not None:
            recorder = self._recorder
            if recorder is None or not recorder.journal.waits:
                engine.on_logged = functools.partial(self.wake_feeds, name)  # a frame less than a lambda
            else:
                engine.on_logged = None
            if recorder is not None:
                engine.on_change = functools.partial(self._changed, name, engine)

    # ------------------------------------------------------------------ recording

    def _changed(self, space: str, engine: SpaceEngine, change: Change) -> None:
        """The engine's hook: record `change` in the batch of the change itself (the engine's
        `on_logged` then wakes the space's feeds). Never raises (it runs past the engine's
        commit point): while the store is failed, `submit` refuses and nothing of this reaches
        the store (a failed batch's undo, or as `note`)."""
        recorder = self._recorder
        if recorder is None:
            return
        journal = recorder.journal
        log = engine.changes
        assert log is not None
        records: Sequence[Record] = ()
        epoch = False
        if recorder.keeps_changes:
            # The change as the store records it, made here (a frame less per change): a write's
            # payload is its entry's row (memory/journal.py).
            entry, kind = change.entry, change.kind
            record = (
                "change",
                space,
                change.seq,
                kind,
                entry.id,
                change.at,
                change.transaction,
                change.visible_at,
                None if kind == "write" else entry.payload,
            )
            if space in self._epoch_recorded:
                records = (record,)
            else:
                records, epoch = (("change_epoch", space, log.epoch), record), True
        waits = journal.waits
        try:
            future, _ = journal.submit(
                records,
                functools.partial(self._rewind, log, space, change.seq) if waits else None,
                own=False,
            )
        except SpaceError:
            return
        if epoch:
            self._epoch_recorded.add(space)
        if waits:
            tracked = self._change_batches.get(space)
            if tracked is not None and tracked[0] is future:  # the space's newest change's batch
                tracked[1] = change.seq
            else:
                self._track_batch(recorder, space, future, change.seq)

    def _rewind(self, log: ChangeLog, space: str, seq: int) -> None:
        """A failed batch's undo of the change `seq` it recorded: the log goes back before it."""
        log.rewind(seq - 1)
        if seq == 1:
            self._epoch_recorded.discard(space)

    def _track_batch(self, recorder: Recorder, space: str, future: asyncio.Future[None], seq: int) -> None:
        """Remember that `seq` is durable once `future` (its batch) is: a batch other than that
        of the space's newest change (`_changed` moves the seq of that one itself)."""
        tracked = self._change_batches[space] = [future, seq]

        def done(batch: asyncio.Future[None]) -> None:
            if self._change_batches.get(space) is tracked:
                del self._change_batches[space]
            if batch.cancelled() or batch.exception() is not None:
                return
            through = tracked[1]
            assert isinstance(through, int)
            if through > self._durable_through.get(space, 0):
                self._durable_through[space] = through
                self.wake_feeds(space)

        recorder.when_done(future, done)

    def readable(self, space: str, log: ChangeLog) -> int:
        """The seq through which a feed may read now: the log's head, or under `always` its
        durable head (nobody sees what a crash could take back)."""
        recorder = self._recorder
        if recorder is None or not recorder.journal.waits:
            return log.head
        return min(log.head, self._durable_through.get(space, 0))

    def restore_changes(self, space: str, epoch: int, changes: Sequence[Change], head: int) -> None:
        """Put back a space's log from the store (recovery): it is durable through its head."""
        log = self.engine(space).changes
        if log is None:
            return
        log.restore(epoch, changes, head)
        self._epoch_recorded.add(space)
        self._durable_through[space] = log.head
        self._trim_recorded[space] = log.oldest

    def restore_durable(self, space: str, name: str, position: int) -> None:
        """Put back a durable subscription from the store (recovery)."""
        log = self.engine(space).changes
        if log is not None:
            log.subscriptions[name] = position

    def _trim_changes(self, engine: SpaceEngine) -> None:
        """The reaper's pass: age out old changes; tell the store when the oldest moved."""
        log = engine.changes
        if log is None:
            return
        log.trim(self.clock.time())
        if self._trim_recorded.get(engine.name, 1) != log.oldest:
            self._trim_recorded[engine.name] = log.oldest
            self.note([("change_trim", engine.name, log.oldest)])

    # ------------------------------------------------------------------ feeds

    def change_signal(self, space: str) -> asyncio.Event:
        """What the space's feeds wait on at the head: set by the next change."""
        signal = self._change_signals.get(space)
        if signal is None:
            signal = self._change_signals[space] = asyncio.Event()
        return signal

    def wake_feeds(self, space: str) -> None:
        signal = self._change_signals.pop(space, None)
        if signal is not None:
            signal.set()

    def forget_feed(self, feed: MemoryChangeFeed) -> None:
        feeds = self._feeds.get(feed.space)
        if feeds is not None:
            feeds.discard(feed)
        engine = self._spaces.get(feed.space)
        if feed.durable and engine is not None and engine.changes is not None:
            engine.changes.release(feed.durable)

    def _forget_changes(self, space: str) -> None:
        """`space` is no longer served here: what this backend knew of its log's recording goes
        (whoever serves it next loads the log from the store: `restore_changes`)."""
        for known in (self._durable_through, self._change_batches, self._trim_recorded):
            known.pop(space, None)
        self._epoch_recorded.discard(space)
        self.wake_feeds(space)

    def _end_feeds(self, space: str | None, error: SpaceError | None) -> None:
        """End the feeds of `space` (None: of every space)."""
        spaces = list(self._feeds) if space is None else [space]
        for name in spaces:
            for feed in list(self._feeds.pop(name, ())):
                feed.end(error)

    def _log_of(self, space: str) -> ChangeLog:
        log = self.engine(space).changes
        if log is None:
            raise ChangesOffError(
                f"space: {space!r} keeps no change log (its setting changes = false; see "
                "docs/notifications.md)"
            )
        return log

    async def changes(
        self,
        space: str,
        templates: Sequence[Template],
        kinds: frozenset[str],
        *,
        since: tuple[int, int] | None,
        durable: str = "",
    ) -> MemoryChangeFeed:
        if self.closing:
            raise ShuttingDownError("the server is shutting down")
        log = self._log_of(space)
        position: int | None = None
        if since is not None and not (durable and durable in log.subscriptions):
            epoch, position = since
            if epoch != log.epoch:
                raise CompactedError(
                    f"since: a cursor of another epoch of space {space!r}'s change log (it was "
                    f"made anew): the oldest still held is {log.oldest - 1}",
                    epoch=log.epoch,
                    oldest=log.oldest - 1,
                )
        head = self.readable(space, log)
        if durable:
            if self._recorder is not None and durable not in log.subscriptions:
                self._check_store()
            start, made = log.subscribe(durable, head if position is None else position)
            feed = MemoryChangeFeed(self, space, log, templates, kinds, start, durable)
            if made and self._recorder is not None:

                def unmake() -> None:
                    log.subscriptions.pop(durable, None)
                    log.release(durable)

                try:
                    await self._commit([("subscription", space, durable, start)], unmake)
                except BaseException:
                    log.release(durable)
                    raise
        else:
            start = head if position is None else position
            log.check(start)
            feed = MemoryChangeFeed(self, space, log, templates, kinds, start)
        self._feeds.setdefault(space, set()).add(feed)
        return feed

    async def ack_changes(self, space: str, durable: str, position: int) -> None:
        log = self._log_of(space)
        before = log.subscriptions.get(durable)
        if self._recorder is not None:
            self._check_store()
        if not log.ack(durable, position) or self._recorder is None:
            return

        def unack() -> None:
            if before is not None and durable in log.subscriptions:
                log.subscriptions[durable] = before

        await self._commit([("subscription", space, durable, position)], unack)

    async def delete_subscription(self, space: str, durable: str) -> None:
        log = self._log_of(space)
        if self._recorder is not None:
            self._check_store()
        position = log.unsubscribe(durable)
        if self._recorder is None:
            return

        def undelete() -> None:
            log.subscriptions.setdefault(durable, position)

        await self._commit([("subscription_delete", space, durable)], undelete)
