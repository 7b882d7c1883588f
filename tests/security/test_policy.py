"""The grant policy: patterns, parsing errors, decisions, the decision cache and reloads."""

from __future__ import annotations

import gc
import logging
import weakref
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from outrig.service.exceptions import PolicyError
from outrig.service.security.policy import (
    Grant,
    Pattern,
    Policy,
    load_policy,
    parse_pattern,
    parse_policy,
)
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
    assert policy._index.get((("principal", "alice"), "read")) == [Pattern("jobs", (), "*")]


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


def test_a_reload_frees_the_replaced_policy_and_freezes_nothing(tmp_path: Path) -> None:
    # A reload once gc.freeze()d the heap: a process-wide side effect (issue 18). Now it only swaps
    # the policy, and reference counting frees the old one with its decision cache.
    path = tmp_path / "policy.toml"
    grant = '[[grant]]\nprincipals = ["alice", "group:ops"]\nresources = ["outrig://jobs/*"]\n'
    grant += 'actions = ["read"]\n'
    path.write_text(grant * 50)
    file = PolicyFile(path)
    file.current.allows(ALICE, "read", "jobs", "T")  # a cached decision too
    old = weakref.ref(file.current)
    frozen = gc.get_freeze_count()
    assert file.reload() is True
    assert old() is None
    assert gc.get_freeze_count() == frozen


# Principals and groups are two namespaces (issue 17): "group:NAME" in a grant names a group, and
# only its members get the grant, whatever a principal is called.

NAMES = st.one_of(
    st.sampled_from(["alice", "ops", "dev", "*", "group:", "group:ops", "group:dev", "group:*", ""]),
    st.text(max_size=8),
)
SUBJECTS = st.one_of(
    st.sampled_from(["alice", "ops", "*", "group:ops", "group:dev", "group:*", "group:group:ops"]),
    NAMES.map(lambda name: f"group:{name}"),
    NAMES.filter(lambda name: name != ""),
)


def _reference(subject: str, principal: Principal, members: dict[str, list[str]]) -> bool:
    """What a grant to `subject` means, spelled out: "*" is anyone, "group:G" G's members (by the
    policy's [groups] or the principal's own groups), anything else the principal of that name."""
    if subject == "*":
        return True
    if subject.startswith("group:"):
        group = subject[len("group:") :]
        return group in principal.groups or principal.name in members.get(group, [])
    return subject == principal.name


@settings(max_examples=300, deadline=None)
@given(
    subjects=st.lists(SUBJECTS, min_size=1, max_size=3),
    members=st.dictionaries(NAMES, st.lists(NAMES, max_size=3), max_size=3),
    principals=st.lists(
        st.builds(Principal, NAMES, st.frozensets(NAMES, max_size=2)), min_size=1, max_size=4
    ),
)
@example(subjects=["group:ops"], members={"ops": ["alice"]}, principals=[Principal("group:ops")])
@example(subjects=["group:ops"], members={"ops": []}, principals=[Principal("group:ops")])
@example(subjects=["*"], members={}, principals=[Principal("group:*")])
@example(subjects=["group:*"], members={}, principals=[Principal("*")])
@example(subjects=["alice"], members={"alice": ["bob"]}, principals=[Principal("group:alice")])
def test_a_principal_gets_a_groups_grants_only_as_a_member(
    subjects: list[str], members: dict[str, list[str]], principals: list[Principal]
) -> None:
    # Built as Policy, not parse_policy: the namespaces must hold for any name, including those
    # authentication refuses (the name rule is a second line, not the only one).
    grants = [Grant((subject,), (parse_pattern("outrig://s/-"),), ("read",)) for subject in subjects]
    policy = Policy(grants, members)
    for _ in range(2):  # the second round is answered from the decision cache
        for principal in principals:
            expected = any(_reference(subject, principal, members) for subject in subjects)
            assert policy.allows(principal, "read", "s", "T") is expected, (principal, subjects)


def test_a_principal_named_like_a_group_gets_nothing_of_the_group() -> None:
    policy = _policy()  # group:ops (alice) may do anything in the ops space
    assert policy.allows(ALICE, "write", "ops", "T")
    assert not policy.allows(Principal("group:ops"), "write", "ops", "T")
    assert not policy.allows(Principal("ops"), "write", "ops", "T")  # nor one named like its name
    assert policy.allows(Principal("ops", frozenset({"ops"})), "write", "ops", "T")  # a member by token
    assert not policy.allows(Principal("group:dev"), "take", "dev", "Build")
    assert not policy.allows(Principal("x", frozenset({"group:ops"})), "write", "ops", "T")


def test_an_empty_group_is_valid_and_has_no_members() -> None:
    policy = parse_policy(
        {
            "groups": {"writers": []},
            "grant": [{"principals": ["group:writers"], "resources": ["outrig://s/*"], "actions": ["*"]}],
        }
    )
    assert not policy.allows(Principal("writers"), "write", "s", "T")
    assert policy.allows(Principal("bob", frozenset({"writers"})), "write", "s", "T")  # by token


def test_a_reload_that_empties_a_group_is_installed(tmp_path: Path) -> None:
    path = tmp_path / "policy.toml"
    grant = '[[grant]]\nprincipals = ["group:writers"]\nresources = ["outrig://s/*"]\nactions = ["write"]\n'
    path.write_text('[groups]\nwriters = ["bob"]\n' + grant)
    file = PolicyFile(path)
    assert file.current.allows(Principal("bob"), "write", "s", "T")
    path.write_text("[groups]\nwriters = []\n" + grant)
    assert file.reload() is True
    assert (file.reloads, file.rejected) == (1, 0)
    assert not file.current.allows(Principal("bob"), "write", "s", "T")


@pytest.mark.parametrize(
    ("document", "needle"),
    [
        ({"groups": {"ops": ["group:dev"]}}, "groups.ops: 'group:dev' is not a principal name"),
        ({"groups": {"ops": ["*"]}}, "groups.ops: '*' is not a principal name"),
        ({"groups": {"ops": ["a\tb"]}}, "control character"),
        ({"groups": {"ops": [""]}}, "groups.ops"),
        ({"groups": {"": ["alice"]}}, "group name"),
        (
            {"grant": [{"principals": ["bo\nb"], "resources": ["outrig://s/*"], "actions": ["read"]}]},
            "grant[0].principals",
        ),
    ],
)
def test_names_no_principal_can_have_are_refused_in_a_policy(
    document: dict[str, object], needle: str
) -> None:
    # A member or grantee that authentication would refuse could never match: a mistake to report
    # (groups do not nest: a member "group:dev" does not mean dev's members).
    with pytest.raises(PolicyError) as info:
        parse_policy(document)
    assert needle in str(info.value)
