"""The PostgreSQL backend's schema, and its versioned migrations, applied at start.

Several outrig servers share one database, so a migration runs under a transaction-scoped
advisory lock: the first server to start applies what is missing, the others wait and find it
done. `outrig_schema` records each applied version; a database newer than this server knows is
refused (IncompatibleStoreError), as an old binary must not write a newer layout.

Version 1 was the stateless layout (every match in SQL); version 2 is the owner layout: the
database is the record of spaces served from memory by their owners, plus the ownership itself
(`outrig_spaces`), the tier's servers (`outrig_servers`) and its peer secret (`outrig_tier`);
version 3 records open transactions as they go, so that a new owner rebuilds them, and fences
with advisory locks (`FENCE_CLASS`) instead of row locks; version 4 keeps an entry's delivery
state (a take with an acknowledgement deadline, a delayed write: docs/work-queues.md) and the
dead letters on their way from one space to another (`outrig_dead_letters`); version 5 the
change log of each space (`outrig_changes`), its durable subscriptions
(`outrig_change_subscriptions`) and the log's epoch and head (`outrig_spaces`).
Each payload column holds an entry's encoding, as the embedded store keeps it.
"""

from __future__ import annotations

from typing import Final

from outrig.service.exceptions import IncompatibleStoreError

__all__ = ["FENCE_CLASS", "MIGRATIONS", "SCHEMA_VERSION", "migrate"]

# An arbitrary, fixed key for pg_advisory_xact_lock: "outrig" in ASCII.
_LOCK_KEY: Final = 0x6F7574726967
# The first key of the fence's advisory locks ("outr" in ASCII; the second is hashtext(space)),
# put into migration 3's outrig_fence from here (so it never changes: databases hold it) and
# taken by Ownership's claims. A two-key lock never collides with _LOCK_KEY's.
FENCE_CLASS: Final = 0x6F757472

MIGRATIONS: Final[tuple[tuple[int, str], ...]] = (
    (
        1,
        """
        -- What each space holds, for its quotas, kept in step with its entries' rows in the same
        -- database transactions: a quota check sums a few rows instead of counting entries. The
        -- counts are split over 16 shards, each change adding to a random one, so that concurrent
        -- writes and takes of one space do not all queue on one row lock (held until commit).
        CREATE TABLE outrig_space_counts (
            space text NOT NULL,
            shard smallint NOT NULL,
            entries bigint NOT NULL DEFAULT 0,
            bytes bigint NOT NULL DEFAULT 0,
            PRIMARY KEY (space, shard)
        );
        CREATE TABLE outrig_types (
            space text NOT NULL,
            name text NOT NULL,
            supertypes text[] NOT NULL,
            PRIMARY KEY (space, name)
        );
        -- Lease ids (entries, registrations, transactions) come from one sequence shared by all
        -- servers, so they are unique across the database and never reused.
        CREATE SEQUENCE outrig_ids;
        CREATE TABLE outrig_entries (
            space text NOT NULL,
            id bigint NOT NULL,
            arrival bigint NOT NULL,
            lineage text[] NOT NULL,
            fields jsonb NOT NULL,
            payload bytea NOT NULL,
            size integer NOT NULL,
            expires_at double precision,           -- epoch seconds; NULL: forever
            written_by bigint,                     -- a transaction's write, invisible until commit
            taken_by bigint,                       -- a transaction's take, undone by abort
            taken_at double precision,             -- taken: kept a while for other servers' events
            PRIMARY KEY (space, id)
        );
        -- Transactions: their state stays a while after they end, to answer a repeated commit.
        CREATE TABLE outrig_transactions (
            space text NOT NULL,
            id bigint NOT NULL,
            expires_at double precision,
            state smallint NOT NULL DEFAULT 0,     -- 0 active, 1 committed, 2 aborted
            ended_at double precision,
            PRIMARY KEY (space, id)
        );
        -- Notify registrations: their leases live here, their streams on the server attached.
        CREATE TABLE outrig_registrations (
            space text NOT NULL,
            id bigint NOT NULL,
            expires_at double precision,
            templates bytea NOT NULL,
            sequence bigint NOT NULL DEFAULT 0,    -- a resumed stream numbers from here + 2^31
            transaction bigint,
            PRIMARY KEY (space, id)
        );
        -- Request ids, shared by all servers: a retry through any server gets the first reply.
        CREATE TABLE outrig_requests (
            id text PRIMARY KEY,
            space text NOT NULL,
            kind text NOT NULL,
            expires_at double precision NOT NULL,
            result jsonb NOT NULL,
            payloads bytea[]
        );
        CREATE INDEX outrig_requests_expiry ON outrig_requests (expires_at);
        -- Read locks: several transactions may hold one on the same entry.
        CREATE TABLE outrig_read_locks (
            space text NOT NULL,
            entry_id bigint NOT NULL,
            txn bigint NOT NULL,
            PRIMARY KEY (space, entry_id, txn)
        );
        CREATE INDEX outrig_read_locks_txn ON outrig_read_locks (space, txn);
        CREATE INDEX outrig_entries_written_by ON outrig_entries (space, written_by)
            WHERE written_by IS NOT NULL;
        CREATE INDEX outrig_entries_taken_by ON outrig_entries (space, taken_by) WHERE taken_by IS NOT NULL;
        CREATE INDEX outrig_entries_lineage ON outrig_entries USING gin (lineage);
        CREATE INDEX outrig_entries_fields ON outrig_entries USING gin (fields jsonb_path_ops);
        CREATE INDEX outrig_entries_arrival ON outrig_entries (space, arrival);
        CREATE INDEX outrig_entries_expiry ON outrig_entries (expires_at)
            WHERE expires_at IS NOT NULL AND taken_at IS NULL;
        CREATE INDEX outrig_entries_taken ON outrig_entries (taken_at) WHERE taken_at IS NOT NULL;
        """,
    ),
    (
        2,
        """
        -- The owner design: each space is served from memory by one server, its owner, and
        -- recorded here. Matching never runs in SQL, so the match indexes and the per-transaction
        -- columns of version 1 go; what a version 1 database held is kept: its committed entries
        -- (a transaction's uncommitted writes are dropped and its takes put back: it aborted),
        -- its types and its registrations. Request ids start afresh (their answers' layout changed).
        --
        -- outrig_spaces: each space's id high-water mark (ids below next_id may have been handed
        -- out; reserved in blocks) and its ownership: the owning server's id, the epoch, bumped at
        -- every claim, and when the ownership ends unless renewed (the database's clock). Every
        -- batch an owner commits first locks its spaces' rows FOR SHARE and checks the epochs are
        -- still its own: a claim (an UPDATE) waits for it, and a batch after a claim fails.
        CREATE TABLE outrig_spaces (
            space text PRIMARY KEY,
            next_id bigint NOT NULL DEFAULT 1,
            owner text,
            epoch bigint NOT NULL DEFAULT 0,
            owner_expires_at timestamptz,
            created_at timestamptz NOT NULL DEFAULT now()
        );
        -- The fence of every batch: lock the rows of the batch's spaces FOR SHARE (a claim waits
        -- for the batch to commit) and fail the transaction, with SQLSTATE OR001, unless each
        -- is still owned by `me` under the epoch the batch's changes were made in.
        CREATE FUNCTION outrig_fence(me text, spaces text[], epochs bigint[]) RETURNS void
        LANGUAGE plpgsql AS $fence$
        DECLARE
            held integer;
        BEGIN
            SELECT count(*) INTO held FROM (
                SELECT 1 FROM outrig_spaces s
                JOIN unnest(spaces, epochs) AS f (space, epoch) ON s.space = f.space AND s.epoch = f.epoch
                WHERE s.owner = me FOR SHARE OF s
            ) AS locked;
            IF held <> cardinality(spaces) THEN
                RAISE EXCEPTION 'outrig: a space of this batch is no longer owned by %', me
                    USING ERRCODE = 'OR001';
            END IF;
        END
        $fence$;
        -- The servers of the tier: where each is reached, how many spaces it owns, and its last
        -- heartbeat (a server whose heartbeat is older than an owner lease is not live).
        CREATE TABLE outrig_servers (
            id text PRIMARY KEY,
            address text NOT NULL,
            started_at timestamptz NOT NULL DEFAULT now(),
            heartbeat_at timestamptz NOT NULL DEFAULT now(),
            spaces integer NOT NULL DEFAULT 0,
            draining boolean NOT NULL DEFAULT false
        );
        -- Settings of the whole tier: the secret servers present to each other on forwarded calls.
        CREATE TABLE outrig_tier (key text PRIMARY KEY, value text NOT NULL);
        INSERT INTO outrig_tier (key, value) VALUES (
            'peer_secret',
            encode(sha256(gen_random_uuid()::text::bytea || random()::text::bytea), 'hex')
        );

        DELETE FROM outrig_entries WHERE written_by IS NOT NULL OR taken_at IS NOT NULL;
        DROP INDEX outrig_entries_written_by, outrig_entries_taken_by, outrig_entries_lineage,
            outrig_entries_fields, outrig_entries_expiry, outrig_entries_taken;
        ALTER TABLE outrig_entries
            DROP COLUMN lineage, DROP COLUMN fields, DROP COLUMN size, DROP COLUMN written_by,
            DROP COLUMN taken_by, DROP COLUMN taken_at;
        -- A take with a request id keeps its rows, marked, to answer the take's retry.
        ALTER TABLE outrig_entries ADD COLUMN taken_by text, ADD COLUMN taken_position integer;
        CREATE INDEX outrig_entries_taken_by ON outrig_entries (taken_by) WHERE taken_by IS NOT NULL;
        DELETE FROM outrig_registrations WHERE transaction IS NOT NULL;
        ALTER TABLE outrig_registrations DROP COLUMN transaction;
        DROP TABLE outrig_requests;
        CREATE TABLE outrig_requests (
            id text PRIMARY KEY,
            space text NOT NULL,
            kind text NOT NULL,
            expires_at double precision NOT NULL,
            first_id bigint,
            count integer NOT NULL,
            lease_expires_at double precision,
            granted double precision
        );
        CREATE INDEX outrig_requests_space ON outrig_requests (space, expires_at);
        INSERT INTO outrig_spaces (space, next_id)
            SELECT space, (SELECT last_value + 1 FROM outrig_ids)
            FROM (SELECT space FROM outrig_entries UNION SELECT space FROM outrig_registrations
                  UNION SELECT space FROM outrig_types) AS named;
        DROP TABLE outrig_transactions, outrig_read_locks, outrig_space_counts;
        -- Transactions open on their space's owner (they live in its memory): a server that
        -- claims the space knows they existed, and that they aborted with the hand-over.
        CREATE TABLE outrig_open_transactions (
            space text NOT NULL,
            id bigint NOT NULL,
            PRIMARY KEY (space, id)
        );
        DROP SEQUENCE outrig_ids;
        """,
    ),
    (
        3,
        f"""
        -- Open transactions are recorded as they go, so that a server claiming a space rebuilds
        -- them: their lease (expires_at), their writes (outrig_entries.written_by: invisible to
        -- all but the transaction until it commits), and their takes and read locks
        -- (outrig_transaction_locks; a take's request id and position answer its retry). A row
        -- of version 2 (`recorded` false) was kept in its owner's memory only: it aborted with it.
        ALTER TABLE outrig_open_transactions
            ADD COLUMN expires_at double precision,
            ADD COLUMN recorded boolean NOT NULL DEFAULT false;
        ALTER TABLE outrig_entries ADD COLUMN written_by bigint;
        CREATE INDEX outrig_entries_written_by ON outrig_entries (space, written_by)
            WHERE written_by IS NOT NULL;
        CREATE TABLE outrig_transaction_locks (
            space text NOT NULL,
            transaction bigint NOT NULL,
            entry bigint NOT NULL,
            mode text NOT NULL CHECK (mode IN ('take', 'read')),
            request_id text,
            position integer,
            request_until double precision,
            PRIMARY KEY (space, transaction, entry)
        );
        -- A take's request id lives on the rows it took, with the end of its window (taken_until:
        -- a retry until then gets the same entries; the prune deletes the rows after it), instead
        -- of a row of its own in outrig_requests: two row writes fewer per take. Rows of version 2
        -- get their request's window, and its row goes.
        ALTER TABLE outrig_entries ADD COLUMN taken_until double precision;
        UPDATE outrig_entries AS e SET taken_until = r.expires_at FROM outrig_requests AS r
            WHERE r.id = e.taken_by;
        UPDATE outrig_entries SET taken_until = 0 WHERE taken_by IS NOT NULL AND taken_until IS NULL;
        DELETE FROM outrig_requests WHERE kind = 'take';
        CREATE INDEX outrig_entries_taken_until ON outrig_entries (taken_until)
            WHERE taken_until IS NOT NULL;
        CREATE INDEX outrig_transaction_locks_request ON outrig_transaction_locks (request_id)
            WHERE request_id IS NOT NULL;
        -- The fence takes a shared advisory lock per space (key: FENCE_CLASS, hashtext(space))
        -- instead of a FOR SHARE lock of its row: a row lock is a write to the row, with its WAL
        -- record (and, held by two batches at once, a MultiXact; bench/fence.py: 0.8 of the WAL). A
        -- claim or hand-over takes the same key exclusively before it changes the row, so it
        -- waits for every batch that passed the fence, and every batch after it sees its epoch.
        CREATE OR REPLACE FUNCTION outrig_fence(me text, spaces text[], epochs bigint[]) RETURNS void
        LANGUAGE plpgsql AS $fence$
        BEGIN
            -- One space at a time, in the order given (the journal sorts them): its lock, then
            -- its row's owner and epoch (a lookup by primary key: a batch names one space, as a
            -- rule, and this costs less than half of a join over unnest: bench/fence.py).
            FOR i IN 1 .. cardinality(spaces) LOOP
                PERFORM pg_advisory_xact_lock_shared({FENCE_CLASS}, hashtext(spaces[i]));
                PERFORM 1 FROM outrig_spaces
                    WHERE space = spaces[i] AND owner = me AND epoch = epochs[i];
                IF NOT FOUND THEN
                    RAISE EXCEPTION 'outrig: space % of this batch is no longer owned by %', spaces[i], me
                        USING ERRCODE = 'OR001';
                END IF;
            END LOOP;
        END
        $fence$;
        """,
    ),
    (
        4,
        """
        -- An entry's delivery state (the `visibility` record, backends/memory/journal.py): hidden
        -- until (epoch seconds; NULL: visible), the receipt of its pending delivery (NULL: none),
        -- how often it has been delivered, and why it is in a dead-letter space (NULL: it is not).
        -- A hidden row is still the space's, loaded with the rest: only its owner's memory hides it.
        ALTER TABLE outrig_entries
            ADD COLUMN hidden_until double precision,
            ADD COLUMN receipt bigint,
            ADD COLUMN deliveries integer NOT NULL DEFAULT 0,
            ADD COLUMN dead_letter_reason text;
        -- Dead letters between two spaces: an entry that reached its max_deliveries leaves its
        -- space in the batch that deletes its row there, and lands here unless the same server
        -- owns the dead-letter space too (then it is put there in that same batch). The
        -- dead-letter space's owner takes it in (a new id of its own) and deletes the row in one
        -- batch fenced by its own ownership: at its load, or within a third of a lease.
        CREATE TABLE outrig_dead_letters (
            source text NOT NULL,
            id bigint NOT NULL,
            dead_space text NOT NULL,
            expires_at double precision,
            payload bytea NOT NULL,
            deliveries integer NOT NULL,
            reason text NOT NULL,
            moved_at double precision NOT NULL,
            PRIMARY KEY (source, id)
        );
        CREATE INDEX outrig_dead_letters_dead_space ON outrig_dead_letters (dead_space, moved_at);
        """,
    ),
    (
        5,
        """
        -- A change log per space (docs/notifications.md; the `change` records of
        -- backends/memory/journal.py): every change of a space's stored set, numbered by `seq`
        -- (1, 2, 3 ... gap-free within the log's epoch), in the batch that makes the change.
        -- `payload` is NULL for a write: its entry's row (outrig_entries, same space and id), or
        -- the later change of that id that removed it, holds it; every other kind removed the
        -- entry and keeps its payload here. Retention deletes the oldest rows (a `change_trim`:
        -- one DELETE of seq < oldest per space and batch).
        CREATE TABLE outrig_changes (
            space text NOT NULL,
            seq bigint NOT NULL,
            kind text NOT NULL CHECK (kind IN ('write', 'take', 'expire', 'cancel', 'purge', 'dead')),
            entry_id bigint NOT NULL,
            at double precision NOT NULL,          -- epoch seconds
            transaction bigint NOT NULL DEFAULT 0, -- the committing transaction; 0: none
            visible_at double precision,           -- a delayed write's time; NULL: at once
            payload bytea,
            PRIMARY KEY (space, seq)
        );
        -- Durable subscriptions: a name per space and the position (a seq) it has acknowledged.
        CREATE TABLE outrig_change_subscriptions (
            space text NOT NULL,
            name text NOT NULL,
            position bigint NOT NULL,
            PRIMARY KEY (space, name)
        );
        -- The log's epoch (a random 63-bit number made with its first change; NULL: no log yet),
        -- so that cursors stay valid across restarts and takeovers, and its head when no row is
        -- left to say it (every change trimmed by age: the `change_head` record).
        ALTER TABLE outrig_spaces
            ADD COLUMN change_epoch bigint,
            ADD COLUMN change_head bigint NOT NULL DEFAULT 0;
        -- A pending delivery's take's own max_deliveries (0: none, the space's setting applies),
        -- so that it still applies after a restart or a takeover.
        ALTER TABLE outrig_entries ADD COLUMN max_deliveries integer NOT NULL DEFAULT 0;
        """,
    ),
)

SCHEMA_VERSION: Final = MIGRATIONS[-1][0]


async def migrate(connection: object) -> list[int]:
    """Apply the migrations this database lacks (psycopg AsyncConnection); the versions applied."""
    from psycopg import AsyncConnection

    assert isinstance(connection, AsyncConnection)
    applied: list[int] = []
    async with connection.transaction():
        await connection.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK_KEY,))
        await connection.execute(
            "CREATE TABLE IF NOT EXISTS outrig_schema (version integer PRIMARY KEY, applied_at timestamptz "
            "NOT NULL DEFAULT now())"
        )
        cursor = await connection.execute("SELECT coalesce(max(version), 0) FROM outrig_schema")
        row = await cursor.fetchone()
        current = int(row[0]) if row else 0
        if current > SCHEMA_VERSION:
            raise IncompatibleStoreError(
                f"the database has outrig schema version {current}; this server knows up to "
                f"{SCHEMA_VERSION}: upgrade the server"
            )
        for version, sql in MIGRATIONS:
            if version > current:
                await connection.execute(sql)
                await connection.execute("INSERT INTO outrig_schema (version) VALUES (%s)", (version,))
                applied.append(version)
    return applied
