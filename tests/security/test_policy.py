"""The grant policy: patterns, parsing errors, decisions, the decision cache and reloads."""

from __future__ import annotations

import gc
import logging
import weakref
from pathlib import Path

import pytest

from outrig.service.exceptions import PolicyError
from outrig.service.security.policy import Pattern, Policy, load_policy, parse_pattern, parse_policy
from outrig.service.security.policy_file import PolicyFile
from outrig.service.security.principal import Principal

ALICE, BOB = Principal("alice"), Principal("bob", frozenset({"dev"}))


@pytest.mark.parametrize(
    ("pattern", "space", "type_name", "covered"),
    [
        ("outrig://jobs/Task", "jobs", "Task", True),
        ("outrig://jobs/Task", "jobs", "Task2", False),
        ("outrig://jobs/Task", "other", "Task", False),
        ("outrig://jobs/*", "jobs", "app.Task", True),
        ("outrig://jobs/*", "jobs", "app/Task", False),  # one level only
        ("outrig://jobs/-", "jobs", "app/Task", True),  # everything below
        ("outrig://jobs/app/*", "jobs", "app/Task", True),
        ("outrig://jobs/app/*", "jobs", "app", False),
        ("outrig://jobs/app/-", "jobs", "app/a/b", True),
        ("outrig://*/Task", "anything", "Task", True),
        ("outrig://*/-", "anything", "x/y", True),
        # the space itself (renew, cancel, resume): whole-space patterns only
        ("outrig://jobs/*", "jobs", None, True),
        ("outrig://jobs/-", "jobs", None, True),
        ("outrig://jobs", "jobs", None, True),
        ("outrig://jobs", "jobs", "Task", False),
        ("outrig://jobs/Task", "jobs", None, False),
        ("outrig://jobs/app/*", "jobs", None, False),
    ],
)
def test_pattern_covers(pattern: str, space: str, type_name: str | None, covered: bool) -> None:
    assert parse_pattern(pattern).covers(space, type_name) is covered


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("jobs/Task", "is not an outrig://"),
        ("outrig://a b/Task", "space part"),
        ("outrig://jobs/Ta*sk", "misplaced wildcard"),
        ("outrig://jobs//Task", "empty segment"),
        ("outrig://jobs/-/Task", "misplaced wildcard"),
    ],
)
def test_bad_patterns_are_refused_naming_the_resource(text: str, needle: str) -> None:
    with pytest.raises(PolicyError, match="grant") as info:
        parse_policy({"grant": [{"principals": ["a"], "resources": [text], "actions": ["read"]}]})
    assert needle in str(info.value) and "grant[0].resources[0]" in str(info.value)


@pytest.mark.parametrize(
    ("document", "needle"),
    [
        ({"grants": []}, "unknown key(s) grants"),
        ({"grant": [{"principals": ["a"], "resources": ["outrig://s/*"], "actions": ["delete"]}]}, "delete"),
        ({"grant": [{"principals": [], "resources": ["outrig://s/*"], "actions": ["read"]}]}, "principals"),
        (
            {"grant": [{"principals": ["group:"], "resources": ["outrig://s/*"], "actions": ["read"]}]},
            "group",
        ),
        ({"grant": [{"principals": ["a"], "actions": ["read"]}]}, "grant[0].resources"),
        ({"grant": [{"principals": ["a"], "resources": ["outrig://s/*"], "actions": ["read"], "x": 1}]}, "x"),
        ({"groups": {"ops": "alice"}}, "groups.ops"),
    ],
)
def test_malformed_policies_name_the_fault(document: dict[str, object], needle: str) -> None:
    with pytest.raises(PolicyError) as info:
        parse_policy(document)
    assert needle in str(info.value)


def _policy() -> Policy:
    return parse_policy(
        {
            "groups": {"ops": ["alice"]},
            "grant": [
                {"principals": ["alice"], "resources": ["outrig://jobs/*"], "actions": ["write", "read"]},
                {"principals": ["group:ops"], "resources": ["outrig://ops/-"], "actions": ["*"]},
                {"principals": ["group:dev"], "resources": ["outrig://dev/Build"], "actions": ["take"]},
                {"principals": ["*"], "resources": ["outrig://public/*"], "actions": ["read"]},
            ],
        }
    )


@pytest.mark.parametrize(
    ("principal", "action", "space", "type_name", "allowed"),
    [
        (ALICE, "write", "jobs", "Task", True),
        (ALICE, "take", "jobs", "Task", False),  # take is not read
        (ALICE, "admin", "ops", "x/y", True),  # group from the policy's [groups], action "*"
        (BOB, "admin", "ops", "x", False),
        (BOB, "take", "dev", "Build", True),  # group from the principal (its token)
        (BOB, "take", "dev", "Other", False),
        (BOB, "read", "public", "News", True),  # "*" is anyone
        (ALICE, "read", "public", "News", True),
        (BOB, "write", "public", "News", False),
        (BOB, "renew", "jobs", None, False),
    ],
)
def test_decisions(
    principal: Principal, action: str, space: str, type_name: str | None, allowed: bool
) -> None:
    assert _policy().allows(principal, action, space, type_name) is allowed


def test_decisions_are_cached_per_principal_action_resource() -> None:
    policy = _policy()
    for _ in range(3):
        policy.allows(ALICE, "write", "jobs", "Task")
        policy.allows(ALICE, "take", "jobs", "Task")
    assert policy.statistics() == {"grants": 4, "cached_decisions": 2}


def test_deciding_looks_only_at_the_principals_grants() -> None:
    # 10,000 grants for others: a decision for alice looks at hers and "*", not at all of them.
    grants = [
        {"principals": [f"user{i}"], "resources": [f"outrig://s{i}/*"], "actions": ["read"]}
        for i in range(10_000)
    ]
    grants.append({"principals": ["alice"], "resources": ["outrig://jobs/*"], "actions": ["read"]})
    policy = parse_policy({"grant": grants})
    assert policy.allows(ALICE, "read", "jobs", "Task")
    assert policy.allows(Principal("user9999"), "read", "s9999", "Task")
    assert not policy.allows(Principal("user9999"), "read", "s1", "Task")
    assert policy._index.get(("alice", "read")) == [Pattern("jobs", (), "*")]


def test_a_policy_file_reloads_and_keeps_the_old_one_when_the_new_is_malformed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "policy.toml"
    path.write_text(
        '[[grant]]\nprincipals = ["alice"]\nresources = ["outrig://jobs/*"]\nactions = ["read"]\n'
    )
    file = PolicyFile(path)
    first = file.current
    assert first.allows(ALICE, "read", "jobs", "T")
    path.write_text(
        '[[grant]]\nprincipals = ["alice"]\nresources = ["outrig://jobs/*"]\nactions = ["frobnicate"]\n'
    )
    with caplog.at_level(logging.ERROR, logger="outrig.service.security"):
        assert file.reload() is False
    assert file.current is first
    assert "keeping the previous policy" in caplog.text and "frobnicate" in caplog.text
    path.write_text('[[grant]]\nprincipals = ["bob"]\nresources = ["outrig://jobs/*"]\nactions = ["read"]\n')
    assert file.reload() is True
    assert file.current is not first  # a new policy: the old decisions went with the old object
    assert not file.current.allows(ALICE, "read", "jobs", "T")
    assert file.current.statistics()["cached_decisions"] == 1


def test_a_policy_that_cannot_be_read_is_a_policy_error(tmp_path: Path) -> None:
    with pytest.raises(PolicyError, match=r"missing\.toml"):
        load_policy(tmp_path / "missing.toml")
    (tmp_path / "bad.toml").write_text("[[grant]\n")
    with pytest.raises(PolicyError, match=r"bad\.toml"):
        PolicyFile(tmp_path / "bad.toml")


async def test_the_watcher_reloads_on_change(tmp_path: Path) -> None:
    import asyncio

    path = tmp_path / "policy.toml"
    path.write_text(
        '[[grant]]\nprincipals = ["alice"]\nresources = ["outrig://jobs/*"]\nactions = ["read"]\n'
    )
    file = PolicyFile(path)
    watcher = asyncio.create_task(file.watch(interval=0.01))
    try:
        path.write_text(
            '[[grant]]\nprincipals = ["bob"]\nresources = ["outrig://jobs/*"]\nactions = ["read"]\n'
        )
        async with asyncio.timeout(10):
            while file.reloads == 0:  # noqa: ASYNC110 - polling the watcher is what is tested
                await asyncio.sleep(0.01)
        assert file.current.allows(Principal("bob"), "read", "jobs", "T")
    finally:
        watcher.cancel()


def test_a_replaced_policy_is_freed_although_reloads_freeze_the_heap(tmp_path: Path) -> None:
    # Reloads gc.freeze() the new grants; the old policy must still go, by reference counting.
    path = tmp_path / "policy.toml"
    grant = '[[grant]]\nprincipals = ["alice", "group:ops"]\nresources = ["outrig://jobs/*"]\n'
    grant += 'actions = ["read"]\n'
    path.write_text(grant * 50)
    file = PolicyFile(path)
    file.current.allows(ALICE, "read", "jobs", "T")  # a cached decision too
    old = weakref.ref(file.current)
    try:
        assert file.reload() is True
        assert old() is None
    finally:
        gc.unfreeze()
