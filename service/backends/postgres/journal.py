"""Group commit to PostgreSQL, fenced by ownership: the owner backend's `Journal`.

Changes applied in memory arrive as records (backends/memory/journal.py); those that arrive while
a batch is being written join the next one, so one database transaction serves every change that
arrived meanwhile. A batch's records are first folded into their net effect per row (a write and
the take of the same entry in one batch become one DELETE), then sent as a few `executemany`
statements in one pipeline, then committed; every caller of the batch is answered only after
the COMMIT returned.

Fencing: a batch's first statement (`outrig_fence`) takes a shared advisory lock per space it
changes and reads their owner and epoch. A change of a space whose epoch is no longer this
server's is not written: its callers get NotOwnerError and the backend drops the space. A claim
by another server takes that lock exclusively before it changes the space's row, so it waits for
a batch that passed the check to commit, and every batch after the claim fails the check:
nothing is acknowledged by a server that has lost a space, and the new owner, loading after its
claim, sees every acknowledged change.

Dead letters (docs/postgres.md, "Dead letters in a tier"): beside the memory backend's records
(backends/memory/journal.py), the owner backend records two of its own, for an entry that leaves
its space for a dead-letter space another server may own:

    dead_letter(space, id, dead_space, expires_at, payload, deliveries, reason, moved_at)
                                                       the entry left `space` (its `delete` is in
                                                       the same change) for `dead_space`: a row of
                                                       outrig_dead_letters, until it is taken in
    dead_letter_taken(dead_space, source, id)          the dead-letter space's owner took it in (its
                                                       `put` and `visibility` in the same change)

The change log (migration 5; the `change*` and `subscription*` records of backends/memory/
journal.py) goes in the batch of the change it logs, fenced with it, so a change refused by the
fence is not logged either: `change` rows are one INSERT per batch, a `change_trim` one DELETE
of seq < oldest per space (the batch's own changes below it are never written; the head is at
least oldest - 1, kept with it), `change_epoch` and `change_head` one UPDATE of outrig_spaces,
durable subscriptions one upsert and one DELETE. A space's log records share one key
(`record_keys`), so two batches with changes of one space are never in flight together: the
rows stay a gap-free run whatever fails.

A change is fenced by every space it changes: a dead letter put straight into a dead-letter space
this server owns too is one change of both spaces, written only if both are still this server's.

Failure: if a batch fails in any other way (the connection lost, a statement refused, no answer
within the owner lease) its outcome may be unknown (a COMMIT sent whose answer never came), so
memory cannot be trusted to equal the database any more: every caller of the batch and of the
open one gets UNAVAILABLE, and `on_uncertain` has the backend drop every space it serves, to load
them again from the database once it is reachable (then a retry with a request id gets the
first call's answer, whichever way the COMMIT went). No undo runs: what is dropped is forgotten.
Until a probe reconnects, `check()` refuses changes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any

import psycopg

from outrig.service.backends.memory.journal import Record, TakenRow, WriteAnswer
from outrig.service.backends.postgres.deadlines import within
from outrig.service.exceptions import NotOwnerError, StoreUnavailableError

log = logging.getLogger("outrig.service.backends.postgres")

# Batches in flight at most (each on a connection of its own), when they touch no common row.
IN_FLIGHT = 2
# The SQLSTATE outrig_fence fails a batch with (schema.py).
FENCED = "OR001"
# Request ids deleted per batch at most (their window has passed).
PRUNE_LIMIT = 5000


def record_spaces(record: Record) -> str | None:
    """The space a record changes (None for the tier-wide prune): the one whose ownership fences
    it (a dead letter taken in: the dead-letter space's)."""
    kind = record[0]
    if kind == "prune_requests":
        return None
    if kind == "request":
        return str(record[2])
    return str(record[1])


class Changes:
    """A batch's records folded into their net effect: per entry and per registration the last
    state (a full row, a deletion, or columns to update), the rest as sets."""

    def __init__(self, dump: Callable[[object], bytes | memoryview]) -> None:
        self._dump = dump
        # (space, id) -> ["put", row] | ["delete"] | ["update", {column: value}]
        self.entries: dict[tuple[str, int], list[Any]] = {}
        self.registrations: dict[tuple[str, int], list[Any]] = {}
        self.types: dict[tuple[str, str], list[str]] = {}
        self.next_ids: dict[str, int] = {}
        self.requests: dict[str, tuple[Any, ...]] = {}
        # (space, id) -> ["open", expires_at] | ["expiry", expires_at] | ["end"]
        self.transactions: dict[tuple[str, int], list[Any]] = {}
        # (space, transaction, entry) -> (mode, request id, position, its window's end), or None
        self.locks: dict[tuple[str, int, int], tuple[str, str | None, int | None, float | None] | None] = {}
        # (source, id) -> the rest of its outrig_dead_letters row, or None: taken in
        self.dead_letters: dict[tuple[str, int], tuple[Any, ...] | None] = {}
        self._dead_replaced: set[tuple[str, int]] = set()
        self.prune_before: float | None = None
        # The change log: (space, seq) -> the rest of its outrig_changes row; per space the
        # oldest seq kept (a trim), the log's epoch and its head (columns of outrig_spaces).
        self.log: dict[tuple[str, int], tuple[Any, ...]] = {}
        self.trims: dict[str, int] = {}
        self.log_epochs: dict[str, int] = {}
        self.log_heads: dict[str, int] = {}
        # (space, name) -> (a durable subscription's position,), or None: deleted
        self.subscriptions: dict[tuple[str, str], tuple[int] | None] = {}

    def add(self, records: Iterable[Record]) -> None:
        for kind, *args in records:
            getattr(self, "_" + kind)(*args)

    @staticmethod
    def _update(
        table: dict[tuple[str, int], list[Any]], key: tuple[str, int], column: str, value: Any
    ) -> None:
        state = table.get(key)
        if state is None:
            table[key] = ["update", {column: value}]
        elif state[0] in ("put", "update"):
            state[1][column] = value
        # after a deletion: nothing to update

    def _put(
        self, space: str, entry_id: int, arrival: int, expires_at: float | None, payload: object
    ) -> None:
        row = {
            "arrival": arrival,
            "expires_at": expires_at,
            "payload": self._dump(payload),
            "written_by": None,
            "visibility": _VISIBLE,
        }
        self.entries[(space, entry_id)] = ["put", row]

    def _written(
        self,
        space: str,
        entry_id: int,
        arrival: int,
        expires_at: float | None,
        payload: object,
        transaction: int,
    ) -> None:
        self._put(space, entry_id, arrival, expires_at, payload)
        self.entries[(space, entry_id)][1]["written_by"] = transaction

    def _delete(self, space: str, entry_id: int) -> None:
        self.entries[(space, entry_id)] = ["delete"]

    def _entry_expiry(self, space: str, entry_id: int, expires_at: float | None) -> None:
        self._update(self.entries, (space, entry_id), "expires_at", expires_at)

    def _take(
        self, space: str, entry_id: int, request_id: str, position: int, until: float | None = None
    ) -> None:
        self._update(self.entries, (space, entry_id), "taken", (request_id, position, until))

    def _visibility(
        self,
        space: str,
        entry_id: int,
        hidden_until: float | None,
        receipt: int | None,
        deliveries: int,
        dead_letter_reason: str | None,
        max_deliveries: int = 0,
    ) -> None:
        self._update(
            self.entries,
            (space, entry_id),
            "visibility",
            (hidden_until, receipt, deliveries, dead_letter_reason or None, max_deliveries),
        )

    def _dead_letter(
        self,
        space: str,
        entry_id: int,
        dead_space: str,
        expires_at: float | None,
        payload: object,
        deliveries: int,
        reason: str,
        moved_at: float,
    ) -> None:
        key = (space, entry_id)
        if key in self.dead_letters and self.dead_letters[key] is not None:
            return  # the first stays, as a row would (ON CONFLICT DO NOTHING)
        if key in self.dead_letters:
            self._dead_replaced.add(key)  # taken in, then here again: its old row goes first
        self.dead_letters[key] = (dead_space, expires_at, self._dump(payload), deliveries, reason, moved_at)

    def _dead_letter_taken(self, dead_space: str, source: str, entry_id: int) -> None:
        self.dead_letters[(source, entry_id)] = None

    def _next_id(self, space: str, mark: int) -> None:
        self.next_ids[space] = max(mark, self.next_ids.get(space, 0))

    def _type(self, space: str, name: str, supertypes: str) -> None:
        self.types.setdefault((space, name), list(json.loads(supertypes)))  # the first, as stored

    def _register(
        self, space: str, registration_id: int, expires_at: float | None, templates: bytes, sequence: int
    ) -> None:
        row = {"expires_at": expires_at, "templates": templates, "sequence": sequence}
        self.registrations[(space, registration_id)] = ["put", row]

    def _unregister(self, space: str, registration_id: int) -> None:
        self.registrations[(space, registration_id)] = ["delete"]

    def _registration_expiry(self, space: str, registration_id: int, expires_at: float | None) -> None:
        self._update(self.registrations, (space, registration_id), "expires_at", expires_at)

    def _sequence(self, space: str, registration_id: int, sequence: int) -> None:
        state = self.registrations.get((space, registration_id))
        if state is not None and state[0] != "delete" and "sequence" in state[1]:
            sequence = max(sequence, state[1]["sequence"])  # numbers only grow
        self._update(self.registrations, (space, registration_id), "sequence", sequence)

    def _request(self, request_id: str, space: str, kind: str, *answer: Any) -> None:
        if kind == "take":
            return  # kept on the rows it took (taken_by, taken_until) or locked: no row of its own
        self.requests[request_id] = (request_id, space, kind, *answer)

    def _transaction(self, space: str, transaction: int, expires_at: float | None) -> None:
        self.transactions[(space, transaction)] = ["open", expires_at]

    def _transaction_expiry(self, space: str, transaction: int, expires_at: float | None) -> None:
        state = self.transactions.get((space, transaction))
        if state is None:
            self.transactions[(space, transaction)] = ["expiry", expires_at]
        elif state[0] != "end":
            state[1] = expires_at

    def _transaction_end(self, space: str, transaction: int) -> None:
        self.transactions[(space, transaction)] = ["end"]

    def _lock(
        self,
        space: str,
        transaction: int,
        entry_id: int,
        mode: str,
        request_id: str | None,
        position: int | None,
        until: float | None = None,
    ) -> None:
        self.locks[(space, transaction, entry_id)] = (mode, request_id, position, until)

    def _unlock(self, space: str, transaction: int, entry_id: int) -> None:
        self.locks[(space, transaction, entry_id)] = None

    def _prune_requests(self, now: float) -> None:
        self.prune_before = now

    def _change(
        self,
        space: str,
        seq: int,
        kind: str,
        entry_id: int,
        at: float,
        transaction: int,
        visible_at: float | None,
        payload: object,
    ) -> None:
        dumped = None if payload is None else self._dump(payload)
        self.log[(space, seq)] = (kind, entry_id, at, transaction, visible_at, dumped)

    def _change_trim(self, space: str, oldest: int) -> None:
        """Changes of `space` below `oldest` go: those of this batch are never written. The head
        is at least oldest - 1, recorded with it: a log trimmed empty still knows its head, so
        its seqs are never handed out again."""
        self.trims[space] = max(oldest, self.trims.get(space, oldest))
        self._change_head(space, oldest - 1)
        for key in [key for key in self.log if key[0] == space and key[1] < oldest]:
            del self.log[key]

    def _change_epoch(self, space: str, epoch: int) -> None:
        self.log_epochs[space] = epoch

    def _change_head(self, space: str, head: int) -> None:
        self.log_heads[space] = max(head, self.log_heads.get(space, head))

    def _subscription(self, space: str, name: str, position: int) -> None:
        self.subscriptions[(space, name)] = (position,)

    def _subscription_delete(self, space: str, name: str) -> None:
        self.subscriptions[(space, name)] = None

    def script(self, spaces: Sequence[str]) -> list[str]:
        """The statements that apply the changes, values inlined (see `literal`): a batch goes to
        PostgreSQL as one simple query, one round trip however many changes it holds. `spaces`:
        those this server owns (a prune touches only theirs)."""
        out: list[str] = []
        deleted: dict[str, list[int]] = {}
        puts: list[str] = []
        expiries: list[str] = []
        takes: list[str] = []
        visibilities: list[str] = []
        for (space, entry_id), state in self.entries.items():
            if state[0] == "delete":
                deleted.setdefault(space, []).append(entry_id)
            elif state[0] == "put":
                row = state[1]
                taken_by, position, until = row.get("taken", (None, None, None))
                puts.append(
                    _row(
                        space,
                        entry_id,
                        row["arrival"],
                        row["expires_at"],
                        row["payload"],
                        taken_by,
                        position,
                        until,
                        row["written_by"],
                        *row["visibility"],
                    )
                )
            else:
                columns = state[1]
                if "expires_at" in columns:
                    expiries.append(_row(space, entry_id, columns["expires_at"]))
                if "taken" in columns:
                    takes.append(_row(space, entry_id, *columns["taken"]))
                if "visibility" in columns:
                    visibilities.append(_row(space, entry_id, *columns["visibility"]))
        for space, ids in deleted.items():
            out.append(
                f"DELETE FROM outrig_entries WHERE space = {literal(space)} "
                f"AND id IN ({', '.join(map(str, ids))})"
            )
        if puts:
            out.append(
                "INSERT INTO outrig_entries "
                "(space, id, arrival, expires_at, payload, taken_by, taken_position, taken_until, "
                "written_by, hidden_until, receipt, deliveries, dead_letter_reason, max_deliveries) "
                f"VALUES {', '.join(puts)} ON CONFLICT (space, id) DO UPDATE SET arrival = EXCLUDED.arrival, "
                "expires_at = EXCLUDED.expires_at, payload = EXCLUDED.payload, taken_by = EXCLUDED.taken_by, "
                "taken_position = EXCLUDED.taken_position, taken_until = EXCLUDED.taken_until, "
                "written_by = EXCLUDED.written_by, hidden_until = EXCLUDED.hidden_until, "
                "receipt = EXCLUDED.receipt, deliveries = EXCLUDED.deliveries, "
                "dead_letter_reason = EXCLUDED.dead_letter_reason, max_deliveries = EXCLUDED.max_deliveries"
            )
        if expiries:
            out.append(
                "UPDATE outrig_entries AS e SET expires_at = v.x::float8 FROM (VALUES "
                f"{', '.join(expiries)}) AS v (space, id, x) WHERE e.space = v.space AND e.id = v.id"
            )
        if takes:
            out.append(
                "UPDATE outrig_entries AS e SET taken_by = v.r, taken_position = v.p::integer, "
                f"taken_until = v.u::float8 FROM (VALUES {', '.join(takes)}) AS v (space, id, r, p, u) "
                "WHERE e.space = v.space AND e.id = v.id"
            )
        if visibilities:
            out.append(
                "UPDATE outrig_entries AS e SET hidden_until = v.h::float8, receipt = v.r::bigint, "
                "deliveries = v.d::integer, dead_letter_reason = v.x::text, max_deliveries = v.m::integer "
                f"FROM (VALUES {', '.join(visibilities)}) AS v (space, id, h, r, d, x, m) "
                "WHERE e.space = v.space AND e.id = v.id"
            )
        out += self._dead_letter_script()
        deleted_registrations: list[str] = []
        put_registrations: list[str] = []
        registration_updates: list[str] = []
        for (space, registration_id), state in self.registrations.items():
            if state[0] == "delete":
                deleted_registrations.append(_row(space, registration_id))
            elif state[0] == "put":
                row = state[1]
                put_registrations.append(
                    _row(space, registration_id, row["expires_at"], row["templates"], row["sequence"])
                )
            else:
                columns = state[1]
                registration_updates.append(
                    _row(
                        space,
                        registration_id,
                        "expires_at" in columns,
                        columns.get("expires_at"),
                        columns.get("sequence", 0),
                    )
                )
        if deleted_registrations:
            out.append(
                "DELETE FROM outrig_registrations AS g USING (VALUES "
                f"{', '.join(deleted_registrations)}) AS v (space, id) "
                "WHERE g.space = v.space AND g.id = v.id"
            )
        if put_registrations:
            out.append(
                "INSERT INTO outrig_registrations (space, id, expires_at, templates, sequence) VALUES "
                f"{', '.join(put_registrations)} ON CONFLICT (space, id) DO UPDATE SET "
                "expires_at = EXCLUDED.expires_at, templates = EXCLUDED.templates, "
                "sequence = EXCLUDED.sequence"
            )
        if registration_updates:
            out.append(
                "UPDATE outrig_registrations AS g SET "
                "expires_at = CASE WHEN v.e THEN v.x::float8 ELSE g.expires_at END, "
                "sequence = greatest(g.sequence, v.q) FROM (VALUES "
                f"{', '.join(registration_updates)}) AS v (space, id, e, x, q) "
                "WHERE g.space = v.space AND g.id = v.id"
            )
        if self.types:
            rows = ", ".join(
                _row(space, name, supertypes) for (space, name), supertypes in self.types.items()
            )
            out.append(
                f"INSERT INTO outrig_types (space, name, supertypes) VALUES {rows} "
                "ON CONFLICT (space, name) DO NOTHING"
            )
        if self.next_ids:
            rows = ", ".join(_row(space, mark) for space, mark in self.next_ids.items())
            out.append(
                f"UPDATE outrig_spaces AS s SET next_id = greatest(s.next_id, v.n) FROM (VALUES {rows}) "
                "AS v (space, n) WHERE s.space = v.space"
            )
        if self.requests:
            rows = ", ".join(_row(*answer) for answer in self.requests.values())
            out.append(
                "INSERT INTO outrig_requests "
                "(id, space, kind, expires_at, first_id, count, lease_expires_at, granted) "
                f"VALUES {rows} ON CONFLICT (id) DO UPDATE SET space = EXCLUDED.space, "
                "kind = EXCLUDED.kind, expires_at = EXCLUDED.expires_at, first_id = EXCLUDED.first_id, "
                "count = EXCLUDED.count, lease_expires_at = EXCLUDED.lease_expires_at, "
                "granted = EXCLUDED.granted"
            )
        out += self._transaction_script()
        out += self._log_script()
        if self.prune_before is not None and spaces:
            owned, before = literal(list(spaces)), literal(self.prune_before)
            out.append(
                "DELETE FROM outrig_entries WHERE (space, id) IN (SELECT space, id FROM outrig_entries "
                f"WHERE space = ANY({owned}) AND taken_until <= {before} LIMIT {PRUNE_LIMIT})"
            )
            out.append(
                f"DELETE FROM outrig_requests WHERE id IN (SELECT id FROM outrig_requests WHERE space = "
                f"ANY({owned}) AND expires_at <= {before} ORDER BY expires_at LIMIT {PRUNE_LIMIT})"
            )
        return out

    def _dead_letter_script(self) -> list[str]:
        """Dead letters on their way (a row), and those taken in (its deletion)."""
        out: list[str] = []
        moving, taken = _kept_and_gone(self.dead_letters)
        taken += [_row(*key) for key in self._dead_replaced if self.dead_letters[key] is not None]
        if taken:
            out.append(
                "DELETE FROM outrig_dead_letters AS l USING (VALUES "
                f"{', '.join(taken)}) AS v (source, id) WHERE l.source = v.source AND l.id = v.id"
            )
        if moving:
            out.append(
                "INSERT INTO outrig_dead_letters "
                "(source, id, dead_space, expires_at, payload, deliveries, reason, moved_at) "
                "SELECT v.s, v.i, v.d, v.x::float8, v.p, v.n, v.r, v.m::float8 FROM (VALUES "
                f"{', '.join(moving)}) AS v (s, i, d, x, p, n, r, m) ON CONFLICT (source, id) DO NOTHING"
            )
        return out

    def _log_script(self) -> list[str]:
        """The change log: one DELETE per space trimmed, then the batch's changes as one INSERT
        (a seq written again, after a batch undone in memory, replaces its row), the epochs and
        heads as one UPDATE of outrig_spaces, and the durable subscriptions."""
        out = [
            f"DELETE FROM outrig_changes WHERE space = {literal(space)} AND seq < {oldest}"
            for space, oldest in self.trims.items()
        ]
        if self.log:
            rows = ", ".join(_row(*key, *rest) for key, rest in self.log.items())
            out.append(
                "INSERT INTO outrig_changes "
                "(space, seq, kind, entry_id, at, transaction, visible_at, payload) "
                "SELECT v.s, v.q, v.k, v.i, v.a::float8, v.t, v.v::float8, v.p::bytea FROM (VALUES "
                f"{rows}) AS v (s, q, k, i, a, t, v, p) ON CONFLICT (space, seq) DO UPDATE SET "
                "kind = EXCLUDED.kind, entry_id = EXCLUDED.entry_id, at = EXCLUDED.at, "
                "transaction = EXCLUDED.transaction, visible_at = EXCLUDED.visible_at, "
                "payload = EXCLUDED.payload"
            )
        marked = sorted({*self.log_epochs, *self.log_heads})
        if marked:
            rows = ", ".join(
                _row(space, self.log_epochs.get(space), self.log_heads.get(space, 0)) for space in marked
            )
            out.append(
                "UPDATE outrig_spaces AS s SET change_epoch = coalesce(v.e::bigint, s.change_epoch), "
                f"change_head = greatest(s.change_head, v.h) FROM (VALUES {rows}) AS v (space, e, h) "
                "WHERE s.space = v.space"
            )
        kept, gone = _kept_and_gone(self.subscriptions)
        if gone:
            out.append(
                "DELETE FROM outrig_change_subscriptions AS d USING (VALUES "
                f"{', '.join(gone)}) AS v (space, name) WHERE d.space = v.space AND d.name = v.name"
            )
        if kept:
            out.append(
                "INSERT INTO outrig_change_subscriptions (space, name, position) VALUES "
                f"{', '.join(kept)} ON CONFLICT (space, name) DO UPDATE SET position = EXCLUDED.position"
            )
        return out

    def _transaction_script(self) -> list[str]:
        """Open transactions' rows, locks and ends; after the entries' statements, so that an end
        deletes the rows its transaction wrote that did not commit (a commit's puts clear their
        written_by first)."""
        out: list[str] = []
        opened, expiries, ended = [], [], []
        for (space, transaction), state in self.transactions.items():
            if state[0] == "open":
                opened.append(_row(space, transaction, state[1]))
            elif state[0] == "expiry":
                expiries.append(_row(space, transaction, state[1]))
            else:
                ended.append(_row(space, transaction))
        if opened:
            out.append(
                "INSERT INTO outrig_open_transactions (space, id, expires_at, recorded) SELECT v.s, v.i, "
                f"v.x::float8, true FROM (VALUES {', '.join(opened)}) AS v (s, i, x) "
                "ON CONFLICT (space, id) DO UPDATE SET expires_at = EXCLUDED.expires_at, recorded = true"
            )
        if expiries:
            out.append(
                "UPDATE outrig_open_transactions AS t SET expires_at = v.x::float8 FROM (VALUES "
                f"{', '.join(expiries)}) AS v (space, id, x) WHERE t.space = v.space AND t.id = v.id"
            )
        locked, unlocked = _kept_and_gone(self.locks)
        if locked:
            out.append(
                "INSERT INTO outrig_transaction_locks "
                "(space, transaction, entry, mode, request_id, position, request_until) "
                "SELECT v.s, v.t, v.e, v.m, v.r, v.p::integer, v.u::float8 "
                f"FROM (VALUES {', '.join(locked)}) "
                "AS v (s, t, e, m, r, p, u) ON CONFLICT (space, transaction, entry) DO UPDATE SET "
                "mode = EXCLUDED.mode, request_id = EXCLUDED.request_id, position = EXCLUDED.position, "
                "request_until = EXCLUDED.request_until"
            )
        if unlocked:
            out.append(
                "DELETE FROM outrig_transaction_locks AS l USING (VALUES "
                f"{', '.join(unlocked)}) AS v (space, transaction, entry) "
                "WHERE l.space = v.space AND l.transaction = v.transaction AND l.entry = v.entry"
            )
        if ended:
            values = f"(VALUES {', '.join(ended)}) AS v (space, id)"
            out.append(
                f"DELETE FROM outrig_open_transactions AS t USING {values} "
                "WHERE t.space = v.space AND t.id = v.id"
            )
            out.append(
                f"DELETE FROM outrig_transaction_locks AS l USING {values} "
                "WHERE l.space = v.space AND l.transaction = v.id"
            )
            out.append(
                f"DELETE FROM outrig_entries AS e USING {values} "
                "WHERE e.space = v.space AND e.written_by = v.id"
            )
        return out


def literal(value: Any) -> str:
    """`value` as an SQL literal. Strings are quoted as standard strings (the connection sets
    standard_conforming_strings, so a backslash is itself; a quote is doubled) and never hold a NUL
    (text cannot: protocol/codec refuses one in a request id; names are checked); bytes go as hex."""
    if value is None:
        return "NULL"
    if value is True:
        return "TRUE"
    if value is False:
        return "FALSE"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isfinite(value):
            return repr(value)
        return (
            "'NaN'::float8"
            if math.isnan(value)
            else ("'Infinity'::float8" if value > 0 else "'-Infinity'::float8")
        )
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    if isinstance(value, bytes | bytearray | memoryview):
        return "'\\x" + bytes(value).hex() + "'::bytea"
    if isinstance(value, list | tuple):
        return "ARRAY[" + ", ".join(literal(item) for item in value) + "]::text[]"
    raise TypeError(f"no SQL literal for {type(value).__name__}")


def _row(*values: Any) -> str:
    return "(" + ", ".join(literal(value) for value in values) + ")"


def _kept_and_gone(table: Mapping[tuple[Any, ...], tuple[Any, ...] | None]) -> tuple[list[str], list[str]]:
    """The rows of a table of key -> the rest of its row (None: deleted): (rows, deleted keys)."""
    kept = [_row(*key, *rest) for key, rest in table.items() if rest is not None]
    gone = [_row(*key) for key, rest in table.items() if rest is None]
    return kept, gone


# A put's delivery state: visible, no delivery pending, never delivered, not a dead letter.
_VISIBLE: tuple[Any, ...] = (None, None, 0, None, 0)


class _Change:
    """One operation's records, the spaces it changes with the epoch of this server's ownership
    of each when the change was made, and its caller's future. An operation changes one space as
    a rule (a prune: none; a dead letter put into a dead-letter space served here: two)."""

    __slots__ = ("epochs", "records", "waiter")

    def __init__(
        self, records: Sequence[Record], waiter: asyncio.Future[None] | None, epochs: dict[str, int]
    ) -> None:
        self.records = records
        spaces = {space for record in records if (space := record_spaces(record)) is not None}
        self.epochs: dict[str, int | None] = {space: epochs.get(space) for space in sorted(spaces)}
        self.waiter = waiter

    def current(self, epochs: dict[str, int]) -> bool:
        """Whether every space of the change is still this server's under its change's epoch."""
        return all(epochs.get(space) == epoch for space, epoch in self.epochs.items())


class _Batch:
    """Changes committed together, the rows they touch (`keys`), and, once sent, the connection,
    the deadline's timer and how the write went."""

    __slots__ = (
        "changes",
        "connection",
        "error",
        "finished",
        "future",
        "keys",
        "overdue",
        "refused",
        "written",
    )

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.changes: list[_Change] = []
        self.keys: set[tuple[Any, ...]] = set()
        self.future: asyncio.Future[None] = loop.create_future()
        self.future.add_done_callback(_retrieve)
        self.connection: psycopg.AsyncConnection[Any] | None = None
        self.overdue: asyncio.TimerHandle | None = None
        self.finished = False
        self.error: Exception | None = None
        self.written: list[_Change] = []
        self.refused: list[_Change] = []


# The row a record touches, for telling batches apart that may be in flight together.
_ALL = ("all",)  # a prune may touch any row of the owned spaces


def record_keys(record: Record) -> tuple[tuple[Any, ...], ...]:
    """The rows a record touches. A transaction's records share its key: its end deletes its
    locks and uncommitted writes, so it must not overtake them."""
    kind = record[0]
    if kind in ("put", "delete", "take", "entry_expiry", "visibility"):
        return (("entry", record[1], record[2]),)
    if kind == "dead_letter":
        return (("entry", record[1], record[2]), ("dead_letter", record[1], record[2]))
    if kind == "dead_letter_taken":
        return (("dead_letter", record[2], record[3]),)
    if kind == "written":
        return (("entry", record[1], record[2]), ("transaction", record[1], record[6]))
    if kind in ("register", "unregister", "registration_expiry", "sequence"):
        return (("registration", record[1], record[2]),)
    if kind == "type":
        return (("type", record[1], record[2]),)
    if kind == "next_id":
        return (("space", record[1]),)
    if kind in ("change", "change_trim", "change_epoch", "change_head"):
        # One key for a space's whole log: its batches commit in the order of their seqs, so that
        # the rows in the database are always a gap-free run (a trim never overtaken by an older
        # append, a later change never committed without an earlier one).
        return (("log", record[1]),)
    if kind in ("subscription", "subscription_delete"):
        return (("subscription", record[1], record[2]),)
    if kind == "request":
        return (("request", record[1]),)
    if kind in ("transaction", "transaction_expiry", "transaction_end", "lock", "unlock"):
        return (("transaction", record[1], record[2]),)
    return (_ALL,)


def _fence(changes: Iterable[_Change]) -> dict[str, int | None]:
    """The spaces `changes` change, with the epoch each was made under (the same for all: a
    change under another epoch is stale and refused before)."""
    return {space: epoch for change in changes for space, epoch in change.epochs.items()}


def _retrieve(future: asyncio.Future[None]) -> None:
    if not future.cancelled():
        future.exception()


def _resolve(future: asyncio.Future[None] | None, error: BaseException | None) -> None:
    if future is None or future.done():
        return
    if error is None:
        future.set_result(None)
    else:
        future.set_exception(error)


class PgJournal:
    """The group committer of one owner server (see the module docstring)."""

    waits = True  # a server that may lose a space acknowledges only what is committed
    keeps_changes = True  # it records the change log (migration 5, memory/journal.py)

    def __init__(
        self,
        connect: Callable[[], Awaitable[psycopg.AsyncConnection[Any]]],
        query: Callable[[str, Sequence[Any]], Awaitable[list[tuple[Any, ...]]]],
        server_id: str,
        epochs: dict[str, int],
        dump: Callable[[object], bytes | memoryview],
        where: str,
        *,
        deadline: float,
        probe_interval: float = 1.0,
    ) -> None:
        """`connect()` opens the journal's own connection; `query` runs a read elsewhere;
        `epochs` is the live map of the spaces this server owns to the epoch of each; `where`
        names the database in messages (host and port, never a password); a batch that takes
        longer than `deadline` seconds counts as failed."""
        self._connect = connect
        self._query = query
        self._server_id = server_id
        self._epochs = epochs
        self._dump = dump
        self._where = where
        self._deadline = deadline
        self._probe_interval = probe_interval
        self._free: list[psycopg.AsyncConnection[Any]] = []  # connections not writing now
        self._loop: asyncio.AbstractEventLoop | None = None
        self._open: _Batch | None = None
        self._writing: list[_Batch] = []  # in flight, oldest first: acknowledged in that order
        self._idle = asyncio.Event()
        self._idle.set()
        self._failure: StoreUnavailableError | None = None
        self._probing: asyncio.Task[None] | None = None
        self._closing = False
        self.batches = 0
        self.overlapped = 0  # batches sent while another was in flight
        self.operations = 0
        self.commit_seconds = 0.0
        self.on_batch: Callable[[float, int], None] | None = None
        # Told of spaces whose epoch moved on (lost), and of a failure after which memory cannot
        # be trusted (every space must be dropped).
        self.on_lost: Callable[[set[str]], None] = lambda spaces: None
        self.on_uncertain: Callable[[], None] = lambda: None

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._free = [await self._connect() for _ in range(IN_FLIGHT)]

    @property
    def healthy(self) -> bool:
        return self._failure is None

    # ------------------------------------------------------------------ the loop side

    def check(self) -> None:
        if self._failure is not None:
            raise self._failure

    def submit(
        self, records: Sequence[Record], undo: Callable[[], None] | None = None, *, own: bool = True
    ) -> tuple[asyncio.Future[None], asyncio.Future[None] | None]:
        self.check()
        loop = self._loop
        assert loop is not None, "start() the journal first"
        batch = self._open
        if batch is None:
            batch = self._open = _Batch(loop)
            self._idle.clear()
            loop.call_soon(self._begin)  # after this loop iteration: its changes join
        waiter: asyncio.Future[None] | None = loop.create_future() if own else None
        batch.changes.append(_Change(records, waiter, self._epochs))
        batch.keys.update(key for record in records for key in record_keys(record))
        return batch.future, waiter

    def note(self, records: Sequence[Record]) -> None:
        if self._failure is None:
            self.submit(records, own=False)

    def keepalive(self) -> None:
        """While idle, send an empty batch: a connection that died while nothing was written is
        noticed (and replaced) before a change depends on it."""
        if self._failure is None and self._open is None and not self._writing and self._loop:
            self.submit([], own=False)

    @property
    def pending(self) -> asyncio.Future[None] | None:
        batch = self._open or (self._writing[-1] if self._writing else None)
        return None if batch is None else batch.future

    def discard(self, spaces: set[str], error: BaseException) -> None:
        """Changes of `spaces` not yet being written fail with `error` (the spaces are dropped)."""
        batch = self._open
        if batch is None:
            return
        kept = []
        for change in batch.changes:
            if spaces.isdisjoint(change.epochs):
                kept.append(change)
            else:
                _resolve(change.waiter, error)
        batch.changes = kept

    def _discard_all(self, spaces: set[str], error: BaseException) -> None:
        """`discard`, and the other spaces of every change it discards (in `spaces` afterwards)."""
        batch = self._open
        while batch is not None:
            more = {
                space
                for change in batch.changes
                if not spaces.isdisjoint(change.epochs)
                for space in change.epochs
            } - spaces
            if not more:
                break
            spaces |= more
        self.discard(spaces, error)

    def _begin(self) -> None:
        """Send the open batch, if a connection is free and it touches no row of a batch in
        flight: a batch may then be written while the one before it waits for its commit
        (PostgreSQL runs the two in two backends at once), yet a change never commits before one
        it depends on, since both would touch the same row (a take and the write it takes, a
        renewal and the entry it renews). Acknowledgements keep the order of the batches."""
        batch = self._open
        if batch is None or self._failure is not None or not self._free:
            return
        if self._writing and (
            len(self._writing) >= IN_FLIGHT
            or _ALL in batch.keys
            or any(_ALL in other.keys or not batch.keys.isdisjoint(other.keys) for other in self._writing)
        ):
            return  # sent when the batch in flight is done
        loop = self._loop
        assert loop is not None
        self._open = None
        if self._writing:
            self.overlapped += 1
        batch.connection = self._free.pop()
        self._writing.append(batch)
        loop.create_task(self._write(batch), name="outrig-pg-batch")
        # The deadline is a timer, not a wrapping task: one hop less per batch, and an overdue
        # batch fails at once, not when psycopg has finished cancelling its query (which over a
        # silent link takes a timeout of its own).
        batch.overdue = loop.call_later(self._deadline, self._abandon, batch)

    def _abandon(self, batch: _Batch) -> None:
        """The batch has taken longer than the deadline: it failed (its outcome is unknown)."""
        if batch in self._writing:
            self._fail(batch, TimeoutError(f"no answer within {self._deadline:.1f} s"))

    async def _write(self, batch: _Batch) -> None:
        started = time.perf_counter()
        try:
            batch.written, batch.refused = await self._commit(batch)
        except Exception as err:  # psycopg.Error, OSError: the outcome is unknown
            batch.error = err
        if batch not in self._writing:
            return  # abandoned at its deadline, or failed with another batch: failed already
        if batch.overdue is not None:
            batch.overdue.cancel()
        batch.finished = True
        if batch.error is not None:
            self._fail(batch, batch.error)
            return
        assert batch.connection is not None
        self._free.append(batch.connection)
        seconds = time.perf_counter() - started
        self.commit_seconds += seconds
        if self.on_batch is not None:
            self.on_batch(seconds, sum(len(change.records) for change in batch.written))
        while self._writing and self._writing[0].finished:
            self._acknowledge(self._writing.pop(0))
        if self._open is not None:
            self._begin()
        elif not self._writing:
            self._idle.set()

    def _acknowledge(self, batch: _Batch) -> None:
        self.batches += 1
        self.operations += len(batch.written)
        if batch.refused:
            # A refused change of two spaces was applied in the memory of both: both go.
            lost = {space for change in batch.refused for space in change.epochs}
            refusal = NotOwnerError(
                f"this server no longer owns space(s) {', '.join(sorted(lost))}: nothing of the "
                "change was acknowledged; retry (the SDK does) and it reaches the new owner"
            )
            for change in batch.refused:
                _resolve(change.waiter, refusal)
            self._discard_all(lost, refusal)
            self.on_lost(lost)
        for change in batch.written:
            _resolve(change.waiter, None)
        _resolve(batch.future, None)

    async def _commit(self, batch: _Batch) -> tuple[list[_Change], list[_Change]]:
        """Write the batch's changes whose epoch is still current: (written, refused).

        The usual case is one round trip: BEGIN, the fence (`outrig_fence`, which fails the
        transaction if any space has moved on), the statements and COMMIT, pipelined. Only when
        the fence fails does a second transaction find which spaces were lost and write the rest.
        """
        connection = batch.connection
        if connection is None or connection.closed:
            raise psycopg.OperationalError("no connection")
        epochs = self._epochs
        written: list[_Change] = []
        refused: list[_Change] = []
        for change in batch.changes:  # made under an epoch this server has since left: stale
            (written if change.current(epochs) else refused).append(change)
        try:
            await self._transaction(connection, written, _fence(written))
        except psycopg.Error as err:
            if err.sqlstate != FENCED:
                raise
        else:
            return written, refused
        # Fenced: which spaces are still this server's?
        spaces = sorted({space for change in written for space in change.epochs})
        cursor = await connection.execute(
            "SELECT space, epoch FROM outrig_spaces WHERE space = ANY(%s) AND owner = %s",
            (spaces, self._server_id),
        )
        current = dict(await cursor.fetchall())
        kept: list[_Change] = []
        for change in written:
            (kept if change.current(current) else refused).append(change)
        await self._transaction(connection, kept, _fence(kept))
        return kept, refused

    async def _transaction(
        self,
        connection: psycopg.AsyncConnection[Any],
        changes: list[_Change],
        fence: dict[str, int | None],
    ) -> None:
        """BEGIN, the fence, the changes and COMMIT as one simple query: one round trip."""
        folded = Changes(self._dump)
        for change in changes:
            folded.add(change.records)
        spaces = sorted(str(space) for space in fence)
        statements = ["BEGIN"]
        if spaces:
            statements.append(
                f"SELECT outrig_fence({literal(self._server_id)}, {literal(spaces)}, "
                f"ARRAY[{', '.join(str(fence[space]) for space in spaces)}]::bigint[])"
            )
        statements += folded.script(list(self._epochs))
        statements.append("COMMIT")
        try:
            await connection.execute(";\n".join(statements).encode())
        except psycopg.Error:
            if not connection.closed:
                with contextlib.suppress(psycopg.Error):
                    await connection.execute(b"ROLLBACK")
            raise

    def _fail(self, batch: _Batch, err: Exception) -> None:
        """`batch` failed: so do every batch in flight with it and the open one (their outcome
        is as uncertain), and the connections go."""
        later, self._open = self._open, None
        in_flight, self._writing = self._writing, []
        failed = [*in_flight, *([later] if later is not None else [])]
        if batch not in failed:
            failed.insert(0, batch)
        for each in in_flight:
            if each.overdue is not None:
                each.overdue.cancel()
        uncertain = any(change.records for each in failed for change in each.changes)
        self._failure = StoreUnavailableError(
            f"PostgreSQL at {self._where} did not confirm a commit ({type(err).__name__}: {err}); "
            "nothing of it was acknowledged. This server serves no space until it reaches the "
            "database again."
        )
        if uncertain:
            log.error("commit to PostgreSQL at %s failed; dropping every space: %s", self._where, err)
        else:
            log.warning("the journal's link to PostgreSQL at %s failed while idle: %s", self._where, err)
        for each in failed:
            for change in each.changes:
                _resolve(change.waiter, self._failure)
            _resolve(each.future, self._failure)
        self._idle.set()
        if uncertain:  # memory may differ from the database: forget it all
            self.on_uncertain()
        connections = [*self._free, *(each.connection for each in in_flight if each.connection is not None)]
        self._free = []
        for connection in connections:
            self._spawn_close(connection)
        if not self._closing:
            assert self._loop is not None
            self._probing = self._loop.create_task(self._probe(), name="outrig-pg-probe")

    def _spawn_close(self, connection: psycopg.AsyncConnection[Any]) -> None:
        async def close() -> None:
            with contextlib.suppress(Exception):
                await connection.close()

        assert self._loop is not None
        self._loop.create_task(close())

    async def _connect_and_probe(self) -> list[psycopg.AsyncConnection[Any]]:
        connections = []
        try:
            for _ in range(IN_FLIGHT):
                connection = await self._connect()
                connections.append(connection)
                await connection.execute("SELECT 1")
        except BaseException:
            for connection in connections:
                self._spawn_close(connection)
            raise
        return connections

    async def _probe(self) -> None:
        while self._failure is not None and not self._closing:
            await asyncio.sleep(self._probe_interval)
            try:
                connections = await within(self._deadline, self._connect_and_probe())
            except Exception as err:
                log.warning("PostgreSQL at %s still unreachable: %s", self._where, err)
                continue
            self._free = connections
            self._failure = None
            log.warning("PostgreSQL at %s reachable again: serving resumes", self._where)

    # ------------------------------------------------------------------ reads

    async def write_answer(self, request_id: str, until: float) -> WriteAnswer:  # the id is the key here
        ((first_id, count, expires_at, granted),) = await self._query(
            "SELECT first_id, count, lease_expires_at, granted FROM outrig_requests WHERE id = %s",
            (request_id,),
        )
        return first_id, count, expires_at, granted

    async def taken_rows(self, request_id: str, until: float) -> list[TakenRow]:
        rows = await self._query(
            "SELECT id, expires_at, payload FROM ("
            "SELECT id, expires_at, payload, taken_position AS p FROM outrig_entries WHERE taken_by = %s "
            "UNION ALL SELECT e.id, e.expires_at, e.payload, l.position FROM outrig_transaction_locks l "
            "JOIN outrig_entries e ON e.space = l.space AND e.id = l.entry WHERE l.request_id = %s"
            ") AS taken ORDER BY p",
            (request_id, request_id),
        )
        return [(entry_id, expires_at, bytes(payload)) for entry_id, expires_at, payload in rows]

    async def close(self) -> None:
        """Write what is queued, then stop and close the connection."""
        self._closing = True
        if self._open is not None and not self._writing and self._failure is None:
            self._begin()
        await self._idle.wait()
        if self._probing is not None:
            self._probing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._probing
        for connection in self._free:
            with contextlib.suppress(Exception):
                await connection.close()
        self._free = []
        if self.batches:
            log.info(
                "journal closed: %d batches, %d operations (%.1f per batch), %.2f ms per batch",
                self.batches,
                self.operations,
                self.operations / self.batches,
                1000 * self.commit_seconds / self.batches,
            )
