"""The verdict line, and the campaign's entry classes against a real server."""

from __future__ import annotations

import outrig
from outrig.loadtest.entries import ENTRY_CLASSES, ROOT_TEMPLATES, EntryFactory, identity_of
from outrig.loadtest.report import Verdict
from outrig.testing import LocalServer


def _verdict(**changes: int) -> Verdict:
    values = dict(
        written=10, read=10, taken=10, lost=0, duplicated=0, retries=3, left=0, expected=10, failed=0
    )
    values.update(changes)
    return Verdict(**values)  # type: ignore[arg-type]


def test_the_verdict_line() -> None:
    assert _verdict().line() == "verdict: written=10 read=10 taken=10 lost=0 duplicated=0 retries=3 empty=yes"
    assert _verdict().passed
    assert _verdict(left=2).line().endswith("empty=no")


def test_the_verdict_fails_on_every_kind_of_anomaly() -> None:
    for change in [
        {"lost": 1},
        {"duplicated": 1},
        {"left": 1},
        {"failed": 1},
        {"written": 9},
        {"read": 9},
        {"taken": 9},
    ]:
        verdict = _verdict(**change)
        assert not verdict.passed, change
        assert verdict.reasons(), change


def test_a_free_running_verdict_has_no_count_to_reach() -> None:
    mix = Verdict(
        written=50, read=7, taken=30, lost=0, duplicated=0, retries=0, left=0, expected=None, failed=0
    )
    assert mix.passed
    mix.lost = 1
    assert mix.reasons() == ["1 acknowledged entries lost"]


def test_root_templates_cover_every_class_once() -> None:
    assert len(ENTRY_CLASSES) == 11
    for cls in ENTRY_CLASSES:
        roots = [template for template in ROOT_TEMPLATES if isinstance(cls(), type(template))]
        assert len(roots) == 1, cls


def test_every_entry_is_its_own_template_and_no_other_entrys() -> None:
    factory = EntryFactory(seed=7)
    entries = [factory.make() for _ in range(200)]
    assert len({identity_of(entry) for entry in entries}) == 200
    assert {type(entry) for entry in entries} == set(ENTRY_CLASSES)
    with LocalServer() as server, outrig.connect(server.address, retry_deadline=0) as space:
        space.write_many(entries)
        assert space.count(list(ROOT_TEMPLATES)) == 200
        for entry in entries:
            assert space.count(entry) == 1
            assert space.read_nowait(entry) == entry
        for entry in entries:
            assert space.take_nowait(entry) == entry
        assert space.count(list(ROOT_TEMPLATES)) == 0


def test_the_mix_draws_range_and_prefix_templates() -> None:
    import random

    from outrig._codec import encode_template
    from outrig.loadtest.entries import matcher_template

    drawn = [encode_template(matcher_template(random.Random(seed))) for seed in range(200)]
    kinds = {
        (t.type_name.rsplit(".", 1)[-1], m.WhichOneof("kind")) for t in drawn for m in t.matchers.values()
    }
    assert kinds == {
        ("IntegerMatch", "range"),
        ("StringMatch", "prefix"),
        ("FloatMatch", "range"),
        ("ChildOfIntegerMatch", "one_of"),
        ("Parentless", "all"),
    }
    assert all(not t.fields for t in drawn)  # matchers only: the identity fields stay wildcards
