"""The least a space must do for a write+take pair, as a gRPC server: a floor with the work in it,
for bench/floor.py.

    python bench/minimal_server.py [--listen HOST:PORT] [--data-dir DIR] [--max-message-bytes N]

The no-op server (bench/noop_server.py) answers from canned replies; this one, built on it (the
same service, generated code, Mux stream and framing), keeps what is written and hands it back:

- a Mux ``write``, and each entry of a ``write_many``, files its entry (the `pb.Entry` the
  stream's deserializer decoded) under a new id in a hash index of (type name, field name, the
  Value's bytes), keeps the entry's bytes, and answers with a lease of its own (the id, an
  expiry, the seconds granted);
- a Mux ``take`` (a ``take_many``: up to its max_entries) looks the template's first set field
  up in that index (or the type's bucket when no field is set), takes the first entries whose
  every other template field is equal, unfiles them from each of their buckets and answers with
  their bytes; no match answers at once with no entry (the workloads this floor is for always
  find theirs: the take follows the write's answer).

Nothing else: no supertypes, leases that never expire, no request ids, no change log, no
quotas, no waiting, no access check, no metrics; every other call is the no-op server's (a
write still puts the no-op's canned event in each Notify stream). With ``--data-dir``, each
MuxRequest's writes and takes are also appended to a log file in DIR (each op's bytes,
length-prefixed), and the results of the requests that arrived in one turn of the event loop
wait for one ``fdatasync`` on a thread of its own (group commit, as Redis's ``appendfsync
always`` does per turn): the least a durable space must do, without recovery.

Prints ``minimal listening on HOST:PORT`` once it serves, and stops on SIGTERM or SIGINT.
"""

# The gRPC method names are fixed by the proto.
# ruff: noqa: N802

from __future__ import annotations

import argparse
import asyncio
import os
import struct
import time
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from noop_server import MAX_STREAM_OPS, NoopSpace, Reply, _reply, _Stream, serve

from outrig._protocol import LIMIT_KEY
from outrig.service.transport.mux import Result
from outrig.v1 import space_pb2 as pb

_LEASE_SECONDS = 60.0
_ENTRIES_TAG = b"\x0a"  # MatchReply.entries, field 1, length-delimited
_LOGGED = frozenset(("write", "write_many", "take", "take_many"))  # what --data-dir logs


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


class _Stored:
    __slots__ = ("body", "keys")

    def __init__(self, body: bytes, keys: list[tuple[str, str, bytes]]) -> None:
        self.body = body  # the MatchReply carrying this entry, ready to send
        self.keys = keys  # the buckets it is filed in, the type's first


class MinimalSpace(NoopSpace):
    """NoopSpace, but for Mux writes and takes, which keep and return entries."""

    def __init__(self, data_dir: Path | None = None) -> None:
        super().__init__()
        self._next_id = 1
        self._entries: dict[int, _Stored] = {}
        # (type, "", b"") -> the type's ids; (type, field, value bytes) -> ids; in write order.
        self._buckets: dict[tuple[str, str, bytes], dict[int, None]] = {}
        self._log = None if data_dir is None else open(data_dir / "minimal.log", "ab", buffering=0)  # noqa: SIM115
        self._syncer = ThreadPoolExecutor(1, thread_name_prefix="fsync")
        self._unsynced = 0
        self._waiting: list[asyncio.Future[None]] = []
        self._sync_scheduled = False

    def _filed(self, entry: pb.Entry) -> pb.Lease:
        """File `entry` under a new id; its lease."""
        entry_id = self._next_id
        self._next_id += 1
        type_name = entry.type_name
        keys = [(type_name, "", b"")]
        for name, value in entry.fields.items():
            keys.append((type_name, name, value.SerializeToString()))
        for key in keys:
            bucket = self._buckets.get(key)
            if bucket is None:
                bucket = self._buckets[key] = {}
            bucket[entry_id] = None
        body = entry.SerializeToString()
        self._entries[entry_id] = _Stored(_ENTRIES_TAG + _varint(len(body)) + body, keys)
        return pb.Lease(id=entry_id, expires_at=time.time() + _LEASE_SECONDS, granted_seconds=_LEASE_SECONDS)

    def _taken(self, request: pb.MatchRequest, most: int) -> bytes:
        """Up to `most` entries matching the request's first template, unfiled: a MatchReply."""
        template = request.templates[0]
        type_name = template.type_name
        wanted = [(type_name, name, value.SerializeToString()) for name, value in template.fields.items()]
        bucket = self._buckets.get(wanted[0] if wanted else (type_name, "", b""))
        if not bucket:
            return b""
        others = set(wanted[1:])
        found: list[int] = []
        for entry_id in bucket:
            if others.issubset(self._entries[entry_id].keys):
                found.append(entry_id)
                if len(found) == most:
                    break
        bodies = []
        for entry_id in found:
            stored = self._entries.pop(entry_id)
            for key in stored.keys:
                del self._buckets[key][entry_id]  # emptied buckets stay, as outrig's slots do
            bodies.append(stored.body)
        return b"".join(bodies)

    def _mux_reply(self, op: pb.MuxOp, kind: str) -> Reply:
        if kind == "write":
            self._written()
            return _reply(kind, pb.WriteReply(lease=self._filed(op.write.entry)).SerializeToString())
        if kind == "write_many":
            leases = [self._filed(entry) for entry in op.write_many.entries]
            return _reply(kind, pb.WriteManyReply(leases=leases).SerializeToString())
        if kind == "take":
            return _reply(kind, self._taken(op.take, 1))
        if kind == "take_many":
            return _reply(kind, self._taken(op.take_many, max(1, op.take_many.max_entries)))
        return super()._mux_reply(op, kind)

    # Durability: the log and the group commit.

    def _logged(self, request: pb.MuxRequest) -> asyncio.Future[None] | None:
        """Append the request's writes and takes to the log; the future is done once they are on disk."""
        if self._log is None:
            return None
        parts: list[bytes] = []
        for op in request.ops:
            kind = op.WhichOneof("op")
            if kind in _LOGGED:
                data = op.SerializeToString()
                parts += (struct.pack("<I", len(data)), data)
        if not parts:
            return None
        self._log.write(b"".join(parts))
        future = asyncio.get_running_loop().create_future()
        self._waiting.append(future)
        if not self._sync_scheduled:
            self._sync_scheduled = True
            asyncio.get_running_loop().call_soon(self._sync)  # after this turn's other requests
        return future

    def _sync(self) -> None:
        assert self._log is not None
        waiting, self._waiting = self._waiting, []
        self._sync_scheduled = False
        loop = asyncio.get_running_loop()
        done = loop.run_in_executor(self._syncer, os.fdatasync, self._log.fileno())

        def release(finished: asyncio.Future[None]) -> None:
            error = finished.exception()
            for future in waiting:
                if error is None:
                    future.set_result(None)
                else:
                    future.set_exception(error)

        done.add_done_callback(release)

    async def Mux(self, requests: AsyncIterator[pb.MuxRequest], context: Any) -> None:  # type: ignore[override]
        if self._log is None:
            await super().Mux(requests, context)
            return
        await context.send_initial_metadata(((LIMIT_KEY, str(MAX_STREAM_OPS)),))
        stream = _Stream(context)
        writer = asyncio.ensure_future(stream.write())
        pending: set[asyncio.Future[None]] = set()
        try:
            async for request in requests:
                results = self._mux_results(request)
                synced = self._logged(request)
                if synced is None:
                    stream.add(results)
                else:  # its results are sent once its records are on disk
                    task = asyncio.ensure_future(self._after(synced, stream, results))
                    pending.add(task)
                    task.add_done_callback(pending.discard)
                while stream.in_flight >= MAX_STREAM_OPS:
                    await stream.wait_progress()
            while pending or stream.in_flight:
                await (asyncio.wait(pending) if pending else stream.wait_progress())
        finally:
            writer.cancel()

    @staticmethod
    async def _after(synced: asyncio.Future[None], stream: _Stream, results: list[Result]) -> None:
        await synced
        stream.add(results)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--listen", default="127.0.0.1:0", metavar="HOST:PORT")
    parser.add_argument("--data-dir", type=Path, help="log every write and take there, fdatasync per turn")
    parser.add_argument("--max-message-bytes", type=int, default=64 * 1024 * 1024, metavar="N")
    args = parser.parse_args()
    asyncio.run(serve(args.listen, args.max_message_bytes, MinimalSpace(args.data_dir), "minimal"))


if __name__ == "__main__":
    main()
