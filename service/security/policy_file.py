"""A policy file, and its reloads: on SIGHUP and when the file changes.

A reload parses the file off the event loop, then replaces `current` in one assignment on the
loop, so a call sees either the old policy (with its decision cache) or the new one (with an empty
cache), never a mix. A file that cannot be parsed is rejected: the old policy stays, and the log
says why. A group with no members (`writers = []`) is valid: emptying a group is how its last
member loses its grants. The file is watched by polling its (mtime, size, inode) every `interval`
seconds, which needs no extra dependency and costs one stat per second.
"""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path

from outrig.service.exceptions import PolicyError
from outrig.service.security.policy import Policy, load_policy

log = logging.getLogger("outrig.service.security")

_Stamp = tuple[int, int, int] | None


def _stamp(path: Path) -> _Stamp:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)


class PolicyFile:
    """The policy loaded from `path`; raises PolicyError at construction if it cannot be used."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._stamp = _stamp(path)
        self.current: Policy = load_policy(path)
        self.reloads = 0  # successful reloads, for tests and statistics
        self.rejected = 0
        # One reload at a time: a slow parse of an older version must not be installed after a
        # newer one (SIGHUP and the watcher can both start a reload).
        self._reloading = asyncio.Lock()

    def _install(self, policy: Policy) -> None:
        # Nothing process-wide happens here: a reload used to gc.freeze() the whole heap (issue 18),
        # freezing whatever garbage was alive with the new grants. The old policy holds no
        # reference cycles, so reference counting frees it and its decision cache at this swap.
        self.current = policy
        self.reloads += 1
        log.info("policy reloaded from %s: %d grant(s)", self.path, len(policy.grants))

    def _reject(self, err: PolicyError) -> None:
        self.rejected += 1
        log.error("policy reload rejected, keeping the previous policy: %s", err)

    def reload(self) -> bool:
        """Load the file again now (blocking); True if the new policy is in force."""
        self._stamp = _stamp(self.path)
        try:
            policy = load_policy(self.path)
        except PolicyError as err:
            self._reject(err)
            return False
        self._install(policy)
        return True

    async def reload_async(self) -> bool:
        """`reload`, with the reading and parsing in a worker thread and the swap on the loop."""
        async with self._reloading:
            self._stamp = _stamp(self.path)
            try:
                policy = await asyncio.to_thread(load_policy, self.path)
            except PolicyError as err:
                self._reject(err)
                return False
            self._install(policy)
            return True

    async def watch(self, interval: float = 1.0) -> None:
        """Reload whenever the file's stamp changes; runs until cancelled."""
        while True:
            await asyncio.sleep(interval)
            if _stamp(self.path) != self._stamp:
                await self.reload_async()
