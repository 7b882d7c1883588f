"""The load and the verdict of the crash harnesses (test_crash.py: one durable server killed and
restarted; test_owner_crash.py: the owner of a space in a tier killed): writer and taker threads,
and optionally movers (each takes an item and writes its `Moved` in one transaction, then
commits), each with its own connection through the blocking SDK (which retries UNAVAILABLE with
request ids), what they were told (`Tally`), and the checks of what is left against it (`check`)."""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import outrig

from ..polling import wait_until

WRITERS = 3
TAKERS = 3
#: The acknowledged writes, and the takes and moves, a run must have had to mean anything (check).
ENOUGH = 100
#: The longest load_through_kills waits for that much load after its last kill.
ENOUGH_TIMEOUT = 120.0


@dataclass
class Item(outrig.Entry, type_name="crash.Item"):
    uid: str | None = None
    writer: int | None = None


@dataclass
class Moved(outrig.Entry, type_name="crash.Moved"):
    """What a mover's transaction wrote in place of the item it took."""

    uid: str | None = None


@dataclass
class Tally:
    """What the client threads saw; each thread appends only to lists of its own."""

    attempted: list[list[str]] = field(default_factory=list)  # uids sent in a write, acknowledged or not
    acknowledged: list[list[str]] = field(default_factory=list)  # uids whose write call returned
    taken: list[list[str]] = field(default_factory=list)  # uids a take returned
    moved: list[list[str]] = field(default_factory=list)  # uids a mover's committed transaction took
    aborted: list[int] = field(default_factory=list)  # movers' transactions told they had aborted
    errors: list[str] = field(default_factory=list)
    retries: list[int] = field(default_factory=list)

    def slot(self, lists: list[list[str]]) -> list[str]:
        own: list[str] = []
        lists.append(own)
        return own

    def count(self, lists: list[list[str]]) -> int:
        return sum(len(own) for own in list(lists))


@dataclass(frozen=True)
class Clients:
    """Where the load goes: the space, the seed of its randomness, the SDK's retry deadline."""

    space: str
    seed: int
    retry_deadline: float
    movers: int = 0
    # A partitioned space (by uid): each mover's transaction names a routing value of its own
    # (docs/scaling.md), takes an item of that partition and writes its Moved there.
    routed: bool = False


def _writer(address: str, number: int, stop: threading.Event, tally: Tally, clients: Clients) -> None:
    rng = random.Random(clients.seed + number)
    attempted, acknowledged = tally.slot(tally.attempted), tally.slot(tally.acknowledged)
    with outrig.connect(address, space=clients.space, retry_deadline=clients.retry_deadline) as space:
        try:
            sequence = 0
            while not stop.is_set():
                # Mostly single writes, some write_many: both carry a request id.
                size = 3 if rng.random() < 0.25 else 1
                uids = [f"w{number}-{sequence + k}" for k in range(size)]
                sequence += size
                items = [Item(uid=uid, writer=number) for uid in uids]
                attempted.extend(uids)
                if size == 1:
                    space.write(items[0], lease=outrig.FOREVER)
                else:
                    space.write_many(items, lease=outrig.FOREVER)
                acknowledged.extend(uids)  # only once the call has returned
        except Exception as err:
            tally.errors.append(f"writer {number} via {address}: {err!r}")
        finally:
            tally.retries.append(space.retries)


def _template(rng: random.Random, draw: float) -> tuple[Item, outrig.OrderKey | str | None]:
    """What a single take asks for: any item, or (half the time) one by a matcher and an order,
    so that matchers and order_by go through the retries and replays of a crash too."""
    if draw < 0.5:
        return Item(uid=outrig.Prefix(f"w{rng.randrange(WRITERS)}-")), "uid"
    if draw < 0.75:
        return Item(writer=outrig.GE(rng.randrange(WRITERS))), outrig.desc("writer")
    return Item(), None


def _taker(address: str, number: int, stop: threading.Event, tally: Tally, clients: Clients) -> None:
    rng = random.Random(clients.seed + 100 + number)
    taken = tally.slot(tally.taken)
    with outrig.connect(address, space=clients.space, retry_deadline=clients.retry_deadline) as space:
        try:
            while not stop.is_set():
                draw = rng.random()
                if draw < 0.25:
                    got = space.take_many(Item(), max_entries=3, timeout=0.2)
                else:
                    template, order_by = _template(rng, draw)
                    one = space.take(template, timeout=0.2, order_by=order_by)
                    got = [] if one is None else [one]
                taken.extend(item.uid for item in got if isinstance(item, Item) and item.uid is not None)
        except Exception as err:
            tally.errors.append(f"taker {number} via {address}: {err!r}")
        finally:
            tally.retries.append(space.retries)


def _mover(address: str, number: int, stop: threading.Event, tally: Tally, clients: Clients) -> None:
    """Move items to `Moved` under transactions: one take and one write, committed. A commit that
    returns counts the item as moved; one told its transaction aborted (or ended) counts an abort,
    and the item is the space's again."""
    moved = tally.slot(tally.moved)
    aborted = 0
    with outrig.connect(address, space=clients.space, retry_deadline=clients.retry_deadline) as space:
        try:
            rounds = 0
            while not stop.is_set():
                rounds += 1
                route = f"m{number}-{rounds}" if clients.routed else None
                txn = space.transaction(lease=4 * clients.retry_deadline, route=route)
                try:
                    item = txn.take(Item(), timeout=0.2)
                    if isinstance(item, Item) and item.uid is not None:
                        txn.write(Moved(uid=item.uid), lease=outrig.FOREVER)
                    txn.commit()
                except (outrig.TransactionAbortedError, outrig.TransactionNotFoundError):
                    aborted += 1
                    continue
                if isinstance(item, Item) and item.uid is not None:
                    moved.append(item.uid)
        except Exception as err:
            tally.errors.append(f"mover {number} via {address}: {err!r}")
        finally:
            tally.retries.append(space.retries)
            tally.aborted.append(aborted)


def start_load(
    address: Callable[[], str], stop: threading.Event, tally: Tally, clients: Clients
) -> list[threading.Thread]:
    """WRITERS writer and TAKERS taker threads, started, each connected to `address()`."""
    threads = (
        [
            threading.Thread(target=_writer, args=(address(), n, stop, tally, clients), name=f"writer-{n}")
            for n in range(WRITERS)
        ]
        + [
            threading.Thread(target=_taker, args=(address(), n, stop, tally, clients), name=f"taker-{n}")
            for n in range(TAKERS)
        ]
        + [
            threading.Thread(target=_mover, args=(address(), n, stop, tally, clients), name=f"mover-{n}")
            for n in range(clients.movers)
        ]
    )
    for thread in threads:
        thread.start()
    return threads


def stop_load(threads: list[threading.Thread], stop: threading.Event, clients: Clients) -> None:
    stop.set()
    for thread in threads:
        thread.join(timeout=clients.retry_deadline + 10)


def load_through_kills(
    address: Callable[[], str], clients: Clients, kills: int, kill: Callable[[], None], pause: float = 1.5
) -> tuple[Tally, float]:
    """Run the load on `address()` while `kill()` is called `kills` times, each after a pause of
    0.3 s to `pause` (random, from the clients' seed), and then half a second more, or until the
    clients have written and taken ENOUGH (what `check` asks for: the pauses are times, and on a
    loaded machine fewer calls fit in them); stop it. What the clients were told, and the seconds
    the load ran (it checks every client stopped and none saw a call fail despite its retries)."""
    stop = threading.Event()
    tally = Tally()
    threads = start_load(address, stop, tally, clients)
    started = time.monotonic()
    rng = random.Random(clients.seed)
    try:
        for _ in range(kills):
            time.sleep(rng.uniform(0.3, pause))
            kill()
        time.sleep(0.5)  # some load on the last incarnation too
        wait_until(
            lambda: tally.errors or enough(tally),
            ENOUGH_TIMEOUT,
            what=lambda: (
                f"{ENOUGH} writes and takes (written {tally.count(tally.acknowledged)}, taken "
                f"{tally.count(tally.taken) + tally.count(tally.moved)})"
            ),
        )
    finally:
        stop_load(threads, stop, clients)
    loaded = time.monotonic() - started
    assert not any(thread.is_alive() for thread in threads), "a client thread did not stop"
    assert not tally.errors, f"client calls failed despite retries: {tally.errors}"
    return tally, loaded


def enough(tally: Tally) -> bool:
    """Whether the clients have written and taken (or moved) ENOUGH entries."""
    taken = tally.count(tally.taken) + tally.count(tally.moved)
    return tally.count(tally.acknowledged) >= ENOUGH and taken >= ENOUGH


def check(
    tally: Tally, left_over: Sequence[str | None], where: str, run: str, moved_over: Sequence[str | None] = ()
) -> None:
    """Print the figures of the `run` (a line saying what it did), then check what is
    `left_over` (the uids in the space at the end; `where` says how they were read) against what
    the clients were told (and `moved_over`, the uids of the `Moved` entries left, against what
    the movers were told):

    - every acknowledged write was taken, moved or is left over (none lost);
    - a `Moved` is left for every committed move and for nothing else, once each (a transaction
      commits whole or not at all, and exactly once);
    - no entry was returned by two takes, none is stored twice, and no taken entry is left over
      (a take is not undone);
    - nothing taken or left over was never written (sanity).
    It also asks for enough load, and for a retry at least (else the faults tested nothing)."""
    attempted = {uid for uids in tally.attempted for uid in uids}
    acknowledged = {uid for uids in tally.acknowledged for uid in uids}
    taken_list = [uid for uids in tally.taken for uid in uids]
    moved_list = [uid for uids in tally.moved for uid in uids]
    taken: set[str | None] = {*taken_list, *moved_list}
    left = set(left_over)
    retries = sum(tally.retries)
    print(
        f"{run}; written {len(acknowledged)} acknowledged ({len(attempted)} attempted), taken "
        f"{len(taken_list)}, moved {len(moved_list)} ({sum(tally.aborted)} transactions aborted), "
        f"{where} {len(left_over)}, retries {retries}"
    )
    assert sorted(moved_over, key=str) == sorted(moved_list), (
        "the Moved entries are not the committed moves: "
        f"{sorted(set(map(str, moved_over)) ^ set(moved_list))[:20]}"
    )
    assert len(acknowledged) >= ENOUGH and len(taken) >= ENOUGH, (
        f"too little load to mean anything: {len(acknowledged)} written, {len(taken)} taken"
    )
    assert retries > 0, "no call was interrupted by the kills, so nothing was tested"
    lost = acknowledged - taken - left
    assert not lost, f"{len(lost)} of {len(acknowledged)} acknowledged writes were lost: {sorted(lost)[:20]}"
    twice = [uid for uid, n in Counter(taken_list + moved_list).items() if n > 1]
    assert not twice, f"{len(twice)} of {len(taken)} taken entries were returned by two takes: {twice[:20]}"
    doubled = [uid for uid, n in Counter(left_over).items() if n > 1]
    assert not doubled, f"{len(doubled)} of {len(left_over)} {where} entries are stored twice: {doubled[:20]}"
    back = taken & left
    assert not back, (
        f"{len(back)} of {len(taken)} taken entries are back in the space: {sorted(back, key=str)[:20]}"
    )
    unknown = (taken | left) - attempted
    assert not unknown, f"{len(unknown)} entries were never written: {sorted(unknown, key=str)[:20]}"
