"""Security end to end: real TLS servers (as subprocesses, on port 0) with real certificates and
tokens, through the SDK. Certificates and keys are made per test session in a temporary directory
with `outrig certs dev` and `outrig keys ed25519` code; none are checked in."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from grpc_health.v1 import health_pb2, health_pb2_grpc

import outrig
from outrig.service.security import certs, tokens

from ..conftest import ServerProcess, start_server


@dataclass
class Task(outrig.Entry, type_name="sec.Task"):
    n: int | None = None


@dataclass
class Urgent(Task, type_name="sec.Urgent"):
    level: int | None = None


@dataclass
class Public(outrig.Entry, type_name="sec.Public"):
    n: int | None = None


@dataclass
class Sneaky(Task, type_name="sec.Sneaky"):
    pass


POLICY = """
[groups]
ops = ["carol"]

[[grant]]                      # alice works in jobs: every type, every action but take and admin
principals = ["alice"]
resources = ["outrig://jobs/*"]
actions = ["write", "read", "notify", "renew", "cancel"]

[[grant]]                      # ops (carol by the policy, dave by his token) take tasks in jobs
principals = ["group:ops"]
resources = ["outrig://jobs/sec.Task"]
actions = ["take"]

[[grant]]                      # ops do anything in the ops space
principals = ["group:ops"]
resources = ["outrig://ops/-"]
actions = ["*"]

[[grant]]                      # anyone authenticated reads public entries in any space
principals = ["*"]
resources = ["outrig://*/sec.Public"]
actions = ["read"]

[[grant]]                      # erin may write only the subtype: not enough to write it
principals = ["erin"]
resources = ["outrig://jobs/sec.Sneaky"]
actions = ["write"]

[[grant]]                      # the client certificate's principal
principals = ["carol-cert"]
resources = ["outrig://jobs/*"]
actions = ["read", "write"]
"""


@dataclass
class Pki:
    dir: Path
    key: Ed25519PrivateKey
    other_ca_client: certs.Issued

    def path(self, name: str) -> str:
        return str(self.dir / name)

    def token(self, principal: str, groups: tuple[str, ...] = (), **kwargs: Any) -> str:
        return tokens.issue_token(self.key, principal, 3600, groups, **kwargs)

    def tls(self, client: bool = False) -> outrig.TLS:
        if client:
            return outrig.TLS(
                ca=self.path("ca.pem"), cert=self.path("client.pem"), key=self.path("client.key")
            )
        return outrig.TLS(ca=self.path("ca.pem"))


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    directory = tmp_path_factory.mktemp("pki")
    certs.write_dev_certificates(directory, client="carol-cert")
    private, _ = tokens.write_key_pair(directory)
    (directory / "policy.toml").write_text(POLICY)
    other = certs.new_ca("another CA")
    return Pki(directory, tokens.load_private_key(private), certs.issue(other, "carol-cert"))


def _tls_args(pki: Pki) -> list[str]:
    return ["--tls-cert", pki.path("server.pem"), "--tls-key", pki.path("server.key")]


@pytest.fixture(scope="module")
def token_server(pki: Pki) -> Iterator[ServerProcess]:
    """TLS, bearer tokens and the policy."""
    running = start_server(
        *_tls_args(pki), "--token-public-key", pki.path("token.pub"), "--policy", pki.path("policy.toml")
    )
    yield running
    assert running.stop() == 0


@pytest.fixture(scope="module")
def mtls_server(pki: Pki) -> Iterator[ServerProcess]:
    """Mutual TLS and the policy."""
    running = start_server(
        *_tls_args(pki), "--tls-client-ca", pki.path("ca.pem"), "--policy", pki.path("policy.toml")
    )
    yield running
    assert running.stop() == 0


def _as(
    server: ServerProcess, pki: Pki, principal: str, space: str, groups: tuple[str, ...] = ()
) -> outrig.Space:
    # Retries on: a TLS handshake that times out on a loaded machine is UNAVAILABLE, which the SDK
    # retries; the refusals these tests expect (PERMISSION_DENIED, UNAUTHENTICATED) never are.
    return outrig.connect(
        server.address, tls=pki.tls(), token=pki.token(principal, groups), space=space, retry_deadline=10.0
    )


@pytest.fixture(scope="module")
def seeded(token_server: ServerProcess, pki: Pki) -> None:
    """Entries for the matrix to find, written by those allowed to write them."""
    with _as(token_server, pki, "alice", "jobs") as jobs:
        jobs.write_many([Task(n=i) for i in range(50)] + [Public(n=i) for i in range(50)], lease=600)
    with _as(token_server, pki, "carol", "ops") as ops:
        ops.write_many([Task(n=i) for i in range(50)] + [Public(n=i) for i in range(50)], lease=600)


OPERATIONS: dict[str, Callable[[outrig.Space, type[Task | Public]], object]] = {
    "write": lambda space, kind: space.write(kind(n=1), lease=60),
    "read": lambda space, kind: space.read_nowait(kind()),
    "count": lambda space, kind: space.count(kind()),
    "contents": lambda space, kind: list(space.contents(kind())),
    "read_many": lambda space, kind: space.read_many(kind(), max_entries=5, timeout=0),
    "take": lambda space, kind: space.take_nowait(kind()),
    "notify": lambda space, kind: space.notify(kind(), lease=5).__enter__().close(),
    "changes": lambda space, kind: space.changes(kind()).__enter__().close(),
}

# (principal, token groups, operation, space, type) -> allowed
MATRIX = [
    ("alice", (), "write", "jobs", Task, True),
    ("alice", (), "read", "jobs", Task, True),
    ("alice", (), "count", "jobs", Task, True),
    ("alice", (), "contents", "jobs", Task, True),
    ("bob", (), "contents", "jobs", Task, False),
    ("bob", (), "read_many", "jobs", Public, True),
    ("carol", (), "read_many", "jobs", Task, False),
    ("alice", (), "notify", "jobs", Task, True),
    ("alice", (), "take", "jobs", Task, False),  # not granted take
    ("alice", (), "write", "ops", Task, False),  # another space
    ("alice", (), "read", "ops", Public, True),  # the "*" grant, any space
    ("alice", (), "read", "ops", Task, False),
    ("carol", (), "take", "jobs", Task, True),  # group from the policy's [groups]
    ("carol", (), "read", "jobs", Task, False),
    ("carol", (), "take", "jobs", Public, False),  # a grant for one type only
    ("carol", (), "write", "ops", Public, True),  # "*" actions, "/-" resources
    ("carol", (), "take", "ops", Task, True),
    ("carol", (), "notify", "ops", Task, True),
    ("dave", ("ops",), "take", "jobs", Task, True),  # group from the token
    ("dave", ("ops",), "write", "ops", Task, True),
    ("dave", (), "take", "jobs", Task, False),  # the same name without the group
    ("bob", (), "read", "jobs", Public, True),  # "*" principals
    ("bob", (), "read", "jobs", Task, False),
    ("bob", (), "write", "jobs", Public, False),
    ("bob", (), "notify", "jobs", Public, False),
    ("bob", (), "count", "elsewhere", Public, True),
    # the change log is read with the notify action (docs/notifications.md)
    ("alice", (), "changes", "jobs", Task, True),
    ("carol", (), "changes", "jobs", Task, False),  # carol may take there, not notify
    ("carol", (), "changes", "ops", Task, True),
    ("bob", (), "changes", "jobs", Public, False),
]


@pytest.mark.usefixtures("seeded")
@pytest.mark.parametrize(
    ("principal", "groups", "operation", "space_name", "kind", "allowed"),
    MATRIX,
    ids=[f"{p}{'+' + ','.join(g) if g else ''}-{op}-{s}-{k.__name__}-{a}" for p, g, op, s, k, a in MATRIX],
)
def test_authorization_matrix(
    token_server: ServerProcess,
    pki: Pki,
    principal: str,
    groups: tuple[str, ...],
    operation: str,
    space_name: str,
    kind: type[Task | Public],
    allowed: bool,
) -> None:
    with _as(token_server, pki, principal, space_name, groups) as space:
        if allowed:
            OPERATIONS[operation](space, kind)
        else:
            with pytest.raises(outrig.PermissionDeniedError) as info:
                OPERATIONS[operation](space, kind)
            assert principal in str(info.value) and f"outrig://{space_name}/sec." in str(info.value)


def test_a_durable_subscriptions_ack_and_delete_need_notify_on_the_space(
    token_server: ServerProcess, pki: Pki
) -> None:
    with _as(token_server, pki, "alice", "jobs") as alice, _as(token_server, pki, "carol", "jobs") as carol:
        with alice.changes(Task(), durable="sec-audit") as stream:
            alice.write(Task(n=9), lease=60)
            next(stream)
            stream.ack()
        with pytest.raises(outrig.PermissionDeniedError, match=r"notify outrig://jobs"):
            carol.delete_subscription("sec-audit")
        alice.delete_subscription("sec-audit")


def test_renew_and_cancel_need_a_grant_over_the_whole_space(token_server: ServerProcess, pki: Pki) -> None:
    with _as(token_server, pki, "alice", "jobs") as alice, _as(token_server, pki, "carol", "jobs") as carol:
        leases = [alice.write(Task(n=7), lease=60), alice.write(Task(n=8), lease=60)]
        assert all(result.ok for result in alice.renew_many(leases, 120))
        with pytest.raises(outrig.PermissionDeniedError, match=r"renew outrig://jobs \("):
            carol.renew_many(leases, 120)  # carol may take sec.Task in jobs, not renew in jobs
        with pytest.raises(outrig.PermissionDeniedError, match="cancel"):
            carol.cancel_many(leases)
        assert all(result.ok for result in alice.cancel_many(leases))


def test_denials_are_logged_with_principal_action_and_resource(token_server: ServerProcess, pki: Pki) -> None:
    with _as(token_server, pki, "bob", "jobs") as bob, pytest.raises(outrig.PermissionDeniedError):
        bob.write(Task(n=1))
    deadline = time.monotonic() + 10
    while "principal='bob' action=write resource=outrig://jobs/sec.Task" not in token_server.log.read_text():
        assert time.monotonic() < deadline, token_server.log.read_text()
        time.sleep(0.05)


def test_supertype_rule(token_server: ServerProcess, pki: Pki) -> None:
    """A grant on a template's type covers the subtypes it matches; writing needs every type."""
    with _as(token_server, pki, "alice", "jobs") as alice, _as(token_server, pki, "carol", "jobs") as carol:
        while carol.take_nowait(Task()) is not None:  # leave only what this test writes
            pass
        alice.write(Urgent(n=1, level=9), lease=60)  # alice may write sec.Urgent and sec.Task
        taken = carol.take_nowait(Task())  # carol's grant is on sec.Task: it covers the subtype
        assert taken == Urgent(n=1, level=9)
        alice.write(Urgent(n=2, level=1), lease=60)
        with pytest.raises(outrig.PermissionDeniedError, match=r"outrig://jobs/sec\.Urgent"):
            carol.take_nowait(Urgent())  # a template of the subtype needs a grant on the subtype
    erin = _as(token_server, pki, "erin", "jobs")
    with erin, pytest.raises(outrig.PermissionDeniedError, match=r"write outrig://jobs/sec\.Task"):
        erin.write(Sneaky(n=1))  # write on sec.Sneaky only: it would be read as a sec.Task


@pytest.mark.parametrize(
    ("make_token", "needle"),
    [
        (lambda pki: tokens.issue_token(Ed25519PrivateKey.generate(), "alice", 3600), "signature"),
        (lambda pki: tokens.issue_token(pki.key, "alice", 60, now=time.time() - 3600), "expired"),
        (lambda pki: tokens.issue_token(pki.key, "alice", 3600, audience="another-service"), "audience"),
        (lambda pki: "garbage", "invalid"),
    ],
    ids=["forged", "expired", "wrong-audience", "garbage"],
)
def test_bad_tokens_are_unauthenticated(
    token_server: ServerProcess, pki: Pki, make_token: Callable[[Pki], str], needle: str
) -> None:
    with (
        outrig.connect(
            token_server.address, tls=pki.tls(), token=make_token(pki), space="jobs", retry_deadline=0
        ) as space,
        pytest.raises(outrig.UnauthenticatedError, match=needle),
    ):
        space.read_nowait(Public())


def test_no_token_is_unauthenticated_but_health_stays_open(token_server: ServerProcess, pki: Pki) -> None:
    space = outrig.connect(token_server.address, tls=pki.tls(), space="jobs", retry_deadline=0)
    with space, pytest.raises(outrig.UnauthenticatedError, match="no credential"):
        space.count(Public())
    credentials = grpc.ssl_channel_credentials((pki.dir / "ca.pem").read_bytes())
    with grpc.secure_channel(token_server.address, credentials) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(  # type: ignore[attr-defined]  # its stub declares no methods
            health_pb2.HealthCheckRequest(service=""), timeout=5
        )
        assert reply.status == health_pb2.HealthCheckResponse.SERVING


def test_a_plaintext_client_cannot_talk_to_a_tls_server(token_server: ServerProcess) -> None:
    space = outrig.connect(token_server.address, space="jobs", retry_deadline=0)
    with space, pytest.raises(outrig.UnavailableError):
        space.count(Public())


def test_mutual_tls_names_the_certificate_principal(mtls_server: ServerProcess, pki: Pki) -> None:
    with outrig.connect(
        mtls_server.address, tls=pki.tls(client=True), space="jobs", retry_deadline=0
    ) as space:
        space.write(Task(n=1), lease=60)  # carol-cert may write and read in jobs
        assert space.read_nowait(Task(n=1)) == Task(n=1)
        with pytest.raises(outrig.PermissionDeniedError, match="'carol-cert' may not take"):
            space.take_nowait(Task(n=1))


def test_a_client_certificate_from_another_ca_is_refused(mtls_server: ServerProcess, pki: Pki) -> None:
    tls = outrig.TLS(ca=pki.path("ca.pem"), cert=pki.other_ca_client.cert, key=pki.other_ca_client.key)
    space = outrig.connect(mtls_server.address, tls=tls, space="jobs", retry_deadline=0)
    with space, pytest.raises(outrig.UnavailableError):
        space.count(Task())
    # and no client certificate at all
    space = outrig.connect(mtls_server.address, tls=pki.tls(), space="jobs", retry_deadline=0)
    with space, pytest.raises(outrig.UnavailableError):
        space.count(Task())


async def test_the_async_client_speaks_tls_with_a_token(token_server: ServerProcess, pki: Pki) -> None:
    async with outrig.aio.connect(
        token_server.address, tls=pki.tls(), token=pki.token("alice"), space="jobs", retry_deadline=0
    ) as space:
        await space.write(Public(n=99), lease=60)
        assert await space.read_nowait(Public(n=99)) == Public(n=99)
        with pytest.raises(outrig.PermissionDeniedError):
            await space.take_nowait(Public(n=99))


def test_tls_server_name_overrides_the_checked_name(token_server: ServerProcess, pki: Pki) -> None:
    port = token_server.address.rsplit(":", 1)[1]
    tls = outrig.TLS(ca=pki.path("ca.pem"), server_name="localhost")
    assert tls.options() == [("grpc.ssl_target_name_override", "localhost")]
    with outrig.connect(f"127.0.0.1:{port}", tls=tls, token=pki.token("bob"), space="jobs") as space:
        assert space.count(Public()) >= 0
    wrong = outrig.TLS(ca=pki.path("ca.pem"), server_name="elsewhere.example")
    space = outrig.connect(
        f"127.0.0.1:{port}", tls=wrong, token=pki.token("bob"), space="jobs", retry_deadline=0
    )
    with space, pytest.raises(outrig.UnavailableError):
        space.count(Public())  # the certificate does not name elsewhere.example


def test_a_token_needs_tls_in_the_sdk() -> None:
    with pytest.raises(ValueError, match="needs TLS"):
        outrig.connect("127.0.0.1:1", token="x")
    with pytest.raises(ValueError, match="cert and key together"):
        outrig.TLS(cert=b"x")


def test_policy_reload_under_load_fails_no_call(pki: Pki, tmp_path: Path) -> None:
    """SIGHUP and file changes swap the policy while clients keep calling: no call fails, a
    malformed file is rejected (the old policy stays), and the new grants take effect."""
    base = (
        '[[grant]]\nprincipals = ["alice"]\nresources = ["outrig://load/*"]\n'
        'actions = ["write", "take", "read"]\n'
    )
    extra = '[[grant]]\nprincipals = ["bob"]\nresources = ["outrig://load/*"]\nactions = ["read"]\n'
    policy = tmp_path / "policy.toml"
    policy.write_text(base)
    server = start_server(
        *_tls_args(pki), "--token-public-key", pki.path("token.pub"), "--policy", str(policy)
    )
    failures: list[BaseException] = []
    calls = [0]
    stop = threading.Event()

    def load() -> None:
        with _as(server, pki, "alice", "load") as space:
            while not stop.is_set():
                try:
                    space.write(Task(n=1), lease=60)
                    space.take_nowait(Task())
                    calls[0] += 2
                except BaseException as err:  # any failure is the test's failure
                    failures.append(err)
                    return

    workers = [threading.Thread(target=load) for _ in range(4)]
    try:
        for worker in workers:
            worker.start()
        with _as(server, pki, "bob", "load") as bob:
            for round_ in range(6):
                with_bob = round_ % 2 == 0
                # a new inode each time, as editors and config tools write files
                staging = tmp_path / "policy.new"
                staging.write_text(base + (extra if with_bob else ""))
                os.replace(staging, policy)
                server.process.send_signal(signal.SIGHUP)
                # mypy infers no lambda whose parameters have defaults (binding the loop's values)
                _eventually(lambda allowed=with_bob: _may_read(bob) is allowed)  # type: ignore[misc]
                staging.write_text("[[grant]\nthis is not toml")
                os.replace(staging, policy)
                server.process.send_signal(signal.SIGHUP)
                _eventually(lambda n=round_ + 1: server.log.read_text().count("reload rejected") >= n)  # type: ignore[misc]
                assert _may_read(bob) is with_bob  # the malformed file changed nothing
        stop.set()
        for worker in workers:
            worker.join(30)
        assert not failures, failures
        assert calls[0] > 0
        log = server.log.read_text()
        assert "keeping the previous policy" in log and log.count("policy reloaded") >= 6
    finally:
        stop.set()
        assert server.stop() == 0


def _may_read(space: outrig.Space) -> bool:
    try:
        space.read_nowait(Task())
    except outrig.PermissionDeniedError:
        return False
    return True


def _eventually(condition: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "the condition did not come true"
        time.sleep(0.05)


def _serve(*args: str) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("OUTRIG_")}
    return subprocess.run(
        [sys.executable, "-m", "outrig.service", "serve", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=environment,
    )


def test_no_tls_beyond_loopback_is_refused_without_insecure() -> None:
    result = _serve("--listen", "0.0.0.0:0")
    assert result.returncode == 2
    assert "refusing to serve on 0.0.0.0 without authentication" in result.stderr


def test_tls_without_authentication_beyond_loopback_is_refused(pki: Pki) -> None:
    result = _serve("--listen", "0.0.0.0:0", *_tls_args(pki))
    assert result.returncode == 2 and "without authentication" in result.stderr


def test_insecure_allows_it_with_warnings() -> None:
    running = start_server("--listen", "0.0.0.0:0", "--insecure")  # the last --listen wins
    try:
        assert running.address.startswith("0.0.0.0:")
        with outrig.connect(f"127.0.0.1:{running.address.rsplit(':', 1)[1]}", retry_deadline=0) as space:
            assert space.count(Task()) == 0
        log = running.log.read_text()
        assert "serving plaintext on 0.0.0.0 (--insecure)" in log and "no authentication configured" in log
    finally:
        assert running.stop() == 0
    result = _serve("--listen", "0.0.0.0:0", "--insecure", "--token-public-key", "/nonexistent.pub")
    assert result.returncode == 2 and "token_public_key" in result.stderr


def test_loopback_without_authentication_still_serves_with_a_warning(server: ServerProcess) -> None:
    assert "no authentication configured" in server.log.read_text()
    with outrig.connect(server.address, space="plain", retry_deadline=0) as space:
        space.write(Task(n=1), lease=60)
        assert space.take_nowait(Task()) == Task(n=1)


def test_with_mutual_tls_and_tokens_a_token_names_the_caller(
    server_factory: Callable[..., ServerProcess], pki: Pki
) -> None:
    server = server_factory(
        *_tls_args(pki),
        "--tls-client-ca",
        pki.path("ca.pem"),
        "--token-public-key",
        pki.path("token.pub"),
        "--policy",
        pki.path("policy.toml"),
    )
    tls = pki.tls(client=True)
    with outrig.connect(
        server.address, tls=tls, token=pki.token("alice"), space="jobs", retry_deadline=0
    ) as space:
        space.notify(Task(), lease=5).__enter__().close()  # alice may notify; carol-cert may not
    space = outrig.connect(server.address, tls=tls, space="jobs", retry_deadline=0)
    with space, pytest.raises(outrig.PermissionDeniedError, match="'carol-cert' may not notify"):
        space.notify(Task(), lease=5).__enter__()


def test_transactions_are_checked_as_leases_and_their_operations_as_usual(
    token_server: ServerProcess, pki: Pki
) -> None:
    with _as(token_server, pki, "alice", "jobs") as alice, _as(token_server, pki, "carol", "jobs") as carol:
        with alice.transaction() as txn:  # alice may renew in jobs: she may begin and commit
            txn.write(Task(n=100), lease=60)
            with pytest.raises(outrig.PermissionDeniedError, match="take"):
                txn.take_nowait(Task())  # but under a transaction she still may not take
        with pytest.raises(outrig.PermissionDeniedError, match=r"renew outrig://jobs \("):
            carol.transaction()  # carol may take tasks in jobs, but not begin a transaction there


# Issue 17 section 1: a principal's name is never a group or "*". POLICY grants group:ops (carol by
# the policy's [groups], dave by his token) everything in the ops space.
CONFUSING_NAMES = ["group:ops", "*", "al\nice", "group:"]


@pytest.mark.parametrize("name", CONFUSING_NAMES, ids=["group-ref", "star", "control-char", "group-prefix"])
def test_a_token_whose_principal_looks_like_a_group_or_star_is_unauthenticated(
    token_server: ServerProcess, pki: Pki, name: str
) -> None:
    # Signed with the server's own key, as a token from an identity provider whose subjects are
    # free text could be: `outrig token issue` refuses to mint it (tests/security/test_commands.py).
    token = jwt.encode({"sub": name, "aud": "outrig", "exp": int(time.time()) + 600}, pki.key, "EdDSA")
    space = outrig.connect(token_server.address, tls=pki.tls(), token=token, space="ops", retry_deadline=0)
    with space:
        with pytest.raises(outrig.UnauthenticatedError, match="principal name") as info:
            space.write(Task(n=1), lease=60)
        assert "group:" in str(info.value)  # the message states the rule
        with pytest.raises(outrig.UnauthenticatedError, match="principal name"):
            space.count(Public())  # not even what "*" may do


@pytest.mark.parametrize(
    ("common_name", "uri"),
    [("group:ops", None), ("*", None), ("mallory", "group:ops")],
    ids=["cn-group-ref", "cn-star", "san-uri-group-ref"],
)
def test_a_client_certificate_whose_principal_looks_like_a_group_or_star_is_unauthenticated(
    mtls_server: ServerProcess, pki: Pki, common_name: str, uri: str | None
) -> None:
    # Signed by the CA the server trusts: whoever may get a certificate signed must not get a
    # group's grants by choosing its name (deploy/kubernetes/mtls grants group:operators everything).
    ca = certs.Issued(pki.dir.joinpath("ca.pem").read_bytes(), pki.dir.joinpath("ca.key").read_bytes())
    client = certs.issue(ca, common_name, uri=uri)
    tls = outrig.TLS(ca=pki.path("ca.pem"), cert=client.cert, key=client.key)
    space = outrig.connect(mtls_server.address, tls=tls, space="ops", retry_deadline=0)
    with space, pytest.raises(outrig.UnauthenticatedError, match=r"client certificate.*principal name"):
        space.write(Task(n=1), lease=60)


def test_a_group_member_keeps_the_groups_grants(token_server: ServerProcess, pki: Pki) -> None:
    # The other side of the rule: carol (by the policy) and dave (by his token) are in ops.
    for principal, groups in (("carol", ()), ("dave", ("ops",))):
        with _as(token_server, pki, principal, "ops", groups) as ops:
            ops.write(Task(n=1), lease=60)
    not_a_member = _as(token_server, pki, "ops", "ops")  # a principal named like the group, not in it
    with not_a_member, pytest.raises(outrig.PermissionDeniedError, match="'ops' may not write"):
        not_a_member.write(Task(n=1), lease=60)


# Issue 17 section 5: a reload that empties a group is a valid policy, and takes effect.
def test_a_reload_that_empties_a_group_takes_its_last_members_access_away(
    server_factory: Callable[..., ServerProcess], pki: Pki, tmp_path: Path
) -> None:
    grant = (
        '[[grant]]\nprincipals = ["group:writers"]\nresources = ["outrig://reload/*"]\nactions = ["write"]\n'
    )
    policy = tmp_path / "policy.toml"
    policy.write_text('[groups]\nwriters = ["bob"]\n' + grant)
    server = server_factory(
        *_tls_args(pki), "--token-public-key", pki.path("token.pub"), "--policy", str(policy)
    )

    def reload(text: str, reloads: int) -> None:
        staging = tmp_path / "policy.new"
        staging.write_text(text)
        os.replace(staging, policy)
        server.process.send_signal(signal.SIGHUP)
        _eventually(
            lambda: (
                "reload rejected" in server.log.read_text()
                or server.log.read_text().count("policy reloaded") >= reloads
            )
        )
        assert "reload rejected" not in server.log.read_text(), server.log.read_text()

    with _as(server, pki, "bob", "reload") as bob:
        bob.write(Task(n=1), lease=60)
        reload("[groups]\nwriters = []\n" + grant, 1)
        with pytest.raises(outrig.PermissionDeniedError, match="'bob' may not write"):
            bob.write(Task(n=2), lease=60)
        reload('[groups]\nwriters = ["bob"]\n' + grant, 2)  # and back
        bob.write(Task(n=3), lease=60)


@pytest.mark.usefixtures("seeded")
def test_matchers_and_order_change_nothing_in_the_policy(token_server: ServerProcess, pki: Pki) -> None:
    """Grants are on types: a template with matchers or a request with an order needs the grant
    its type needs, no more and no less."""
    with _as(token_server, pki, "bob", "jobs") as bob:
        found = bob.read_many(
            Public(n=outrig.Range(45, 49)), max_entries=10, timeout=0, order_by=outrig.desc("n")
        )
        assert [entry.n for entry in found] == [49, 48, 47, 46, 45]  # type: ignore[union-attr]
        with pytest.raises(outrig.PermissionDeniedError, match=r"read outrig://jobs/sec\.Task"):
            bob.read_nowait(Task(n=outrig.Range(1, 3)), order_by="n")
