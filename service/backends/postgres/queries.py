"""SQL the PostgreSQL backend's operations share: which rows a caller may use, the template
condition, rows read back as entries, and the per-space counts behind the quotas.

A template list becomes one condition on the two GIN-indexed columns (`_named`, schema.py);
the candidates it finds are then checked in full with `Template.matches`. The row conditions
(`_READABLE`, `_TAKEABLE`, `_LOCKED_FOR_READ`, `_LOCKED_FOR_TAKE`) are written for a caller under
transaction `%(txn)s` (0: none).

What a space holds is counted in `outrig_space_counts`, 16 shards per space, in the same database
transaction as the change: a write adds to a random shard and is checked against the quotas
(`_charge`); entries that leave are taken off (`_delete`, `_retire`, `_uncount`). Only the sum over
a space's shards means anything.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from typing import Any

from psycopg import AsyncConnection

from outrig.service.backends.postgres.schema import field_key
from outrig.service.engine.model import StoredEntry, Template
from outrig.service.engine.space import SpaceSettings
from outrig.service.exceptions import QuotaExceededError
from outrig.service.protocol import codec

_SHARDS = 16  # quota count rows per space

# Rows a caller under transaction %(txn)s (0: none) may read, and may take.
_READABLE = "taken_at IS NULL AND taken_by IS NULL AND (written_by IS NULL OR written_by = %(txn)s)"
_TAKEABLE = (
    _READABLE + " AND NOT EXISTS (SELECT 1 FROM outrig_read_locks r WHERE r.space = e.space "
    "AND r.entry_id = e.id AND r.txn <> %(txn)s)"
)
# Rows it skipped for another transaction's lock: they may become usable when that one ends.
_LOCKED_FOR_READ = (
    "(taken_by IS NOT NULL AND taken_by <> %(txn)s) OR (written_by IS NOT NULL AND written_by <> %(txn)s)"
)
_LOCKED_FOR_TAKE = (
    "(" + _LOCKED_FOR_READ + ") OR EXISTS (SELECT 1 FROM outrig_read_locks r WHERE r.space = e.space "
    "AND r.entry_id = e.id AND r.txn <> %(txn)s)"
)


def _named(templates: Sequence[Template]) -> tuple[str, dict[str, Any]]:
    """The template condition with named parameters (t0, f0, t1, f1, ...)."""
    clauses, params = [], {}
    for i, template in enumerate(templates):
        fields = {name: field_key(value) for name, value in template.fields}
        clauses.append(f"(lineage @> ARRAY[%(t{i})s]::text[] AND fields @> %(f{i})s::jsonb)")
        params[f"t{i}"], params[f"f{i}"] = template.type_name, json.dumps(fields)
    return "(" + " OR ".join(clauses) + ")", params


async def _uncount(connection: AsyncConnection[Any], rows: Sequence[tuple[Any, ...]]) -> dict[str, int]:
    """Take (space, size) rows off their spaces' counts; how many rows per space."""
    gone: dict[str, list[int]] = {}
    for space, size in rows:
        tally = gone.setdefault(space, [0, 0])
        tally[0] += 1
        tally[1] += size
    for space, (count, size) in gone.items():
        await _add_to_counts(connection, space, -count, -size)
    return {space: count for space, (count, _) in gone.items()}


async def _add_to_counts(connection: AsyncConnection[Any], space: str, count: int, size: int) -> None:
    """Add to a random shard of the space's counts (only their sum means anything)."""
    await connection.execute(
        "INSERT INTO outrig_space_counts (space, shard, entries, bytes) VALUES (%s, %s, %s, %s) "
        "ON CONFLICT (space, shard) DO UPDATE SET entries = outrig_space_counts.entries + excluded.entries, "
        "bytes = outrig_space_counts.bytes + excluded.bytes",
        (space, random.randrange(_SHARDS), count, size),
    )


def _stored(row: tuple[Any, ...]) -> StoredEntry:
    entry_id, arrival, payload, expires_at = row
    stored = StoredEntry(entry_id, codec.stored_entry(bytes(payload)), expires_at)
    stored.arrival = arrival
    return stored


async def _charge(
    connection: AsyncConnection[Any], settings: SpaceSettings, space: str, count: int, size: int, now: float
) -> None:
    """Count a write against the space's quotas (rolled back with the write if it fails).
    Expired entries the reaper has not deleted yet do not count: they are deleted first.

    The counts are summed over shards, and writes racing on other shards are not seen until
    they commit: concurrent writes can overshoot a quota by what they write together."""
    await _add_to_counts(connection, space, count, size)
    entries = held = 0
    for attempt in range(2):
        cursor = await connection.execute(
            "SELECT coalesce(sum(entries), 0), coalesce(sum(bytes), 0) FROM outrig_space_counts "
            "WHERE space = %s",
            (space,),
        )
        row = await cursor.fetchone()
        assert row is not None
        entries, held = int(row[0]), int(row[1])
        if entries <= settings.max_entries and held <= settings.max_bytes:
            return
        if attempt == 0:
            await _delete(connection, "space = %s AND expires_at <= %s AND taken_at IS NULL", (space, now))
    if entries > settings.max_entries:
        raise QuotaExceededError(
            f"space {space!r} holds {entries - count} entries; writing {count} more exceeds its quota "
            f"max_entries={settings.max_entries}"
        )
    raise QuotaExceededError(
        f"space {space!r} holds {held - size} bytes; writing {size} more exceeds its quota "
        f"max_bytes={settings.max_bytes}"
    )


async def _delete(connection: AsyncConnection[Any], where: str, params: Sequence[Any]) -> int:
    """Delete live entries (expired, cancelled, never committed) and take them off their
    spaces' counts; how many went."""
    cursor = await connection.execute(
        "DELETE FROM outrig_entries WHERE taken_at IS NULL AND (" + where + ") RETURNING space, size",
        params,
    )
    return sum((await _uncount(connection, await cursor.fetchall())).values())


async def _retire(connection: AsyncConnection[Any], now: float, where: str, params: Sequence[Any]) -> int:
    """Mark entries taken (at `now`): gone for every match, off their spaces' counts, but kept for
    `_TAKEN_KEPT` seconds (reaper.py) so that other servers can still fetch them for their notify
    events."""
    cursor = await connection.execute(
        "UPDATE outrig_entries SET taken_at = %s WHERE taken_at IS NULL AND (" + where + ") "
        "RETURNING space, size",
        (now, *params),
    )
    return sum((await _uncount(connection, await cursor.fetchall())).values())
