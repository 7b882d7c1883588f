"""SpaceEngine: matching, FIFO, take exclusivity, leases, quotas, types, waiters and notify."""

from __future__ import annotations

import math
from collections.abc import Sequence

import pytest

from outrig.service.engine import (
    FakeClock,
    NewEntry,
    SpaceEngine,
    SpaceSettings,
    StoredEntry,
    Template,
    Transaction,
    Waiter,
)
from outrig.service.engine.matchers import Range
from outrig.service.engine.model import make_template
from outrig.service.engine.space import FOREVER
from outrig.service.exceptions import LeaseNotFoundError, QuotaExceededError, TypeConflictError

from ..field_values import value

Scalar = bool | int | float | str | bytes | None


def new(
    type_name: str, *supertypes: str, size: int = 10, payload: object = None, **fields: Scalar
) -> NewEntry:
    values = {name: value(x) for name, x in fields.items()}
    return NewEntry(type_name, supertypes, values, payload, size)


def tpl(type_name: str, **fields: Scalar) -> Template:
    return Template(type_name, {name: value(x) for name, x in fields.items()})


def ids(entries: list[StoredEntry]) -> list[int]:
    return [entry.id for entry in entries]


def make(clock: FakeClock | None = None, **settings: object) -> SpaceEngine:
    return SpaceEngine("test", SpaceSettings(**settings), clock or FakeClock())  # type: ignore[arg-type]


def find(
    space: SpaceEngine,
    templates: Sequence[Template],
    *,
    take: bool,
    max_entries: int = 1,
    txn: Transaction | None = None,
) -> list[StoredEntry]:
    """What a read or take finds now, as the backends ask the engine (without the conflict flag)."""
    return space.find_or_conflict(templates, take=take, max_entries=max_entries, txn=txn)[0]


def contents(
    space: SpaceEngine, templates: Sequence[Template], max_entries: int = 0, txn: Transaction | None = None
) -> list[StoredEntry]:
    """What contents lists now, made as the embedded backend makes it: the candidates still
    visible, read-locked under `txn`, up to `max_entries` (0: all)."""
    listed: list[StoredEntry] = []
    for stored in space.candidates(templates):
        if space.visible(templates, stored, txn):
            if txn is not None:
                space.read_lock(txn, stored)
            listed.append(stored)
            if len(listed) == max_entries:
                break
    return listed


def write1(space: SpaceEngine, entry: NewEntry, lease: float | None = FOREVER) -> int:
    (grant,) = space.write([entry], lease)
    return grant.id


# A three-level hierarchy: Dog extends Mammal extends Animal.
ANIMAL = ("Animal",)
MAMMAL = ("Mammal", "Animal")
DOG = ("Dog", "Mammal", "Animal")


# ---------------------------------------------------------------- write, read, take


def test_write_grants_a_distinct_lease_per_entry() -> None:
    space = make()
    grants = space.write([new("A", k=1), new("A", k=1), new("B")], 10)
    assert len({grant.id for grant in grants}) == 3
    assert space.statistics().entries == 3


def test_read_returns_the_entry_and_leaves_it() -> None:
    space = make()
    entry_id = write1(space, new("A", payload={"p": 1}, k=1))
    for _ in range(2):
        (found,) = find(space, [tpl("A", k=1)], take=False)
        assert found.id == entry_id
        assert found.payload == {"p": 1}
        assert found.type_name == "A"
    assert space.count([tpl("A")]) == 1


def test_take_removes_the_entry() -> None:
    space = make()
    entry_id = write1(space, new("A", k=1))
    assert ids(find(space, [tpl("A", k=1)], take=True)) == [entry_id]
    assert find(space, [tpl("A")], take=False) == []
    assert find(space, [tpl("A")], take=True) == []
    assert space.count([tpl("A")]) == 0
    assert space.statistics().entries == 0
    assert space.statistics().bytes == 0


def test_writing_the_same_entry_twice_stores_two_copies() -> None:
    space = make()
    entry = new("A", k=1)
    space.write([entry], None)
    space.write([entry], None)
    assert space.count([tpl("A", k=1)]) == 2
    assert len(find(space, [tpl("A", k=1)], take=True, max_entries=5)) == 2


def test_find_on_an_unknown_type_or_value_finds_nothing() -> None:
    space = make()
    write1(space, new("A", k=1))
    assert find(space, [tpl("Nope")], take=False) == []
    assert find(space, [tpl("A", k=2)], take=False) == []
    assert find(space, [tpl("A", other=1)], take=False) == []


def test_two_takes_never_return_the_same_entry() -> None:
    space = make()
    written = {write1(space, new("A", k=i % 3)) for i in range(30)}
    taken: list[int] = []
    templates = [[tpl("A")], [tpl("A", k=0)], [tpl("A", k=1), tpl("A")]]
    for i in range(30):
        taken += ids(find(space, templates[i % 3], take=True))
    taken += ids(find(space, [tpl("A")], take=True, max_entries=30))
    assert len(taken) == len(set(taken)) == 30
    assert set(taken) == written
    assert find(space, [tpl("A")], take=True) == []


# ---------------------------------------------------------------- matching


@pytest.fixture
def zoo() -> tuple[SpaceEngine, dict[str, int]]:
    space = make()
    written = {
        "animal": write1(space, new(*ANIMAL, name="generic", legs=4)),
        "mammal": write1(space, new(*MAMMAL, name="whale", legs=0, milk=True)),
        "dog": write1(space, new(*DOG, name="rex", legs=4, milk=True, breed="collie")),
        "rock": write1(space, new("Rock", name="rex", legs=4)),
    }
    return space, written


def test_supertype_templates_find_subtypes(zoo: tuple[SpaceEngine, dict[str, int]]) -> None:
    space, w = zoo
    assert ids(contents(space, [tpl("Animal")])) == [w["animal"], w["mammal"], w["dog"]]
    assert ids(contents(space, [tpl("Mammal")])) == [w["mammal"], w["dog"]]
    assert ids(contents(space, [tpl("Dog")])) == [w["dog"]]
    assert space.count([tpl("Animal")]) == 3
    assert space.count([tpl("Mammal")]) == 2


def test_a_subtype_is_returned_with_its_real_type(zoo: tuple[SpaceEngine, dict[str, int]]) -> None:
    space, w = zoo
    (found,) = find(space, [tpl("Animal", name="rex")], take=False)
    assert found.id == w["dog"]
    assert found.type_name == "Dog"
    assert found.lineage == DOG


def test_supertype_template_with_fields(zoo: tuple[SpaceEngine, dict[str, int]]) -> None:
    space, w = zoo
    assert ids(contents(space, [tpl("Animal", legs=4)])) == [w["animal"], w["dog"]]
    assert ids(contents(space, [tpl("Mammal", legs=4)])) == [w["dog"]]
    assert ids(contents(space, [tpl("Animal", milk=True)])) == [w["mammal"], w["dog"]]
    assert ids(contents(space, [tpl("Animal", name="rex", legs=4)])) == [w["dog"]]


def test_fields_only_the_subtype_has_are_wildcards(zoo: tuple[SpaceEngine, dict[str, int]]) -> None:
    space, w = zoo
    # A Mammal template knows nothing of `breed`: the dog's breed does not stop it matching.
    assert ids(contents(space, [tpl("Mammal", name="rex")])) == [w["dog"]]
    # ...but a template that sets a field an entry lacks does not match that entry.
    assert ids(contents(space, [tpl("Animal", breed="collie")])) == [w["dog"]]


def test_mismatches(zoo: tuple[SpaceEngine, dict[str, int]]) -> None:
    space, w = zoo
    assert contents(space, [tpl("Dog", name="whale")]) == []  # value
    assert contents(space, [tpl("Dog", legs=4.0)]) == []  # kind: double 4.0 is not int 4
    assert contents(space, [tpl("Mammal", milk=1)]) == []  # kind: int 1 is not bool true
    assert contents(space, [tpl("Dog", name="rex", legs=3)]) == []  # second field
    assert ids(contents(space, [tpl("Rock", name="rex")])) == [w["rock"]]  # unrelated type, same fields
    assert contents(space, [tpl("Animal", name="rex", breed="pug")]) == []


def test_null_template_fields_are_wildcards(zoo: tuple[SpaceEngine, dict[str, int]]) -> None:
    space, w = zoo
    assert ids(contents(space, [tpl("Dog", name=None)])) == [w["dog"]]
    assert ids(contents(space, [tpl("Animal", breed=None, legs=0)])) == [w["mammal"]]


def test_an_entry_field_set_to_null_matches_only_wildcards() -> None:
    space = make()
    entry_id = write1(space, new("A", k=None))
    assert ids(contents(space, [tpl("A")])) == [entry_id]
    assert contents(space, [tpl("A", k=0)]) == []
    assert contents(space, [tpl("A", k="")]) == []


def test_int_double_bool_are_distinct_when_matching() -> None:
    space = make()
    as_int = write1(space, new("A", k=1))
    as_double = write1(space, new("A", k=1.0))
    as_bool = write1(space, new("A", k=True))
    assert ids(contents(space, [tpl("A", k=1)])) == [as_int]
    assert ids(contents(space, [tpl("A", k=1.0)])) == [as_double]
    assert ids(contents(space, [tpl("A", k=True)])) == [as_bool]
    assert space.count([tpl("A", k=1)]) == 1


def test_large_values_with_the_same_coarse_key_match_exactly() -> None:
    space = make()
    head, tail = b"h" * 40, b"t" * 40
    big = [head + bytes([i]) * 400 + tail for i in range(3)]
    written = [write1(space, new("A", blob=b)) for b in big]
    for data, entry_id in zip(big, written, strict=True):
        assert ids(contents(space, [tpl("A", blob=data)])) == [entry_id]
        assert space.count([tpl("A", blob=data)]) == 1
        assert ids(find(space, [tpl("A", blob=data)], take=False)) == [entry_id]
    assert contents(space, [tpl("A", blob=head + b"\xff" * 400 + tail)]) == []
    assert space.count([tpl("A", blob=head + b"\xff" * 400 + tail)]) == 0


def test_count_with_two_fields_and_several_templates() -> None:
    space = make()
    for i in range(12):
        write1(space, new("A", a=i % 2, b=i % 3))
    assert space.count([tpl("A", a=0, b=0)]) == 2
    # Overlapping templates: each entry counted once.
    assert space.count([tpl("A", a=0), tpl("A", b=0)]) == 6 + 4 - 2
    assert space.count([tpl("A"), tpl("A", a=1)]) == 12


# ---------------------------------------------------------------- order


def test_fifo_returns_the_oldest_match_first() -> None:
    space = make(fifo=True)
    written = [write1(space, new("A", k=i % 2)) for i in range(6)]
    assert ids(find(space, [tpl("A")], take=False)) == [written[0]]
    assert ids(find(space, [tpl("A", k=1)], take=False)) == [written[1]]
    assert ids(find(space, [tpl("A")], take=False, max_entries=4)) == written[:4]
    assert ids(contents(space, [tpl("A", k=0)])) == written[0::2]
    taken = [find(space, [tpl("A")], take=True)[0].id for _ in range(6)]
    assert taken == written


def test_fifo_across_subtypes_follows_arrival() -> None:
    space = make(fifo=True)
    order = [write1(space, new(*lineage, n=1)) for lineage in (DOG, ANIMAL, MAMMAL, DOG, ANIMAL)]
    assert ids(contents(space, [tpl("Animal")])) == order
    assert ids(find(space, [tpl("Animal", n=1)], take=True, max_entries=10)) == order


@pytest.mark.parametrize("fifo", [True, False])
def test_take_all_is_correct_in_either_order(fifo: bool) -> None:
    space = make(fifo=fifo)
    ones = {write1(space, new("A", k=1)) for _ in range(5)}
    others = {write1(space, new("A", k=2)) for _ in range(5)}
    taken: list[int] = []
    while found := find(space, [tpl("A", k=1)], take=True):
        taken += ids(found)
    assert sorted(taken) == sorted(ones)
    assert {entry.id for entry in contents(space, [tpl("A")])} == others
    batch = find(space, [tpl("A")], take=True, max_entries=3)
    assert len(batch) == 3
    assert set(ids(batch)) <= others


def test_multi_template_find_is_a_union_without_duplicates_in_order() -> None:
    space = make()
    w = [
        write1(space, new(*lineage, k=k))
        for lineage, k in [(("A",), 1), (("B",), 1), (("A",), 2), (("A",), 3)]
    ]
    templates = [tpl("A", k=2), tpl("A"), tpl("B", k=1), tpl("A", k=1)]
    assert ids(contents(space, templates)) == w
    assert ids(find(space, templates, take=False, max_entries=2)) == w[:2]
    assert ids(find(space, [tpl("A", k=3), tpl("A", k=2)], take=False)) == [w[2]]
    assert space.count(templates) == 4
    assert ids(find(space, templates, take=True, max_entries=10)) == w
    assert space.count(templates) == 0


def test_contents_max_entries() -> None:
    space = make()
    w = [write1(space, new("A")) for _ in range(5)]
    assert ids(contents(space, [tpl("A")], max_entries=2)) == w[:2]
    assert ids(contents(space, [tpl("A")], max_entries=0)) == w
    assert space.count([tpl("A")]) == 5  # listing removes nothing


def test_is_live_follows_takes_and_cancels() -> None:
    space = make()
    a, b, _ = (write1(space, new("A")) for _ in range(3))
    listed = contents(space, [tpl("A")])
    find(space, [tpl("A")], take=True)
    space.cancel(b)
    assert [space.is_live(entry) for entry in listed] == [False, False, True]
    assert listed[0].id == a


# ---------------------------------------------------------------- leases


def test_expired_entries_are_invisible_before_any_reap() -> None:
    clock = FakeClock()
    space = make(clock)
    short = write1(space, new("A", k=1), lease=10)
    long = write1(space, new("A", k=1), lease=100)
    listed = contents(space, [tpl("A")])
    clock.advance(9.999)
    assert ids(contents(space, [tpl("A", k=1)])) == [short, long]
    clock.advance(0.001)  # exactly at expiry: gone
    assert ids(find(space, [tpl("A", k=1)], take=False, max_entries=5)) == [long]
    assert ids(find(space, [tpl("A")], take=False, max_entries=5)) == [long]
    assert ids(contents(space, [tpl("A")])) == [long]
    assert [space.is_live(entry) for entry in listed] == [False, True]
    assert space.count([tpl("A", k=1)]) == 1
    assert space.count([tpl("A")]) == 1
    assert ids(find(space, [tpl("A")], take=True, max_entries=5)) == [long]


def test_expired_entries_are_invisible_to_take_and_multi_template_find() -> None:
    clock = FakeClock()
    space = make(clock)
    write1(space, new("A", k=1), lease=1)
    live = write1(space, new("B", k=1), lease=100)
    clock.advance(1)
    assert find(space, [tpl("A")], take=True) == []
    assert ids(find(space, [tpl("A"), tpl("B")], take=False, max_entries=5)) == [live]


def test_reap_removes_expired_entries() -> None:
    clock = FakeClock()
    space = make(clock)
    for _ in range(3):
        write1(space, new("A", size=7), lease=5)
    write1(space, new("A", size=7), lease=50)
    write1(space, new("A", size=7), lease=FOREVER)
    assert space.next_expiry() == clock.time() + 5
    clock.advance(5)
    assert space.reap() == 3
    stats = space.statistics()
    assert (stats.entries, stats.bytes) == (2, 14)
    assert space.reap() == 0
    clock.advance(1e9)
    assert space.reap() == 1
    assert space.statistics().entries == 1  # the FOREVER one


def test_reap_honours_its_limit() -> None:
    clock = FakeClock()
    space = make(clock)
    for _ in range(10):
        write1(space, new("A"), lease=1)
    clock.advance(2)
    assert space.reap(limit=4) == 4
    assert space.statistics().entries == 6
    assert space.reap(limit=100) == 6
    assert space.statistics().entries == 0


def test_renew_extends_an_entry_lease() -> None:
    clock = FakeClock()
    space = make(clock)
    entry_id = write1(space, new("A"), lease=10)
    clock.advance(5)
    grant = space.renew(entry_id, 10)
    assert grant.id == entry_id
    assert grant.expires_at == clock.time() + 10
    assert grant.granted == 10
    clock.advance(9)  # past the original expiry
    assert space.reap() == 0  # the original expiry is stale, not due
    assert ids(find(space, [tpl("A")], take=False)) == [entry_id]
    clock.advance(1)
    assert find(space, [tpl("A")], take=False) == []
    assert space.reap() == 0  # already dropped lazily by the find
    assert space.statistics().entries == 0


def test_renew_can_shorten_a_lease() -> None:
    clock = FakeClock()
    space = make(clock)
    entry_id = write1(space, new("A"), lease=100)
    space.renew(entry_id, 1)
    clock.advance(1)
    assert space.reap() == 1
    assert space.statistics().entries == 0


def test_renew_to_forever() -> None:
    clock = FakeClock()
    space = make(clock)
    entry_id = write1(space, new("A"), lease=10)
    grant = space.renew(entry_id, FOREVER)
    assert (grant.expires_at, grant.granted) == (None, None)
    clock.advance(1e9)
    assert space.reap() == 0
    assert ids(find(space, [tpl("A")], take=False)) == [entry_id]


def test_renew_or_cancel_of_an_unknown_lease_fails() -> None:
    space = make()
    with pytest.raises(LeaseNotFoundError, match="lease 999"):
        space.renew(999, 10)
    with pytest.raises(LeaseNotFoundError, match="lease 999"):
        space.cancel(999)


@pytest.mark.parametrize("reaped", [False, True])
def test_renew_or_cancel_of_an_expired_lease_fails(reaped: bool) -> None:
    clock = FakeClock()
    space = make(clock)
    entry_id = write1(space, new("A"), lease=10)
    clock.advance(10)
    if reaped:
        space.reap()
    with pytest.raises(LeaseNotFoundError):
        space.renew(entry_id, 10)
    with pytest.raises(LeaseNotFoundError):
        space.cancel(entry_id)
    assert find(space, [tpl("A")], take=False) == []


def test_renew_or_cancel_of_a_taken_entry_fails() -> None:
    space = make()
    entry_id = write1(space, new("A"), lease=10)
    find(space, [tpl("A")], take=True)
    with pytest.raises(LeaseNotFoundError):
        space.renew(entry_id, 10)
    with pytest.raises(LeaseNotFoundError):
        space.cancel(entry_id)


def test_cancel_removes_the_entry() -> None:
    space = make()
    gone = write1(space, new("A", k=1, size=5))
    kept = write1(space, new("A", k=1, size=5))
    space.cancel(gone)
    assert ids(find(space, [tpl("A", k=1)], take=False, max_entries=5)) == [kept]
    assert space.count([tpl("A", k=1)]) == 1
    assert space.statistics().bytes == 5
    with pytest.raises(LeaseNotFoundError):
        space.cancel(gone)
    with pytest.raises(LeaseNotFoundError):
        space.renew(gone, 10)


def test_max_lease_caps_requests() -> None:
    clock = FakeClock()
    space = make(clock, max_lease=60.0)
    now = clock.time()
    for requested in (1000.0, FOREVER):
        (grant,) = space.write([new("A")], requested)
        assert (grant.expires_at, grant.granted) == (now + 60, 60)
    (grant,) = space.write([new("A")], 30.0)
    assert (grant.expires_at, grant.granted) == (now + 30, 30)
    renewed = space.renew(grant.id, FOREVER)
    assert (renewed.expires_at, renewed.granted) == (now + 60, 60)
    clock.advance(60)
    assert space.reap() == 3


def test_default_lease_for_any() -> None:
    clock = FakeClock()
    space = make(clock, default_lease=42.0)
    (grant,) = space.write([new("A")], None)
    assert (grant.expires_at, grant.granted) == (clock.time() + 42, 42)
    assert space.renew(grant.id, None).expires_at == clock.time() + 42


def test_default_lease_is_capped_by_max_lease() -> None:
    clock = FakeClock()
    space = make(clock, default_lease=FOREVER, max_lease=5.0)
    (grant,) = space.write([new("A")], None)
    assert (grant.expires_at, grant.granted) == (clock.time() + 5, 5)


def test_forever_lease() -> None:
    clock = FakeClock()
    space = make(clock, default_lease=FOREVER)
    for requested in (math.inf, None):
        (grant,) = space.write([new("A")], requested)
        assert grant.expires_at is None
        assert grant.granted is None
    assert space.next_expiry() is None
    clock.advance(1e12)
    assert space.reap() == 0
    assert space.count([tpl("A")]) == 2


# ---------------------------------------------------------------- quotas


def test_max_entries_quota() -> None:
    space = make(max_entries=3)
    space.write([new("A"), new("A")], None)
    with pytest.raises(QuotaExceededError, match="max_entries=3"):
        space.write([new("A"), new("A")], None)
    assert space.count([tpl("A")]) == 2  # all or nothing
    space.write([new("A")], None)
    with pytest.raises(QuotaExceededError):
        space.write([new("A")], None)
    find(space, [tpl("A")], take=True)
    space.write([new("A")], None)  # a take frees room
    assert space.statistics().entries == 3


def test_max_bytes_quota() -> None:
    space = make(max_bytes=100)
    space.write([new("A", size=60)], None)
    with pytest.raises(QuotaExceededError, match="max_bytes=100"):
        space.write([new("A", size=20), new("A", size=21)], None)
    assert space.statistics().bytes == 60
    assert space.count([tpl("A")]) == 1
    space.write([new("A", size=40)], None)
    assert space.statistics().bytes == 100


def test_expired_entries_do_not_count_against_the_quota() -> None:
    clock = FakeClock()
    space = make(clock, max_entries=5)
    space.write([new("A") for _ in range(5)], 10)
    clock.advance(10)
    space.write([new("B") for _ in range(5)], 10)  # no reaper ran: the write reaps what it needs
    assert space.count([tpl("A")]) == 0
    assert space.count([tpl("B")]) == 5


def test_many_small_expired_entries_make_room_for_a_big_one() -> None:
    # One reap batch (the write's count + 1024) frees too few bytes here; the write must keep going.
    clock = FakeClock()
    space = make(clock, max_bytes=3000)
    for _ in range(2000):
        space.write([new("A", size=1)], 10)
    clock.advance(10)
    space.write([new("Big", size=2500)], None)
    assert space.statistics().bytes == 2500


def test_a_failed_batch_leaves_nothing_behind() -> None:
    space = make(max_entries=2)
    space.write([new("A")], None)
    with pytest.raises(QuotaExceededError):
        space.write([new("B", "X"), new("B", "X")], None)
    assert space.count([tpl("B")]) == 0
    assert space.count([tpl("X")]) == 0
    assert space.statistics().entries == 1
    assert space.statistics().types == 1
    # The refused batch declared nothing: B may still be declared with other supertypes.
    space.write([new("B", "Y")], None)
    assert space.count([tpl("Y")]) == 1


def test_a_quota_refusal_reaches_no_waiter_and_no_registration() -> None:
    space = make(max_entries=0)
    _, taker = park(space, tpl("A"))
    listener, _ = register(space, tpl("A"))
    with pytest.raises(QuotaExceededError):
        space.write([new("A")], None)
    assert taker.got == []
    assert listener.events == []


# ---------------------------------------------------------------- types


def test_a_type_redeclared_with_other_supertypes_conflicts() -> None:
    space = make()
    space.write([new(*DOG)], None)
    space.write([new(*DOG), new(*MAMMAL), new(*ANIMAL)], None)  # consistent: fine
    for bad in (
        new("Dog", "Animal"),
        new("Dog"),
        new("Mammal"),
        new("Animal", "Thing"),
        new("Dog", "Mammal"),
    ):
        with pytest.raises(TypeConflictError):
            space.write([bad], None)
    assert space.count([tpl("Animal")]) == 4


def test_a_template_whose_bucket_says_all_it_asks_still_tests_its_matchers() -> None:
    # A plain template of one field is answered by that field's bucket alone; a template with
    # matchers beside that field, asked as a plain list of templates, still tests them.
    space = make()
    for p in range(5):
        space.write([new("Job", group=1, p=p)], None)
    plain = find(space, [tpl("Job", group=1)], take=False, max_entries=10)
    assert [e.fields["p"].data for e in plain] == [0, 1, 2, 3, 4]
    ranged = make_template("Job", {"group": value(1)}, {"p": Range("int", 2, True, 3, True)})
    found = find(space, [ranged], take=True, max_entries=10)
    assert [e.fields["p"].data for e in found] == [2, 3]
    assert space.count([tpl("Job")]) == 3


def test_a_one_entry_write_of_a_known_shape_still_conflicts_once_its_type_is_redeclared() -> None:
    # A one-entry write whose (type, supertypes) was written before skips the lineage's check;
    # `declare` (a restart's) may change a type's supertypes, and then it is checked again.
    space = make()
    space.write([new(*DOG)], None)
    space.write([new(*DOG)], None)  # the known shape
    space.declare("Dog", ("Animal",))
    with pytest.raises(TypeConflictError):
        space.write([new(*DOG)], None)
    space.write([new("Dog", "Animal")], None)
    assert space.count([tpl("Dog")]) == 3


def test_a_refused_one_entry_write_leaves_its_shape_unknown() -> None:
    space = make(max_entries=1)
    space.write([new("A")], None)
    with pytest.raises(QuotaExceededError):
        space.write([new("B", "X")], None)
    find(space, [tpl("A")], take=True)
    space.write([new("B", "X")], None)  # declares B and X now: the refusal had declared nothing
    assert space.statistics().types == 3 and space.declared_types()["B"] == ("X",)


def test_type_conflict_inside_one_batch_stores_nothing() -> None:
    space = make()
    with pytest.raises(TypeConflictError, match="'A'"):
        space.write([new("A", "B"), new("C"), new("A", "C")], None)
    assert space.statistics().entries == 0
    assert space.statistics().types == 0
    # Nothing was declared: A may now extend C.
    space.write([new("A", "C")], None)
    assert space.count([tpl("C")]) == 1


def test_type_conflict_between_a_supertype_and_its_own_declaration_in_one_batch() -> None:
    space = make()
    with pytest.raises(TypeConflictError):
        space.write([new("Mammal"), new(*DOG)], None)
    assert space.statistics().entries == 0


# ---------------------------------------------------------------- waiters


class Recorder:
    """A waiter's deliver callback that records what it got and answers `wants`."""

    def __init__(self, wants: bool = True) -> None:
        self.wants = wants
        self.got: list[list[StoredEntry]] = []

    def __call__(self, entries: list[StoredEntry]) -> bool:
        self.got.append(entries)
        return self.wants

    @property
    def ids(self) -> list[int]:
        return [entry.id for batch in self.got for entry in batch]


def park(
    space: SpaceEngine, *templates: Template, take: bool = True, wants: bool = True
) -> tuple[Waiter, Recorder]:
    recorder = Recorder(wants)
    waiter = Waiter(space.new_waiter_seq(), templates, take, recorder)
    space.park(waiter)
    return waiter, recorder


def test_a_take_waiter_gets_a_matching_write_which_is_not_stored() -> None:
    space = make()
    _, taker = park(space, tpl("A", k=1))
    assert space.statistics().waiters == 1
    entry_id = write1(space, new("A", payload="p", k=1))
    assert taker.ids == [entry_id]
    assert taker.got[0][0].payload == "p"
    assert space.count([tpl("A")]) == 0
    assert space.statistics().entries == 0
    assert space.statistics().waiters == 0
    with pytest.raises(LeaseNotFoundError):
        space.cancel(entry_id)  # it never entered the space


def test_a_read_waiter_gets_a_matching_write_which_is_stored() -> None:
    space = make()
    _, reader = park(space, tpl("A", k=1), take=False)
    entry_id = write1(space, new("A", k=1))
    assert reader.ids == [entry_id]
    assert ids(find(space, [tpl("A")], take=False)) == [entry_id]
    assert space.statistics().waiters == 0


def test_a_waiter_on_a_supertype_gets_a_subtype() -> None:
    space = make()
    _, taker = park(space, tpl("Animal", legs=4))
    write1(space, new(*DOG, legs=3))
    entry_id = write1(space, new(*DOG, legs=4))
    assert taker.ids == [entry_id]
    assert space.count([tpl("Animal")]) == 1


def test_waiters_are_served_first_come_first_served() -> None:
    space = make()
    _, first = park(space, tpl("A", k=1))
    _, second = park(space, tpl("A"))
    _, third = park(space, tpl("A", k=1))
    a = write1(space, new("A", k=1))
    b = write1(space, new("A", k=1))
    c = write1(space, new("A", k=1))
    assert (first.ids, second.ids, third.ids) == ([a], [b], [c])
    assert space.count([tpl("A")]) == 0


def test_readers_ahead_of_a_taker_all_see_the_entry() -> None:
    space = make()
    _, reader1 = park(space, tpl("A"), take=False)
    _, taker = park(space, tpl("A"))
    _, reader2 = park(space, tpl("A"), take=False)
    entry_id = write1(space, new("A"))
    assert reader1.ids == [entry_id]
    assert taker.ids == [entry_id]
    assert reader2.ids == []  # the taker consumed it first
    assert space.statistics().waiters == 1
    assert space.count([tpl("A")]) == 0


def test_non_matching_waiters_are_untouched() -> None:
    space = make()
    _, other_value = park(space, tpl("A", k=2))
    _, other_kind = park(space, tpl("A", k=1.0))
    _, other_type = park(space, tpl("B"))
    _, second_field = park(space, tpl("A", k=1, j=1))
    entry_id = write1(space, new("A", k=1, j=2))
    for recorder in (other_value, other_kind, other_type, second_field):
        assert recorder.got == []
    assert space.statistics().waiters == 4
    assert ids(find(space, [tpl("A")], take=False)) == [entry_id]


def test_a_waiter_that_no_longer_wants_the_entry_does_not_consume_it() -> None:
    space = make()
    _, gone = park(space, tpl("A"), wants=False)
    _, next_taker = park(space, tpl("A"))
    entry_id = write1(space, new("A"))
    assert gone.ids == [entry_id]
    assert next_taker.ids == [entry_id]
    assert space.statistics().waiters == 0

    _, gone_again = park(space, tpl("A"), wants=False)
    kept = write1(space, new("A"))
    assert gone_again.ids == [kept]
    assert ids(find(space, [tpl("A")], take=False)) == [kept]
    assert space.statistics().waiters == 0  # it was unparked


def test_a_waiter_with_several_templates_is_delivered_once() -> None:
    space = make()
    _, taker = park(space, tpl("A", k=1), tpl("A"), tpl("B"))
    entry_id = write1(space, new("A", k=1))
    assert taker.ids == [entry_id]
    other = write1(space, new("B"))
    assert taker.ids == [entry_id]
    assert ids(find(space, [tpl("B")], take=False)) == [other]


def test_unpark_forgets_a_waiter() -> None:
    space = make()
    waiter, taker = park(space, tpl("A"))
    space.unpark(waiter)
    space.unpark(waiter)  # idempotent
    assert space.statistics().waiters == 0
    entry_id = write1(space, new("A"))
    assert taker.got == []
    assert ids(find(space, [tpl("A")], take=False)) == [entry_id]


def test_restore_puts_taken_entries_back() -> None:
    clock = FakeClock()
    space = make(clock)
    written = [write1(space, new("A", k=1), lease=10) for _ in range(3)]
    taken = find(space, [tpl("A")], take=True, max_entries=2)
    space.restore(taken)
    assert sorted(ids(contents(space, [tpl("A", k=1)]))) == written
    assert space.count([tpl("A", k=1)]) == 3
    space.restore(taken)  # already back: not duplicated
    assert space.count([tpl("A")]) == 3
    # The restored entries keep their leases.
    space.renew(written[0], 20)
    clock.advance(10)
    assert ids(contents(space, [tpl("A")])) == [written[0]]


def test_a_restored_entry_joins_the_back_of_the_queue_for_every_kind_of_find() -> None:
    space = make()
    first, second, third = (write1(space, new("A", k=i)) for i in range(3))
    space.restore(find(space, [tpl("A")], take=True))
    assert ids(find(space, [tpl("A")], take=False, max_entries=3)) == [second, third, first]
    both = [tpl("A", k=0), tpl("A", k=1)]
    assert ids(find(space, both, take=False, max_entries=2)) == [second, first]
    assert ids(contents(space, [tpl("A")])) == [second, third, first]


def test_count_after_a_mass_expiry_is_exact_and_reaps_in_bounded_batches() -> None:
    clock = FakeClock()
    space = make(clock)
    space.write([new("A", k=1) for _ in range(2500)], 5)
    space.write([new("A", k=1) for _ in range(3)], FOREVER)
    clock.advance(5)
    assert space.count([tpl("A", k=1)]) == 3
    # One request did bounded work: 1,000 reaped, 256 dropped by the walk; the reaper does the rest.
    assert space.statistics().entries == 2503 - 1000 - 256
    space.reap()
    assert space.statistics().entries == 3


def test_restore_offers_entries_to_parked_waiters() -> None:
    space = make()
    entry_id = write1(space, new("A", k=1))
    taken = find(space, [tpl("A")], take=True)
    _, reader = park(space, tpl("A"), take=False)
    _, taker = park(space, tpl("A", k=1))
    space.restore(taken)
    assert reader.ids == [entry_id]
    assert taker.ids == [entry_id]
    assert space.count([tpl("A")]) == 0


def test_restore_drops_entries_that_expired_meanwhile() -> None:
    clock = FakeClock()
    space = make(clock)
    write1(space, new("A"), lease=5)
    taken = find(space, [tpl("A")], take=True)
    _, taker = park(space, tpl("A"))
    clock.advance(5)
    space.restore(taken)
    assert taker.got == []
    assert space.statistics().entries == 0


def test_restore_does_not_publish_events() -> None:
    space = make()
    events: list[int] = []
    space.register((tpl("A"),), None, lambda seq, _: events.append(seq), lambda: None)
    write1(space, new("A"))
    space.restore(find(space, [tpl("A")], take=True))
    assert events == [1]


def test_waiter_seqs_are_unique_and_increasing() -> None:
    space = make()
    seqs = [space.new_waiter_seq() for _ in range(5)]
    assert seqs == sorted(set(seqs))


# ---------------------------------------------------------------- notify


class Listener:
    def __init__(self) -> None:
        self.events: list[tuple[int, int]] = []
        self.ended = 0

    def on_event(self, sequence: int, entry: StoredEntry) -> None:
        self.events.append((sequence, entry.id))

    def on_end(self) -> None:
        self.ended += 1


def register(space: SpaceEngine, *templates: Template, lease: float | None = None) -> tuple[Listener, int]:
    listener = Listener()
    _, grant = space.register(templates, lease, listener.on_event, listener.on_end)
    return listener, grant.id


def test_notify_sequence_numbers_count_matching_writes() -> None:
    space = make()
    listener, _ = register(space, tpl("A", k=1))
    a = write1(space, new("A", k=1))
    write1(space, new("A", k=2))
    write1(space, new("B", k=1))
    b, c = (grant.id for grant in space.write([new("A", k=1), new("A", k=1)], None))
    assert listener.events == [(1, a), (2, b), (3, c)]


def test_notify_on_a_supertype_and_with_several_templates() -> None:
    space = make()
    listener, _ = register(space, tpl("Animal", legs=4), tpl("Rock"))
    dog = write1(space, new(*DOG, legs=4))
    write1(space, new(*MAMMAL, legs=0))
    rock = write1(space, new("Rock", legs=4))  # matches one template: one event
    assert listener.events == [(1, dog), (2, rock)]


def test_registrations_have_their_own_sequences() -> None:
    space = make()
    all_a, _ = register(space, tpl("A"))
    write1(space, new("A", k=1))
    only_two, _ = register(space, tpl("A", k=2))
    write1(space, new("A", k=2))
    assert [seq for seq, _ in all_a.events] == [1, 2]
    assert [seq for seq, _ in only_two.events] == [1]


def test_a_write_taken_by_a_waiter_is_still_an_event() -> None:
    space = make()
    listener, _ = register(space, tpl("A"))
    _, taker = park(space, tpl("A"))
    entry_id = write1(space, new("A"))
    assert taker.ids == [entry_id]
    assert listener.events == [(1, entry_id)]


def test_registration_lease_expiry_ends_it_through_reap() -> None:
    clock = FakeClock()
    space = make(clock)
    listener, lease_id = register(space, tpl("A"), lease=10)
    write1(space, new("A"))
    clock.advance(10)
    assert space.reap() == 1
    assert listener.ended == 1
    assert space.statistics().registrations == 0
    write1(space, new("A"))
    assert len(listener.events) == 1
    with pytest.raises(LeaseNotFoundError):
        space.renew(lease_id, 10)
    with pytest.raises(LeaseNotFoundError):
        space.cancel(lease_id)
    assert listener.ended == 1


def test_an_expired_registration_gets_no_event_even_before_the_reaper_runs() -> None:
    clock = FakeClock()
    space = make(clock)
    listener, _ = register(space, tpl("A"), lease=10)
    clock.advance(10)
    write1(space, new("A"))
    assert listener.events == []
    assert listener.ended == 1
    assert space.statistics().registrations == 0
    space.reap()
    assert listener.ended == 1


def test_renewing_a_registration_extends_it() -> None:
    clock = FakeClock()
    space = make(clock)
    listener, lease_id = register(space, tpl("A"), lease=10)
    clock.advance(5)
    assert space.renew(lease_id, 10).expires_at == clock.time() + 10
    clock.advance(9)
    assert space.reap() == 0
    entry_id = write1(space, new("A"))
    assert listener.events == [(1, entry_id)]
    clock.advance(1)
    space.reap()
    assert listener.ended == 1


def test_cancel_ends_a_registration() -> None:
    space = make()
    listener, lease_id = register(space, tpl("A"))
    space.cancel(lease_id)
    assert listener.ended == 1
    write1(space, new("A"))
    assert listener.events == []
    with pytest.raises(LeaseNotFoundError):
        space.cancel(lease_id)
    assert listener.ended == 1


def test_unregister_ends_without_calling_on_end() -> None:
    space = make()
    listener = Listener()
    registration, grant = space.register((tpl("A"),), 10, listener.on_event, listener.on_end)
    lease_id = grant.id
    space.unregister(registration)
    space.unregister(registration)  # idempotent
    write1(space, new("A"))
    assert listener.events == []
    assert listener.ended == 0
    assert space.statistics().registrations == 0
    with pytest.raises(LeaseNotFoundError):
        space.renew(lease_id, 10)


def test_registration_lease_grants() -> None:
    clock = FakeClock()
    space = make(clock, default_lease=30.0, max_lease=100.0)
    _, grant = space.register((tpl("A"),), None, lambda *_: None, lambda: None)
    assert (grant.expires_at, grant.granted) == (clock.time() + 30, 30)
    _, grant = space.register((tpl("A"),), FOREVER, lambda *_: None, lambda: None)
    assert (grant.expires_at, grant.granted) == (clock.time() + 100, 100)


def test_close_ends_every_registration() -> None:
    space = make()
    listeners = [register(space, tpl("A"))[0] for _ in range(3)]
    space.close()
    assert [listener.ended for listener in listeners] == [1, 1, 1]
    assert space.statistics().registrations == 0


# ---------------------------------------------------------------- statistics


def test_statistics() -> None:
    space = make()
    assert space.statistics().entries == 0
    space.write([new(*DOG, size=3), new("B", size=4)], None)
    park(space, tpl("C"))
    register(space, tpl("A"))
    stats = space.statistics()
    assert (stats.entries, stats.bytes, stats.waiters, stats.registrations, stats.types) == (2, 7, 1, 1, 4)
    with pytest.raises(AttributeError):
        stats.entries = 5  # type: ignore[misc]


# ---------------------------------------------------------------- no scans


@pytest.fixture
def matches_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count `Template.matches` calls: the work a lookup does, without timing anything."""
    calls = [0]
    original = Template.matches

    def counting(self: Template, entry: StoredEntry) -> bool:
        calls[0] += 1
        return original(self, entry)

    monkeypatch.setattr(Template, "matches", counting)
    return calls


def test_find_by_field_inspects_one_bucket_not_the_space(matches_calls: list[int]) -> None:
    space = make()
    space.write([new("A", k=i, other=i % 7) for i in range(10_000)], None)
    matches_calls[0] = 0
    (found,) = find(space, [tpl("A", k=5000)], take=False)
    assert found.fields["k"] == value(5000)
    assert matches_calls[0] <= 2
    matches_calls[0] = 0
    assert ids(find(space, [tpl("A", k=7777)], take=True)) == [found.id + 2777]
    assert matches_calls[0] <= 2
    matches_calls[0] = 0
    assert find(space, [tpl("A", k=10_001)], take=False) == []
    assert matches_calls[0] == 0
    matches_calls[0] = 0
    # Two fields: starts from the smaller bucket (k=..., one entry), not other=... (~1,400).
    assert len(find(space, [tpl("A", other=3, k=3)], take=False)) == 1
    assert matches_calls[0] <= 2
    matches_calls[0] = 0
    assert space.count([tpl("A", k=42)]) == 1
    assert matches_calls[0] <= 2


def test_a_write_checks_only_the_waiters_that_could_match(matches_calls: list[int]) -> None:
    space = make()
    recorders = [park(space, tpl("A", k=i))[1] for i in range(1000)]
    register(space, tpl("A", k=-1))
    matches_calls[0] = 0
    write1(space, new("A", k=5000))
    assert matches_calls[0] == 0
    assert space.count([tpl("A")]) == 1
    matches_calls[0] = 0
    entry_id = write1(space, new("A", k=500))
    assert matches_calls[0] <= 2
    assert recorders[500].ids == [entry_id]
    assert sum(len(recorder.got) for recorder in recorders) == 1


def test_candidates_cover_every_match_in_order_and_visible_filters_them() -> None:
    clock = FakeClock()
    space = make(clock)
    a0 = write1(space, new("A", k=0))
    b1 = write1(space, new("B", "A", k=1), lease=5)
    a1 = write1(space, new("A", k=1))
    templates = [tpl("A", k=1), tpl("B"), tpl("A", k=1)]
    candidates = space.candidates(templates)
    assert ids(candidates) == [b1, a1]  # union, no duplicates, arrival order
    clock.advance(5)
    assert [stored.id for stored in candidates if space.visible(templates, stored)] == [a1]
    find(space, [tpl("A", k=1)], take=True)
    assert [stored for stored in candidates if space.visible(templates, stored)] == []
    assert ids(space.candidates([tpl("A")])) == [a0]
    assert ids(make(fifo=False).candidates([tpl("A")])) == []
    lifo = make(fifo=False)
    first, second = write1(lifo, new("A")), write1(lifo, new("A"))
    assert ids(lifo.candidates([tpl("A"), tpl("A")])) == [second, first]
