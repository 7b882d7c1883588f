"""A space's owner that is cut off from PostgreSQL, or paused beyond its lease, acknowledges
nothing on its own once another server has taken the space over: real `outrig serve --backend
postgres` processes on the session's PostgreSQL, a real TCP proxy (tests/tcp_proxy.py) between
one server and the database, real SIGSTOP and SIGCONT.

The clients write unique keys with retry_deadline=0, so that every acknowledgement is the answer
of the server they reached (its own, or the owner's it forwarded the call to) and never a retry
of another attempt. What they were told is checked against the space at its new owner at the end:
every acknowledged key is there (none lost: an acknowledgement from the old owner's memory after
the takeover would be a write fenced off by the database, hence absent), and no key is there
twice.

- cut: A, the owner, reaches PostgreSQL through the proxy; the link is blackholed between two of
  A's commits while a client goes on writing through A; B or C takes over; A's calls fail until
  the link heals, then A forwards them (its late commits reach the database and are fenced off).
- paused: the owner is SIGSTOPped with writes in flight and a take parked on it, another server
  claims the space, the owner is continued: the writes it answers are at the new owner, the take
  ends with an error, and after that every write and read through it is the new owner's.
- cut inside commits: cuts that fall while the owner's commits are in flight do not hold up the
  takeover (no session of the old owner is left in a transaction with the lock of the space's
  row: a held-up claim fails the test naming the sessions that hold it up).
"""

from __future__ import annotations

import functools
import signal
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

import psycopg
import pytest

import outrig

from ..conftest import ServerProcess, start_server
from ..polling import wait_for_waiters, wait_until
from ..postgres_server import PostgresServer
from ..tcp_proxy import TcpProxy

OWNER_LEASE = 1.5
SPACE = "fenced"


@dataclass
class Key(outrig.Entry, type_name="fencing.Key"):
    uid: str | None = None
    writer: int | None = None
    pad: str | None = None  # bulk, to make a commit longer


@dataclass
class Bait(outrig.Entry, type_name="fencing.Bait"):
    n: int | None = None


@dataclass(frozen=True)
class Call:
    uid: str
    sent: float  # time.monotonic() before the call
    ended: float  # and after it returned or raised
    error: str = ""  # "" for an acknowledged write


@dataclass
class Writer:
    """A thread writing unique keys through one server with retry_deadline=0, recording each call."""

    address: str
    number: int
    space: str = SPACE
    pad: int = 0  # characters of bulk in each key written
    calls: list[Call] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None
    unexpected: list[str] = field(default_factory=list)
    going: threading.Event = field(default_factory=threading.Event)
    between: threading.Event = field(default_factory=threading.Event)  # paused between two calls
    in_call_since: float | None = None  # time.monotonic() the call in flight was sent at

    def start(self) -> Writer:
        self.going.set()
        self.thread = threading.Thread(target=self._run, name=f"writer-{self.number}", daemon=True)
        self.thread.start()
        return self

    def pause(self) -> None:
        """Stop between two calls: return once the call in flight (if any) has ended."""
        self.going.clear()
        assert self.between.wait(30), f"writer {self.number} through {self.address} hangs in a call"

    def resume(self) -> None:
        self.between.clear()
        self.going.set()

    def _run(self) -> None:
        with outrig.connect(self.address, space=self.space, retry_deadline=0) as space:
            sequence = 0
            while not self.stop.is_set():
                if not self.going.is_set():
                    self.between.set()
                    while not (self.going.wait(0.05) or self.stop.is_set()):
                        pass
                    continue
                uid = f"w{self.number}-{sequence}"
                sequence += 1
                sent = self.in_call_since = time.monotonic()
                try:
                    key = Key(uid=uid, writer=self.number, pad="x" * self.pad if self.pad else None)
                    space.write(key, lease=outrig.FOREVER)
                except outrig.UnavailableError as err:  # refused, or unable to store: not done
                    self.calls.append(Call(uid, sent, time.monotonic(), repr(err)))
                    # A refusal comes at once: pace the loop a little rather than spin on it.
                    self.stop.wait(0.02)
                except Exception as err:  # anything else is a finding of its own
                    self.calls.append(Call(uid, sent, time.monotonic(), repr(err)))
                    self.unexpected.append(repr(err))
                else:
                    self.calls.append(Call(uid, sent, time.monotonic()))
                finally:
                    self.in_call_since = None

    def hung(self, seconds: float) -> bool:
        """Whether the call in flight has been for more than `seconds`."""
        since = self.in_call_since
        return since is not None and time.monotonic() - since > seconds

    def acknowledged(self, after: float = float("-inf")) -> list[Call]:
        return [call for call in list(self.calls) if not call.error and call.sent > after]

    def ended(self, after: float) -> list[Call]:
        return [call for call in list(self.calls) if call.sent > after]

    def finish(self, timeout: float = 30.0) -> None:
        self.stop.set()
        assert self.thread is not None
        self.thread.join(timeout)
        assert not self.thread.is_alive(), f"writer {self.number} through {self.address} hangs in a call"


@pytest.fixture
def database(postgres: PostgresServer) -> str:
    return postgres.new_database("f")


@pytest.fixture
def started() -> Iterator[list[ServerProcess]]:
    """The servers a test starts; each is stopped (continued first, if paused) after it."""
    servers: list[ServerProcess] = []
    yield servers
    for server in servers:
        if server.process.poll() is None:
            server.process.send_signal(signal.SIGCONT)
        server.stop()


def serve(started: list[ServerProcess], dsn: str, *, metrics: bool = False) -> ServerProcess:
    server = start_server(
        "--backend", "postgres", "--dsn", dsn, "--owner-lease", str(OWNER_LEASE), metrics=metrics
    )
    started.append(server)
    return server


def placement(address: str, space: str = SPACE) -> outrig.Placement | None:
    """The space's placement as the server at `address` reads it from the database."""
    with outrig.connect(address, space=space, retry_deadline=2.0) as admin:
        return next((p for p in admin.list_spaces() if p.space == space), None)


SEEN: list[outrig.Placement | None] = []  # the placements owned_by_other saw, for failure messages


def owned_by_other(address: str, former: str, space: str = SPACE) -> outrig.Placement | None:
    """The space's placement, read through `address`, once a live server other than the server
    id `former` owns it."""
    found = placement(address, space)
    SEEN.append(found)
    if found is None or found.owner in ("", former) or found.expires_in is None:
        return None
    return found


def keys_at(address: str, space_name: str = SPACE) -> list[str]:
    with outrig.connect(address, space=space_name, retry_deadline=10.0) as space:
        return [key.uid for key in space.contents(Key()) if isinstance(key, Key) and key.uid is not None]


def check_nothing_lost(
    writers: list[Writer], present: list[str], logs: list[str], also_written: frozenset[str] = frozenset()
) -> int:
    """Every acknowledged key (the writers' and `also_written`) is present once; the number
    the writers had acknowledged."""
    acknowledged = {call.uid for writer in writers for call in writer.acknowledged()}
    attempted = {call.uid for writer in writers for call in writer.calls} | also_written
    acknowledged |= also_written
    lost = acknowledged - set(present)
    assert not lost, (
        f"{len(lost)} of {len(acknowledged)} acknowledged writes are absent at the new owner: "
        f"{sorted(lost)[:20]} (logs {logs})"
    )
    twice = [uid for uid, n in Counter(present).items() if n > 1]
    assert not twice, f"{len(twice)} keys are stored twice: {twice[:20]}"
    unknown = set(present) - attempted
    assert not unknown, f"keys never written are present: {sorted(unknown)[:20]}"
    unexpected = [err for writer in writers for err in writer.unexpected]
    assert not unexpected, f"writes failed other than with UnavailableError: {unexpected[:5]}"
    return len(acknowledged)


# The sessions holding up a lock waiter: each blocker of a session waiting for a lock, with how
# long its transaction has been open, if it waits for its client (ClientRead) in a transaction open
# for longer than the lease: a session PostgreSQL should have ended.
_BLOCKERS = (
    "SELECT b.pid, b.state, b.wait_event, round(extract(epoch FROM now() - b.xact_start)::numeric, 1), "
    "left(b.query, 60){end} FROM pg_stat_activity b WHERE b.pid IN ("
    "SELECT unnest(pg_blocking_pids(w.pid)) FROM pg_stat_activity w "
    "WHERE w.datname = current_database() AND w.wait_event_type = 'Lock') "
    "AND b.wait_event = 'ClientRead' AND now() - b.xact_start > make_interval(secs => %s)"
)


def _held_up(dsn: str, lease: float) -> str:
    """The sessions waiting for a lock, and the ones holding them up, as pg_stat_activity shows
    them (pid, state, wait event, seconds in the state or transaction, query)."""
    with psycopg.connect(dsn, autocommit=True) as monitor:
        waiting = monitor.execute(
            "SELECT pid, state, wait_event, round(extract(epoch FROM now() - state_change)::numeric, 1), "
            "left(query, 60) FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock'"
        ).fetchall()
        blocking = monitor.execute(_BLOCKERS.format(end=""), (lease,)).fetchall()
    return f"waiting {'; '.join(map(str, waiting))}, held up by {'; '.join(map(str, blocking))}"


def test_an_owner_cut_from_postgres_acknowledges_nothing_after_a_takeover(
    postgres: PostgresServer, database: str, started: list[ServerProcess]
) -> None:
    with TcpProxy("127.0.0.1", postgres.port) as proxy:
        a = serve(started, f"postgresql://outrig@{proxy.address}/{database}")
        with outrig.connect(a.address, space=SPACE, retry_deadline=5.0) as space:
            space.write(Key(uid="first"), lease=outrig.FOREVER)  # A claims the space: the only server
            assert space.locate() == outrig.Location(a.address, True)
        first = placement(a.address)
        assert first is not None and first.address == a.address and first.here
        b = serve(started, postgres.dsn(database))
        c = serve(started, postgres.dsn(database))
        logs = [str(s.log) for s in (a, b, c)]

        writer = Writer(a.address, 0).start()
        wait_until(lambda: len(writer.acknowledged()) >= 30, 20, what="writes acknowledged by A")
        seen = placement(b.address)  # B (and C) know A is the owner, and forward to it
        assert seen is not None and (seen.owner, seen.address, seen.here) == (first.owner, a.address, False)

        # The cut falls between two of A's commits (the last test cuts inside commits); the
        # writer goes on at once, so that A's next commits go into the cut link.
        writer.pause()
        proxy.cut(mode="blackhole")
        cut = time.monotonic()
        writer.resume()
        taken_over = wait_until(
            lambda: owned_by_other(b.address, first.owner),
            20,
            what=lambda: f"B or C taking the space over from A (last seen {SEEN[-1:]}, logs {logs})",
        )
        takeover = time.monotonic()
        assert taken_over.address in (b.address, c.address) and taken_over.epoch > first.epoch
        # A goes on being asked, cut off: its calls must fail (or be forwarded, had it a way to),
        # or, if A waits on PostgreSQL with no bound of its own, hang (until the restore).
        wait_until(
            lambda: len(writer.ended(takeover)) >= 6 or writer.hung(4 * OWNER_LEASE),
            30,
            what="calls through A after the takeover",
        )
        during = writer.ended(takeover)
        hung = writer.hung(4 * OWNER_LEASE)
        proxy.restore()
        restored = time.monotonic()
        # Healed, the bytes A sent into the cut reach PostgreSQL (late commits, which the new
        # epoch fences off), A learns it lost the space and forwards: acknowledgements again,
        # the new owner's.
        wait_until(
            lambda: len(writer.acknowledged(restored)) >= 20,
            30,
            what="writes through A forwarded after restore",
        )
        writer.finish()
        # Nothing was taken, so every acknowledged write is in the space at the new owner.
        present = keys_at(b.address)
        final = placement(b.address)
        assert final is not None and final.address == taken_over.address, f"the space moved again: {final}"
        with outrig.connect(a.address, space=SPACE, retry_deadline=10.0) as via_a:
            assert via_a.locate() == outrig.Location(taken_over.address, False)
        acknowledged = check_nothing_lost([writer], present, logs, frozenset({"first"}))
        acked_during = [call for call in during if not call.error]
        slowest = max(writer.ended(cut), key=lambda call: call.ended - call.sent)
        print(
            f"cut owner: takeover {takeover - cut:.2f} s after the cut by {taken_over.address} (epoch "
            f"{taken_over.epoch}); {acknowledged} acknowledged through A, {len(during)} calls after "
            f"the takeover and before the restore ({len(acked_during)} acknowledged), "
            f"{len(writer.acknowledged(restored))} after the restore; {len(present)} keys present"
            + (f"; a call through A hung during the cut: {slowest}" if hung else "")
        )


def test_a_paused_owner_acknowledges_nothing_on_its_own_after_a_takeover(
    postgres: PostgresServer, database: str, started: list[ServerProcess]
) -> None:
    dsn = postgres.dsn(database)
    servers = [serve(started, dsn, metrics=True) for _ in range(3)]
    logs = [str(s.log) for s in servers]
    with outrig.connect(servers[0].address, space=SPACE, retry_deadline=5.0) as space:
        space.write(Key(uid="first"), lease=outrig.FOREVER)
    first = wait_until(lambda: owned_by_other(servers[0].address, ""), 10, what="an owner of the space")
    owner = next(s for s in servers if s.address == first.address)
    other = next(s for s in servers if s is not owner)

    # Calls in flight to the owner when it stops: writers looping on it, and a take parked on it
    # for an entry that does not exist yet.
    writers = [Writer(owner.address, n).start() for n in range(4)]
    taken: list[object] = []

    def take() -> None:
        with outrig.connect(owner.address, space=SPACE, retry_deadline=0) as space:
            try:
                taken.append(space.take(Bait(), timeout=60.0))
            except Exception as err:
                taken.append(err)

    taker = threading.Thread(target=take, name="parked-take", daemon=True)
    taker.start()
    wait_for_waiters(owner, SPACE, 1)
    wait_until(lambda: sum(len(w.acknowledged()) for w in writers) >= 40, 20, what="writes acknowledged")

    owner.process.send_signal(signal.SIGSTOP)
    stopped = time.monotonic()
    try:
        taken_over = wait_until(
            lambda: owned_by_other(other.address, first.owner),
            4 * OWNER_LEASE + 2,
            what=lambda: f"another server claiming the space ({_held_up(dsn, OWNER_LEASE)}; {logs})",
        )
        claimed = time.monotonic()
        assert taken_over.address != owner.address and taken_over.epoch > first.epoch
        with outrig.connect(taken_over.address, space=SPACE, retry_deadline=5.0) as space:
            space.write(Bait(n=1), lease=outrig.FOREVER)  # what the parked take waits for, at the new owner
    finally:
        owner.process.send_signal(signal.SIGCONT)
    continued = time.monotonic()

    # The parked take ends with an error (the old owner dropped the space), or with the bait taken
    # at the new owner; never with nothing, nor with a bait the new owner still holds.
    taker.join(30)
    assert not taker.is_alive(), "the take parked on the old owner did not end"
    with outrig.connect(taken_over.address, space=SPACE, retry_deadline=5.0) as space:
        baits = space.count(Bait())
    assert isinstance(taken[0], outrig.UnavailableError) or (taken[0] == Bait(n=1) and baits == 0), (
        f"the take parked on the paused owner answered {taken[0]!r} with {baits} bait at the new owner"
    )

    # Calls through the old owner after SIGCONT: refused, then forwarded to the new owner.
    wait_until(
        lambda: sum(len(w.acknowledged(continued)) for w in writers) >= 20,
        30,
        what="writes through the old owner acknowledged (forwarded) after SIGCONT",
    )
    for writer in writers:
        writer.finish()
    in_flight = [c for w in writers for c in w.calls if c.sent < stopped < c.ended]
    assert in_flight, "no write was in flight to the owner when it stopped"
    present = keys_at(taken_over.address)
    check_nothing_lost(writers, present, logs, frozenset({"first"}))

    # A write through the old owner is at the new owner; reads through either agree.
    with outrig.connect(owner.address, space=SPACE, retry_deadline=10.0) as via_old:
        via_old.write(Key(uid="late"), lease=outrig.FOREVER)
        assert via_old.locate() == outrig.Location(taken_over.address, False)
        through_old = sorted(key.uid for key in via_old.contents(Key()) if isinstance(key, Key) and key.uid)
        count_old = via_old.count(Key())
    with outrig.connect(taken_over.address, space=SPACE, retry_deadline=10.0) as via_new:
        assert via_new.read_nowait(Key(uid="late")) == Key(uid="late")
        through_new = sorted(key.uid for key in via_new.contents(Key()) if isinstance(key, Key) and key.uid)
        assert via_new.count(Key()) == count_old == len(through_new)
    assert through_old == through_new == sorted([*present, "late"])
    refused_after = [c for w in writers for c in w.ended(continued) if c.error]
    print(
        f"paused owner: claimed {claimed - stopped:.2f} s after SIGSTOP by {taken_over.address} (epoch "
        f"{taken_over.epoch}); {len(in_flight)} writes in flight at the pause "
        f"({sum(not c.error for c in in_flight)} acknowledged); {len(refused_after)} refused and "
        f"{sum(len(w.acknowledged(continued)) for w in writers)} acknowledged after SIGCONT; "
        f"parked take: {taken[0]!r}; {len(present)} keys present"
    )


def _acknowledged_at_least(writers: list[Writer], n: int) -> bool:
    return sum(len(writer.acknowledged()) for writer in writers) >= n


def _stalled(dsn: str, space: str, took: list[float]) -> str:
    return (
        f"a takeover of {space!r} from A, cut inside its commits ({_held_up(dsn, OWNER_LEASE)}; "
        f"earlier takeovers after {took} s)"
    )


CYCLES = 6  # cuts tried; each one inside a commit of A's with some probability
WRITERS = 8  # through A: commits in flight nearly all the time
PAD = 32_000  # characters of bulk in each key: a commit long enough for a cut to fall inside


def test_a_cut_inside_a_commit_does_not_hold_up_the_takeover(
    postgres: PostgresServer, database: str, started: list[ServerProcess]
) -> None:
    """Cut A's link while its commits are in flight (WRITERS writers through it), up to CYCLES
    times on a fresh space each: every time, another server takes the space over within a few
    leases. (When a batch was a pipeline, BEGIN, outrig_fence and its statements went ahead of
    the COMMIT: a cut between them left A's session in the transaction with the FOR SHARE lock
    of the space's row, where idle_in_transaction_session_timeout does not apply, and one of
    the first few cuts held up the takeover until the link healed. A batch is one simple query
    now, which PostgreSQL runs only once it has all of it.)"""
    dsn = postgres.dsn(database)
    with TcpProxy("127.0.0.1", postgres.port) as proxy:
        a = serve(started, f"postgresql://outrig@{proxy.address}/{database}")
        b = serve(started, dsn)
        serve(started, dsn)
        logs = [str(s.log) for s in started]
        took: list[float] = []
        for cycle in range(CYCLES):
            space_name = f"held-{cycle}"
            with outrig.connect(a.address, space=space_name, retry_deadline=10.0) as space:
                space.write(Key(uid="first"), lease=outrig.FOREVER)
            first = placement(a.address, space_name)
            assert first is not None
            if first.address != a.address:
                continue  # claimed by another server: no owner to cut off this time
            writers = [Writer(a.address, n, space=space_name, pad=PAD).start() for n in range(WRITERS)]
            wait_until(functools.partial(_acknowledged_at_least, writers, 40), 20, what="writes by A")
            proxy.cut(mode="blackhole")
            cut = time.monotonic()
            try:
                wait_until(
                    functools.partial(owned_by_other, b.address, first.owner, space_name),
                    4 * OWNER_LEASE + 2,
                    what=functools.partial(_stalled, dsn, space_name, took),
                )
                took.append(time.monotonic() - cut)
            finally:
                proxy.restore()
                for writer in writers:
                    writer.finish()
            check_nothing_lost(writers, keys_at(b.address, space_name), logs, frozenset({"first"}))
        print(f"cuts inside commits: {len(took)} takeovers, in {[round(t, 2) for t in took]} s")
        assert len(took) >= CYCLES // 2, f"A claimed too few of the spaces to test anything: {took}"
