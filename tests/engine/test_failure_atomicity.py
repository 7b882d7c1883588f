"""Failure atomicity: a fault in any internal step of the engine leaves the space as it was.

Issue 17: a lease the lease queue could not file raised after the entry was filed in the indexes,
and from then on every take returned that one entry. This machine runs random sequences of writes,
reads and takes (at once, and parked as blocked calls), renewals, cancellations, notify
registrations, transactions, puts back of cancelled takes and time passing. Each step arms one
fault: the n-th call, in that step, of one of the engine's internal steps raises. Those are the
lease queue's add and discard (and their batch forms), the waiter and registration indexes' add,
remove and candidates, and the entry indexes' insert and remove (and their batch forms). The
fault fires once: the undo of a failed step is not itself made to fail.

Against a naive reference (a dict of entries with their leases and locks, the transactions,
registrations and parked calls), after every step:

- the engine's indexes agree with each other and with its lease queue (white box);
- no entry is ever both taken and present, and nothing is taken twice;
- a step that raised (the fault, or a refusal) changed nothing observable, and handed nothing
  out: the live entries with their leases, locks and order, the transactions, registrations,
  parked calls and the next id are as before;
- every take, read, hand-off to a parked call, event and transaction outcome is one the
  reference allows, and takes and reads find every entry they may (the oldest first);
- in runs where no fault has fired, no parked call waits while a free entry it wants is present.

Durations beyond the maximum lease (and NaN) are drawn too: they must be refused, changing nothing.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from outrig.service.engine import (
    MAX_LEASE_SECONDS,
    FakeClock,
    NewEntry,
    Registration,
    SpaceEngine,
    SpaceSettings,
    StoredEntry,
    Template,
    Transaction,
    TransactionOutcome,
    Waiter,
)
from outrig.service.engine.model import TransactionState
from outrig.service.exceptions import (
    InvalidArgumentError,
    LeaseNotFoundError,
    SpaceError,
    TransactionNotFoundError,
)

from ..field_values import value
from .test_space import contents, find

DEFAULT_LEASE = 4.0
HUGE = 1e308
# Types: B extends A. A template of A matches both; one of B only B.
LINEAGES = {"A": ("A",), "B": ("B", "A")}

# Mostly leases that are granted; a quarter that must be refused.
lease_st = st.sampled_from(
    [None, None, 1.0, 2.5, 5.0, 5.0, math.inf, MAX_LEASE_SECONDS, HUGE, MAX_LEASE_SECONDS + 1, math.nan]
)
entry_st = st.tuples(st.sampled_from(["A", "B"]), st.integers(0, 2))
template_st = st.tuples(st.sampled_from(["A", "A", "B"]), st.none() | st.integers(0, 2))
templates_st = st.lists(template_st, min_size=1, max_size=2)
# The n-th faultable call of the step raises; None: no fault this step.
fault_st = st.none() | st.integers(1, 4) | st.integers(1, 14)
pick_st = st.integers(0, 1 << 20)

TemplateSpec = tuple[str, int | None]


class InjectedFaultError(Exception):
    """What a faulty internal step raises."""


@dataclass(frozen=True)
class Step:
    """How a step went: it happened (`ok`, with its `result`), or raised `error`."""

    ok: bool
    result: Any
    error: Exception | None

    @property
    def refused(self) -> SpaceError | None:
        """The engine's refusal, if it raised one (not the injected fault)."""
        return self.error if isinstance(self.error, SpaceError) else None


# ---------------------------------------------------------------- fault injection


class Faults:
    """Wraps the engine's internal steps; the `armed`-th call after `arm` raises, once."""

    STEPS = {
        "_leases": ("add", "discard", "add_many", "discard_many"),
        "_waiters": ("add", "remove", "candidates"),
        "_registrations": ("add", "remove", "candidates"),
        "_index": ("insert", "remove", "insert_many", "remove_many"),
    }

    def __init__(self, space: SpaceEngine) -> None:
        self.armed: int | None = None
        self.calls = 0
        self.fired: str | None = None
        for owner_name, methods in self.STEPS.items():
            owner = getattr(space, owner_name)
            for method in methods:
                setattr(owner, method, self._wrap(f"{owner_name}.{method}", getattr(owner, method)))

    def _wrap(self, name: str, real: Callable[..., Any]) -> Callable[..., Any]:
        def step(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            if self.armed is not None and self.calls == self.armed:
                self.armed = None
                self.fired = name
                raise InjectedFaultError(name)
            return real(*args, **kwargs)

        return step

    def arm(self, at: int | None) -> None:
        self.armed, self.calls, self.fired = at, 0, None

    def disarm(self) -> None:
        self.armed = None


# ---------------------------------------------------------------- the white-box view


def live_txn(space: SpaceEngine, txn: Transaction | None, now: float) -> bool:
    return (
        txn is not None
        and txn.active
        and space._transactions.get(txn.id) is txn
        and (txn.expires_at is None or txn.expires_at > now)
    )


@dataclass(frozen=True)
class View:
    """What a client could tell of a space: what is live, as if every due lease had run out."""

    entries: dict[int, tuple[float | None, int, int | None, int | None, frozenset[int]]]
    order: dict[str, tuple[int, ...]]
    transactions: dict[int, float | None]
    registrations: dict[int, tuple[float | None, int]]
    waiters: frozenset[int]
    next_id: int


def view(space: SpaceEngine, now: float, wanting: Callable[[Waiter], bool]) -> View:
    entries = {}
    for entry_id, stored in space._entries.items():
        if stored.expires_at is not None and stored.expires_at <= now:
            continue
        lock = stored.lock
        writer = lock.writer if lock is not None else None
        if writer is not None and not live_txn(space, writer, now):
            continue  # a write of a transaction whose lease ran out: it aborted, as good as
        taker = lock.taker if lock is not None and live_txn(space, lock.taker, now) else None
        readers = frozenset(
            reader.id for reader in (lock.readers if lock is not None else ()) if live_txn(space, reader, now)
        )
        entries[entry_id] = (
            stored.expires_at,
            stored.arrival,
            None if writer is None else writer.id,
            None if taker is None else taker.id,
            readers,
        )
    by_type = space._index._by_type
    order = {type_name: tuple(i for i in bucket if i in entries) for type_name, bucket in by_type.items()}
    transactions = {
        txn.id: txn.expires_at for txn in space._transactions.values() if live_txn(space, txn, now)
    }
    registrations = {
        r.seq: (r.expires_at, r.sequence)
        for r in space._registration_by_id.values()
        if (r.expires_at is None or r.expires_at > now) and (r.txn is None or live_txn(space, r.txn, now))
    }
    waiters = frozenset(
        w.seq for w in space._waiters.all() if wanting(w) and (w.txn is None or live_txn(space, w.txn, now))
    )
    return View(
        entries, {k: v for k, v in order.items() if v}, transactions, registrations, waiters, space.next_id
    )


def check_indexes(space: SpaceEngine) -> None:
    """The engine's own structures agree: every filed entry is in every bucket it belongs to, in
    arrival order, and in no other; the lease queue holds exactly the finite leases; the lock
    count, the transactions' lock tables and the waiter tables match."""
    entries = space._entries
    expected_types: dict[str, list[int]] = {}
    expected_slots: dict[object, list[int]] = {}
    for entry_id, stored in sorted(entries.items(), key=lambda item: item[1].arrival):
        for type_name in stored.lineage:
            expected_types.setdefault(type_name, []).append(entry_id)
            for name, field_value in stored.fields.items():
                expected_slots.setdefault((type_name, name, field_value.key), []).append(entry_id)
    assert {t: list(b) for t, b in space._index._by_type.items()} == expected_types
    slots = {
        slot: [bucket.id] if isinstance(bucket, StoredEntry) else list(bucket)
        for slot, bucket in space._index.slot_buckets()
    }
    assert slots == expected_slots
    assert space._bytes == sum(stored.size for stored in entries.values())
    filed = {i: t for bucket in space._leases._buckets.values() for i, t in bucket.items()}
    leased = {i: s.expires_at for i, s in entries.items() if s.expires_at is not None}
    leased |= {i: t.expires_at for i, t in space._transactions.items() if t.expires_at is not None}
    leased |= {i: r.expires_at for i, r in space._registration_by_id.items() if r.expires_at is not None}
    assert filed == leased
    assert len(space._leases) == len(filed)
    locked = [stored for stored in entries.values() if stored.lock is not None]
    assert space._locked == len(locked)
    for stored in locked:
        lock = stored.lock
        assert lock is not None and not lock.empty()
        if lock.writer is not None:
            assert lock.writer.written.get(stored.id) is stored
        if lock.taker is not None:
            assert lock.taker.taken.get(stored.id) is stored
        for reader in lock.readers:
            assert reader.read_locked.get(stored.id) is stored
    for txn in space._transactions.values():
        for table, role in ((txn.written, "writer"), (txn.taken, "taker")):
            for entry_id, stored in table.items():
                assert entries.get(entry_id) is stored and getattr(stored.lock, role) is txn
        for entry_id, stored in txn.read_locked.items():
            assert entries.get(entry_id) is stored and stored.lock is not None and txn in stored.lock.readers
    waiters = {w.seq: w for w in space._waiters.all()}
    assert len(space._waiters) == len(waiters)
    assert space._by_seq == {seq: w for seq, w in waiters.items() if w.txn is not None}
    assert space._if_exists == {seq: w for seq, w in waiters.items() if w.if_exists}
    registrations = {r.seq: r for r in space._registrations.all()}
    assert registrations == space._registration_by_id
    assert len(space._registrations) == len(registrations)


# ---------------------------------------------------------------- the reference


@dataclass
class Ref:
    """An entry in the space, as the reference sees it."""

    stored: StoredEntry
    type_name: str
    k: int
    expires_at: float | None
    writer: int | None = None
    taker: int | None = None
    readers: set[int] = field(default_factory=set)


@dataclass
class Call:
    """A parked read or take, and what it was handed."""

    templates: list[TemplateSpec]
    take: bool
    txn: int | None
    if_exists: bool
    log: list[tuple[Any, ...]]
    waiter: Waiter | None = None
    wanted: bool = True  # False once its caller gave up (timed out, cancelled)

    def deliver(self, entries: list[StoredEntry]) -> bool:
        self.log.append(("deliver", self, list(entries), self.wanted))
        return self.wanted

    def wants(self) -> bool:
        return self.wanted


@dataclass
class Listener:
    """A notify registration, and the events it heard."""

    templates: list[TemplateSpec]
    txn: int | None
    expires_at: float | None
    log: list[tuple[Any, ...]]
    registration: Registration | None = None
    sequence: int = 0

    def on_event(self, sequence: int, stored: StoredEntry) -> None:
        self.log.append(("event", self, sequence, stored))

    def on_end(self) -> None:
        self.log.append(("end", self))


def matches(spec: TemplateSpec, ref: Ref) -> bool:
    type_name, k = spec
    return type_name in LINEAGES[ref.type_name] and (k is None or k == ref.k)


def usable(ref: Ref, take: bool, txn: int | None) -> bool:
    """Outrigger's lock table (engine/locks.py), for the reference."""
    if ref.taker is not None:
        return False
    if ref.writer is not None and ref.writer != txn:
        return False
    return not (take and ref.readers - {txn})


def engine_templates(specs: list[TemplateSpec]) -> list[Template]:
    return [Template(t, {} if k is None else {"k": value(k)}) for t, k in specs]


class FailureMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.clock = FakeClock()
        self.space = SpaceEngine("faults", SpaceSettings(default_lease=DEFAULT_LEASE), self.clock)
        self.faults = Faults(self.space)
        self.log: list[tuple[Any, ...]] = []
        self.space.on_expired = lambda entry_id: self.log.append(("expired", entry_id))
        self.space.on_transaction_end = lambda outcome: self.log.append(("outcome", outcome))
        self.present: dict[int, Ref] = {}
        self.taken: set[int] = set()  # taken for good: by a plain take, or a committed one
        self.taken_entries: dict[int, StoredEntry] = {}  # by plain takes: a cancelled call may put back
        self.gone: set[int] = set()  # left the space for any reason
        self.txns: dict[int, Transaction] = {}  # active, as far as the reference knows
        self.all_txns: list[Transaction] = []
        self.calls: dict[int, Call] = {}  # parked and wanting
        self.all_calls: list[Call] = []
        self.listeners: dict[int, Listener] = {}  # live registrations
        self.all_listeners: list[Listener] = []
        self.lease_ids: list[int] = []
        self.faulted = False  # a fault has fired in a step that went on: waiters may be owed
        self.step_events: list[tuple[Any, ...]] = []

    @initialize()
    def start(self) -> None:
        check_indexes(self.space)

    # ------------------------------------------------------------ helpers

    def now(self) -> float:
        return self.clock.time()

    def expiry(self, lease: float | None) -> float | None:
        duration = DEFAULT_LEASE if lease is None else lease
        return None if math.isinf(duration) else self.now() + duration

    @staticmethod
    def refused_lease(lease: float | None) -> bool:
        return lease is not None and (
            math.isnan(lease) or (math.isfinite(lease) and lease > MAX_LEASE_SECONDS)
        )

    def wanting(self, waiter: Waiter) -> bool:
        call = getattr(waiter.deliver, "__self__", None)
        return not isinstance(call, Call) or call.wanted

    def current_view(self) -> View:
        return view(self.space, self.now(), self.wanting)

    def run(self, fault: int | None, action: Callable[[], Any], *, partial: bool = False) -> Step:
        """Run `action` with a fault armed. One that raises (the fault, or a refusal) must have
        changed nothing and handed nothing out, unless `partial` (a reap: each lease it ends is
        all or nothing, not the batch). What the engine handed out goes to `step_events`."""
        before = self.current_view()
        self.log.clear()
        self.faults.arm(fault)
        error: Exception | None = None
        try:
            result = action()
        except (InjectedFaultError, SpaceError) as err:
            result, error = None, err
        finally:
            self.faults.disarm()
        self.step_events = list(self.log)
        self.log.clear()
        if error is not None:
            if not partial:
                assert self.step_events == [], f"a step that raised {error!r} handed out {self.step_events}"
                assert self.current_view() == before, f"{error!r} changed the space"
            check_indexes(self.space)
            return Step(False, None, error)
        if self.faults.fired is not None:
            self.faulted = True  # swallowed past a commit point: parked calls may be owed entries
        return Step(True, result, None)

    def pick(self, items: list[Any], pick: int) -> Any:
        return items[pick % len(items)]

    def eligible(self, specs: list[TemplateSpec], take: bool, txn: int | None) -> list[Ref]:
        found = [
            ref
            for ref in self.present.values()
            if any(matches(spec, ref) for spec in specs) and usable(ref, take, txn)
        ]
        return sorted(found, key=lambda ref: ref.stored.arrival)

    def claim(self, stored: StoredEntry, specs: list[TemplateSpec], take: bool, txn: int | None) -> None:
        """A take or read (under `txn`) got `stored`: it must have been allowed to; apply it."""
        assert stored.id not in self.taken, f"entry {stored.id} taken twice"
        ref = self.present.get(stored.id)
        assert ref is not None, f"entry {stored.id} was handed out but is not in the space"
        assert any(matches(spec, ref) for spec in specs)
        assert usable(ref, take, txn), f"entry {stored.id} is locked against this call"
        if txn is None:
            if take:
                self.leave(stored.id, taken=True)
                self.taken_entries[stored.id] = stored
        elif ref.writer == txn:
            if take:
                self.leave(stored.id)  # its own write, taken back: as if never written
        elif take:
            ref.taker = txn
            ref.readers.discard(txn)
        else:
            ref.readers.add(txn)

    def leave(self, entry_id: int, *, taken: bool = False) -> None:
        del self.present[entry_id]
        self.gone.add(entry_id)
        if taken:
            self.taken.add(entry_id)

    def end_txn(self, txn_id: int, commit: bool) -> None:
        """The reference's commit or abort."""
        self.txns.pop(txn_id, None)
        for entry_id, ref in list(self.present.items()):
            ref.readers.discard(txn_id)
            if ref.taker == txn_id:
                if commit:
                    self.leave(entry_id, taken=True)
                else:
                    ref.taker = None
            elif ref.writer == txn_id:
                if commit:
                    ref.writer = None
                else:
                    self.leave(entry_id)
        for seq, listener in list(self.listeners.items()):
            if listener.txn == txn_id:
                del self.listeners[seq]
        for seq, call in list(self.calls.items()):
            if call.txn == txn_id:
                del self.calls[seq]

    def expect_events(self, entries: list[StoredEntry], writer: int | None) -> None:
        """Check (and count) the events of a step: each listener that may hear an entry made
        visible in it, and only those, heard it once, numbered on from its last event."""
        heard = [e for e in self.step_events if e[0] == "event"]
        for _, listener, sequence, stored in heard:
            assert listener.registration is not None and listener.registration.seq in self.listeners
            ref = self.present.get(stored.id)
            wrote = any(stored is s for s in entries)
            assert wrote, f"event for entry {stored.id}, which this step did not make visible"
            assert writer is None or listener.txn == writer
            assert sequence == listener.sequence + 1
            listener.sequence = sequence
            if ref is not None:
                assert any(matches(spec, ref) for spec in listener.templates)
        if self.faulted:
            return
        wanted = {
            (listener.registration.seq, stored.id)
            for stored in entries
            for listener in self.listeners.values()
            if listener.registration is not None
            and (writer is None or listener.txn == writer)
            and any(matches(spec, self.ref_of(stored)) for spec in listener.templates)
        }
        got = {(listener.registration.seq, stored.id) for _, listener, _, stored in heard}
        assert got == wanted

    def ref_of(self, stored: StoredEntry) -> Ref:
        type_name = stored.type_name
        return Ref(stored, type_name, stored.fields["k"].data, stored.expires_at)  # type: ignore[arg-type]

    def settle_events(self, explicit: dict[int, bool] | None = None) -> None:
        """Apply what the engine handed out this step (other than events): hand-offs to parked
        calls, transaction outcomes, expiries, ended registrations; each must be allowed."""
        explicit = explicit or {}
        for event in self.step_events:
            kind = event[0]
            if kind == "deliver":
                _, call, entries, accepted = event
                assert call.waiter is not None
                seq = call.waiter.seq
                if not accepted:
                    continue  # it gave up: the engine undid whatever it claimed
                if entries:
                    assert seq in self.calls, f"call {seq} was handed {entries} but is not waiting"
                    assert len(entries) == 1
                    self.claim(entries[0], call.templates, call.take, call.txn)
                self.calls.pop(seq, None)  # handed something, or nothing (its wait ended)
            elif kind == "outcome":
                outcome: TransactionOutcome = event[1]
                txn = outcome.transaction
                committed = txn.state is TransactionState.COMMITTED
                if txn.id in explicit:
                    assert committed == explicit[txn.id]
                else:  # one the reference let run out of lease
                    assert txn.id not in self.txns and not committed
            elif kind == "expired":
                entry_id = event[1]
                assert entry_id in self.gone and entry_id not in self.present
            elif kind == "end":
                listener = event[1]
                assert listener.registration is not None
                assert listener.registration.seq not in self.listeners, "a live registration ended"

    # ------------------------------------------------------------ operations

    def under(self, pick: int | None) -> Transaction | None:
        """No transaction, or mostly an active one (sometimes one that has ended)."""
        if pick is None or not self.all_txns:
            return None
        active = [txn for txn in self.all_txns if txn.id in self.txns]
        return self.pick(active if active and pick % 4 else self.all_txns, pick // 4)

    @rule(
        batch=st.lists(entry_st, min_size=1, max_size=3),
        lease=lease_st,
        under=st.none() | pick_st,
        fault=fault_st,
    )
    def write(
        self, batch: list[tuple[str, int]], lease: float | None, under: int | None, fault: int | None
    ) -> None:
        txn = self.under(under)
        new = [NewEntry(t, LINEAGES[t][1:], {"k": value(k)}, None, 1) for t, k in batch]
        step = self.run(fault, lambda: self.space.write_entries(new, lease, txn))
        if self.refused_lease(lease):
            assert isinstance(step.refused, InvalidArgumentError), f"a lease of {lease} was not refused"
            return
        if isinstance(step.refused, TransactionNotFoundError):
            assert txn is not None and txn.id not in self.txns
            return
        if not step.ok:
            assert isinstance(step.error, InjectedFaultError), step.error
            return
        assert txn is None or txn.id in self.txns
        written, _ = step.result
        expires_at = self.expiry(lease)
        for stored, (type_name, k) in zip(written, batch, strict=True):
            assert stored.expires_at == expires_at and stored.id not in self.gone
            self.present[stored.id] = Ref(stored, type_name, k, expires_at, None if txn is None else txn.id)
            self.lease_ids.append(stored.id)
        self.expect_events(written, None if txn is None else txn.id)
        self.settle_events()

    def find(
        self,
        specs: list[TemplateSpec],
        take: bool,
        max_entries: int,
        txn: Transaction | None,
        fault: int | None,
    ) -> tuple[list[StoredEntry], bool] | None:
        step = self.run(
            fault,
            lambda: self.space.find_or_conflict(
                engine_templates(specs), take=take, max_entries=max_entries, txn=txn
            ),
        )
        if step.refused is not None:
            assert isinstance(step.refused, TransactionNotFoundError)
            assert txn is not None and txn.id not in self.txns
            return None
        if not step.ok:
            return None
        found, conflicted = step.result
        txn_id = None if txn is None else txn.id
        expected = self.eligible(specs, take, txn_id)[:max_entries]
        assert [s.id for s in found] == [ref.stored.id for ref in expected]
        for stored in found:
            self.claim(stored, specs, take, txn_id)
        self.settle_events()
        return found, conflicted

    @rule(
        specs=templates_st,
        take=st.booleans(),
        max_entries=st.sampled_from([1, 1, 2, 5]),
        under=st.none() | pick_st,
        fault=fault_st,
    )
    def find_now(
        self, specs: list[TemplateSpec], take: bool, max_entries: int, under: int | None, fault: int | None
    ) -> None:
        self.find(specs, take, max_entries, self.under(under), fault)

    @rule(
        specs=templates_st,
        take=st.booleans(),
        under=st.none() | pick_st,
        if_exists=st.booleans(),
        with_wants=st.booleans(),
        fault=fault_st,
    )
    def block(
        self,
        specs: list[TemplateSpec],
        take: bool,
        under: int | None,
        if_exists: bool,
        with_wants: bool,
        fault: int | None,
    ) -> None:
        """A blocked read or take, as the embedded backend makes one: look, then park."""
        txn = self.under(under)
        txn_id = None if txn is None else txn.id
        looked = self.find(specs, take, 1, txn, None)
        if looked is None or looked[0] or (if_exists and not looked[1]):
            return
        call = Call(specs, take, txn_id, if_exists, self.log)
        waiter = Waiter(
            self.space.new_waiter_seq(),
            tuple(engine_templates(specs)),
            take,
            call.deliver,
            txn=txn,
            if_exists=if_exists,
            wants=call.wants if with_wants else None,
        )
        call.waiter = waiter
        step = self.run(fault, lambda: self.space.park(waiter))
        if step.refused is not None:
            assert isinstance(step.refused, TransactionNotFoundError) and txn_id not in self.txns
            return
        if step.ok:
            self.calls[waiter.seq] = call
            self.all_calls.append(call)

    @rule(take=st.booleans(), with_wants=st.booleans(), fault=fault_st)
    def block_on_any(self, take: bool, with_wants: bool, fault: int | None) -> None:
        """A blocked call any entry will do for: most writes are then handed straight to one."""
        self.block([("A", None)], take, None, False, with_wants, fault)

    @precondition(lambda self: self.all_calls)
    @rule(pick=pick_st, fault=fault_st)
    def unpark(self, pick: int, fault: int | None) -> None:
        call: Call = self.pick(self.all_calls, pick)
        waiter = call.waiter
        assert waiter is not None
        if self.run(fault, lambda: self.space.unpark(waiter)).ok:
            self.calls.pop(waiter.seq, None)

    def quitters(self) -> list[Call]:
        """Parked calls that can give up: those that can say so (`Waiter.wants`)."""
        return [call for call in self.calls.values() if call.waiter is not None and call.waiter.wants]

    @precondition(lambda self: self.quitters())
    @rule(pick=pick_st)
    def give_up(self, pick: int) -> None:
        """A blocked call's caller goes away; the engine only hears of it when it is unparked."""
        call: Call = self.pick(self.quitters(), pick)
        call.wanted = False
        assert call.waiter is not None
        del self.calls[call.waiter.seq]

    def lease_id(self, kind: str, pick: int) -> int | None:
        if kind == "entry" and self.lease_ids:
            return int(self.pick(self.lease_ids, pick))
        if kind == "transaction" and self.all_txns:
            return int(self.pick(self.all_txns, pick).id)
        if kind == "registration" and self.all_listeners:
            listener = self.pick(self.all_listeners, pick)
            return None if listener.registration is None else int(listener.registration.seq)
        return None

    def lease_holder(self, lease_id: int) -> Ref | Transaction | Listener | None:
        if lease_id in self.present:
            return self.present[lease_id]
        if lease_id in self.txns:
            return self.txns[lease_id]
        return self.listeners.get(lease_id)

    @rule(
        pick=pick_st,
        kind=st.sampled_from(["entry", "transaction", "registration"]),
        lease=lease_st,
        fault=fault_st,
    )
    def renew(self, pick: int, kind: str, lease: float | None, fault: int | None) -> None:
        lease_id = self.lease_id(kind, pick)
        if lease_id is None:
            return
        live = self.lease_holder(lease_id)
        step = self.run(fault, lambda: self.space.renew(lease_id, lease))
        if self.refused_lease(lease):
            assert isinstance(step.refused, InvalidArgumentError), f"a lease of {lease} was not refused"
            return
        if step.refused is not None:
            assert isinstance(step.refused, LeaseNotFoundError) and live is None, step.refused
            return
        if not step.ok:
            return
        assert live is not None, f"renewed lease {lease_id}, which is gone"
        expires_at = self.expiry(lease)
        assert step.result.expires_at == expires_at
        if isinstance(live, Ref | Listener):
            live.expires_at = expires_at

    @rule(pick=pick_st, kind=st.sampled_from(["entry", "transaction", "registration"]), fault=fault_st)
    def cancel(self, pick: int, kind: str, fault: int | None) -> None:
        lease_id = self.lease_id(kind, pick)
        if lease_id is None:
            return
        live = self.lease_holder(lease_id)
        step = self.run(fault, lambda: self.space.cancel(lease_id))
        if step.refused is not None:
            assert isinstance(step.refused, LeaseNotFoundError) and live is None, step.refused
            return
        if not step.ok:
            return
        assert live is not None, f"cancelled lease {lease_id}, which is gone"
        if isinstance(live, Ref):
            assert step.result is live.stored
            self.leave(lease_id)
            self.settle_events()
        elif isinstance(live, Transaction):
            self.end_txn(lease_id, commit=False)
            self.settle_events({lease_id: False})
        else:
            del self.listeners[lease_id]
            self.settle_events()
            assert any(event[0] == "end" and event[1] is live for event in self.step_events)

    @rule(lease=lease_st, fault=fault_st)
    def begin(self, lease: float | None, fault: int | None) -> None:
        step = self.run(fault, lambda: self.space.begin(lease))
        if self.refused_lease(lease):
            assert isinstance(step.refused, InvalidArgumentError), f"a lease of {lease} was not refused"
            return
        if not step.ok:
            return
        txn, grant = step.result
        assert grant.expires_at == txn.expires_at == self.expiry(lease)
        self.txns[txn.id] = txn
        self.all_txns.append(txn)

    @precondition(lambda self: self.all_txns)
    @rule(pick=pick_st, commit=st.booleans(), fault=fault_st)
    def end(self, pick: int, commit: bool, fault: int | None) -> None:
        txn: Transaction = self.pick(self.all_txns, pick)
        written = [ref.stored for ref in self.present.values() if ref.writer == txn.id]
        step = self.run(fault, lambda: self.space.commit(txn) if commit else self.space.abort(txn))
        if step.refused is not None:
            assert isinstance(step.refused, TransactionNotFoundError) and txn.id not in self.txns
            return
        if not step.ok:
            return
        assert txn.id in self.txns
        self.end_txn(txn.id, commit)
        if commit:
            self.expect_events([s for s in written if s.id in self.present], None)
        self.settle_events({txn.id: commit})

    @rule(specs=templates_st, lease=lease_st, under=st.none() | pick_st, fault=fault_st)
    def register(
        self, specs: list[TemplateSpec], lease: float | None, under: int | None, fault: int | None
    ) -> None:
        txn = self.under(under)
        expires_at = None if self.refused_lease(lease) else self.expiry(lease)
        listener = Listener(specs, None if txn is None else txn.id, expires_at, self.log)
        step = self.run(
            fault,
            lambda: self.space.register(
                tuple(engine_templates(specs)), lease, listener.on_event, listener.on_end, txn
            ),
        )
        if self.refused_lease(lease):
            assert isinstance(step.refused, InvalidArgumentError), f"a lease of {lease} was not refused"
            return
        if step.refused is not None:
            assert isinstance(step.refused, TransactionNotFoundError), step.refused
            assert txn is not None and txn.id not in self.txns
            return
        if not step.ok:
            return
        registration, grant = step.result
        assert grant.expires_at == expires_at
        listener.registration = registration
        self.listeners[registration.seq] = listener
        self.all_listeners.append(listener)

    @precondition(lambda self: self.listeners)
    @rule(pick=pick_st, fault=fault_st)
    def unregister(self, pick: int, fault: int | None) -> None:
        listener: Listener = self.pick(list(self.listeners.values()), pick)
        registration = listener.registration
        assert registration is not None
        if self.run(fault, lambda: self.space.unregister(registration)).ok:
            del self.listeners[registration.seq]

    @precondition(lambda self: self.taken_entries)
    @rule(picks=st.lists(pick_st, min_size=1, max_size=3), fault=fault_st)
    def put_back(self, picks: list[int], fault: int | None) -> None:
        """A take's reply could not be delivered (its call was cancelled): its entries go back."""
        candidates = list(self.taken_entries.values())
        entries = list({s.id: s for s in (self.pick(candidates, p) for p in picks)}.values())
        if not self.run(fault, lambda: self.space.restore(entries)).ok:
            return
        for stored in entries:
            if stored.expires_at is not None and stored.expires_at <= self.now():
                continue  # expired meanwhile: it stays gone
            del self.taken_entries[stored.id]
            self.taken.discard(stored.id)
            self.gone.discard(stored.id)
            self.present[stored.id] = Ref(
                stored, stored.type_name, stored.fields["k"].data, stored.expires_at
            )
        self.settle_events()

    @precondition(lambda self: self.all_txns)
    @rule(pick=pick_st)
    def give_back_takes(self, pick: int) -> None:
        """A take under a transaction whose reply could not be delivered: untake what it took."""
        txn: Transaction = self.pick(self.all_txns, pick)
        if txn.id not in self.txns:
            return
        entries = [ref.stored for ref in self.present.values() if ref.taker == txn.id]
        assert self.run(None, lambda: self.space.untake(txn, entries)).ok
        for stored in entries:
            self.present[stored.id].taker = None
        self.settle_events()

    @rule(seconds=st.sampled_from([0.5, 1.0, 2.5, 6.0]), fault=fault_st)
    def advance(self, seconds: float, fault: int | None) -> None:
        """Time passes; the reaper runs (and again, as its next pass would, if a fault stopped it)."""
        self.clock.advance(seconds)
        now = self.now()
        for txn_id, txn in list(self.txns.items()):
            if txn.expires_at is not None and txn.expires_at <= now:
                self.end_txn(txn_id, commit=False)  # as good as aborted, whenever the engine gets to it
        for entry_id, ref in list(self.present.items()):
            if ref.expires_at is not None and ref.expires_at <= now:
                self.leave(entry_id)
        for seq, listener in list(self.listeners.items()):
            if listener.expires_at is not None and listener.expires_at <= now:
                del self.listeners[seq]
        for attempt_fault in (fault, None):
            step = self.run(attempt_fault, self.space.reap, partial=True)
            self.settle_events()
            if step.ok:
                break

    # ------------------------------------------------------------ after every step

    @invariant()
    def the_engine_equals_the_reference(self) -> None:
        check_indexes(self.space)
        seen = self.current_view()
        assert self.taken.isdisjoint(seen.entries), "an entry is both taken and in the space"
        assert self.taken.isdisjoint(self.space._entries)
        expected = {
            entry_id: (ref.expires_at, ref.writer, ref.taker, frozenset(ref.readers))
            for entry_id, ref in self.present.items()
        }
        got = {entry_id: (e[0], e[2], e[3], e[4]) for entry_id, e in seen.entries.items()}
        assert got == expected
        assert set(seen.transactions) == set(self.txns)
        assert seen.registrations == {
            seq: (listener.expires_at, listener.sequence) for seq, listener in self.listeners.items()
        }
        assert seen.waiters == set(self.calls)
        readable = [ref.stored.id for ref in self.eligible([("A", None)], False, None)]
        assert [s.id for s in contents(self.space, engine_templates([("A", None)]))] == readable
        assert self.space.count(engine_templates([("A", None)])) == len(readable)

    @invariant()
    def no_parked_call_waits_for_a_free_entry(self) -> None:
        if self.faulted:
            return  # a hand-off that failed past a commit point leaves its call waiting
        for call in self.calls.values():
            if call.if_exists:
                continue
            free = [
                ref.stored.id
                for ref in self.present.values()
                if ref.writer is None
                and ref.taker is None
                and not ref.readers
                and any(matches(spec, ref) for spec in call.templates)
            ]
            assert not free, f"call {call.waiter.seq if call.waiter else '?'} waits while {free} are free"


FailureMachine.TestCase.settings = settings(
    max_examples=300,
    stateful_step_count=40,
    deadline=None,
    database=None,
    report_multiple_bugs=False,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestFailureAtomicity = FailureMachine.TestCase


# ---------------------------------------------------------------- the reproduction


def test_a_lease_the_queue_cannot_file_leaves_nothing_behind() -> None:
    """The lease queue refusing (as it did, overflowing, for 1e308) after the write began: the
    write fails, and the space neither holds the entry nor hands it to every later take."""
    clock = FakeClock()
    space = SpaceEngine("issue-17", SpaceSettings(), clock)
    faults = Faults(space)
    faults.arm(1)  # the write's first step: filing the entry's lease
    try:
        space.write([NewEntry("A", (), {"k": value(1)}, None, 1)], 60.0)
    except InjectedFaultError:
        pass
    else:
        raise AssertionError("the fault did not fire")
    faults.disarm()
    check_indexes(space)
    assert find(space, engine_templates([("A", None)]), take=True) == []
    assert space.statistics().entries == 0


def test_a_take_that_fails_unfiling_keeps_the_entry_and_the_next_take_gets_it_once() -> None:
    space = SpaceEngine("issue-17", SpaceSettings(), FakeClock())
    faults = Faults(space)
    (grant,) = space.write([NewEntry("A", (), {"k": value(1)}, None, 1)], 60.0)
    faults.arm(2)  # unfiling it: its lease's discard, then the index's remove
    try:
        find(space, engine_templates([("A", None)]), take=True)
    except InjectedFaultError:
        pass
    else:
        raise AssertionError("the fault did not fire")
    check_indexes(space)
    assert [s.id for s in find(space, engine_templates([("A", None)]), take=True)] == [grant.id]
    assert find(space, engine_templates([("A", None)]), take=True) == []
    check_indexes(space)


def test_the_view_sees_what_a_client_sees() -> None:
    """The white-box view used above agrees with the public calls on a small space."""
    space = SpaceEngine("view", SpaceSettings(), FakeClock())
    (grant,) = space.write([NewEntry("B", ("A",), {"k": value(0)}, None, 1)], 10.0)
    seen = view(space, space._clock.time(), lambda waiter: True)
    assert list(seen.entries) == [grant.id] and seen.order == {"A": (grant.id,), "B": (grant.id,)}
    assert dataclasses.replace(seen, next_id=0) != seen
