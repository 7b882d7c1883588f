"""The engine's side of the admin API: when entries were written (ages.py), what a description
holds (inspection.py), and browsing with a bounded scan."""

from __future__ import annotations

from outrig.service.engine import FakeClock, Waiter
from outrig.service.engine.ages import WriteTimes
from outrig.service.engine.inspection import Tally, describe, waiter_groups

from .test_space import ids, make, new, tpl, write1


def test_write_times_answer_to_within_the_granularity() -> None:
    times = WriteTimes(granularity=1.0)
    times.note(1, 100.0)
    times.note(5, 100.5)  # within a second of the last checkpoint: none
    times.note(9, 102.0)
    assert len(times) == 2
    assert [times.written_at(i) for i in (0, 1, 5, 8, 9, 50)] == [None, 100.0, 100.0, 100.0, 102.0, 102.0]
    times.prune(9)
    assert len(times) == 1 and times.written_at(9) == 102.0


def test_the_oldest_entry_age_follows_the_oldest_entry_left() -> None:
    clock = FakeClock()
    space = make(clock)
    assert space.oldest_written() is None
    first = write1(space, new("Job"))
    clock.advance(10)
    write1(space, new("Job"))
    clock.advance(5)
    assert space.oldest_written() == clock.time() - 15
    space.cancel(first)
    assert space.oldest_written() == clock.time() - 5


def test_a_description_counts_own_types_subtypes_and_index_slots() -> None:
    clock = FakeClock()
    space = make(clock)
    write1(space, new("Animal", size=4, legs=4))
    write1(space, new("Dog", "Animal", size=6, legs=4, name="rex"))
    write1(space, new("Dog", "Animal", size=6, legs=3))
    tally = Tally(space.declared_types())
    tally.add_entries(space.snapshot())
    tally.add_slots(space.index_slots())
    described = describe(space, tally, clock.time(), 10)
    views = {view.type_name: view for view in described.types}
    assert (views["Animal"].entries, views["Animal"].bytes, views["Animal"].with_subtypes) == (1, 4, 3)
    assert (views["Dog"].entries, views["Dog"].bytes, views["Dog"].with_subtypes) == (2, 12, 2)
    assert views["Dog"].supertypes == ("Animal",)
    assert views["Animal"].indexes == {"legs": 2, "name": 1}
    assert (described.entries, described.bytes, described.oldest_entry_age) == (3, 16, 0.0)


def test_waiters_group_by_their_templates_and_kind_largest_first() -> None:
    def waiter(seq: int, take: bool, **fields: int) -> Waiter:
        return Waiter(seq, (tpl("Job", **fields),), take, lambda entries: True)

    groups = waiter_groups([waiter(1, False, n=1), waiter(2, True), waiter(3, True), waiter(4, False, n=2)])
    assert [(g.take, g.count, dict(g.templates[0].fields).keys() == {"n"}) for g in groups] == [
        (True, 2, False),
        (False, 1, True),
        (False, 1, True),
    ]


def test_browse_looks_at_a_bounded_number_of_candidates_a_page() -> None:
    space = make()
    misses = [write1(space, new("Job", hit=False)) for _ in range(10)]
    hit = write1(space, new("Job", hit=True))
    found, cursor = space.browse([tpl("Job", hit=True)], 0, 5, 5)
    assert (ids(found), cursor) == ([hit], 0)  # its index bucket holds only the hit
    found, cursor = space.browse([tpl("Job")], 0, 2, 4)
    assert ids(found) == misses[:2] and cursor == misses[1]  # a full page
    found, cursor = space.browse([tpl("Job", hit=False), tpl("Job", hit=True)], 0, 5, 3)
    assert ids(found) == misses[:3] and cursor == misses[2]  # the scan bound: a short page
    found, cursor = space.browse([tpl("Job", n=1)], 0, 5, 5)
    assert (found, cursor) == ([], 0)
    found, cursor = space.browse([], misses[-1], 5, 5)
    assert (ids(found), cursor) == ([hit], 0)
