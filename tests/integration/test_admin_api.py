"""The admin API (DescribeSpace, Browse, Purge, CancelRegistration, AbortTransaction, and
ListSpaces' figures) through the SDK against a real server, over the Mux stream and unary calls:
what it answers, its refusals of bad input, and the admin grant it needs.

Connections retry UNAVAILABLE for up to 10 s (a connection attempt can time out on a loaded
machine); the refusals tested here are other statuses, never retried."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

import outrig
import outrig.aio
from outrig.service.config import ServerConfig
from outrig.testing import LocalServer
from outrig.v1 import space_pb2 as pb
from outrig.v1 import space_pb2_grpc


@dataclass
class Job(outrig.Entry, type_name="inspect.Job"):
    n: int | None = None
    kind: str | None = None


@dataclass
class Urgent(Job, type_name="inspect.Urgent"):
    why: str | None = None


@pytest.fixture(scope="module")
def server() -> Iterator[LocalServer]:
    with LocalServer() as running:
        yield running


@pytest.mark.parametrize("mux", [True, False], ids=["mux", "unary"])
def test_describe_browse_and_purge_through_the_sdk(server: LocalServer, mux: bool) -> None:
    with outrig.connect(server.address, space=f"inspect-{mux}", mux=mux, retry_deadline=10.0) as space:
        space.write_many([Job(n=i, kind="a" if i % 2 else "b") for i in range(20)])
        space.write(Urgent(n=99, why="now"), lease=outrig.FOREVER)
        with space.notify(Job(kind="a"), lease=60.0) as events:
            txn = space.transaction(lease=60.0)
            txn.take(Job(n=0), timeout=0)

            described = space.describe()
            types = {t.type_name: t for t in described.types}
            assert (types["inspect.Job"].entries, types["inspect.Job"].with_subtypes) == (20, 21)
            assert types["inspect.Urgent"].supertypes == ("inspect.Job",)
            # Urgent's fields are filed under Job too; its kind is None (a null value).
            assert types["inspect.Job"].indexes == {"kind": 3, "n": 21, "why": 1}
            assert described.entries == 21 and described.bytes == sum(t.bytes for t in described.types)
            (registration,) = described.registration_list
            assert registration.id == events.lease.id
            assert registration.templates == (outrig.GenericEntry("inspect.Job", (), {"kind": "a"}),)
            (transaction,) = described.transaction_list
            assert (transaction.id, transaction.taken) == (txn.id, 1)
            assert described.configuration.default_lease == 3600.0
            assert described.oldest_entry_age is not None and described.oldest_entry_age >= 0

            page = space.browse(Job(kind="a"), max_entries=4)
            assert [e.entry.n for e in page.entries] == [1, 3, 5, 7]  # type: ignore[union-attr]
            rest = space.browse(Job(kind="a"), after=page.next, max_entries=100)
            assert [e.entry.n for e in rest.entries] == [9, 11, 13, 15, 17, 19]  # type: ignore[union-attr]
            assert rest.next == 0
            (urgent,) = space.browse(Urgent()).entries
            assert urgent.entry == Urgent(n=99, why="now") and urgent.expires_at is None
            assert all(e.expires_at for e in page.entries)
            assert [e.entry.n for e in space.browse().entries][:2] == [1, 2]  # type: ignore[union-attr]

            space.abort_transaction(txn.id)
            space.cancel_registration(events.lease.id)
            assert list(events) == []  # the registration ended
        assert space.purge(Job(kind="a"), dry_run=True) == 10
        assert space.purge(Job(kind="a"), max_entries=4) == 4
        assert space.purge([Job(kind="a"), Urgent()]) == 7
        assert space.count(Job()) == 10
        assert space.describe().transactions == 0


def test_list_spaces_counts_entries_and_bytes(server: LocalServer) -> None:
    with outrig.connect(server.address, space="counted", retry_deadline=10.0) as space:
        space.write_many([Job(n=i) for i in range(3)])
        placement = next(p for p in space.list_spaces() if p.space == "counted")
        assert placement.entries == 3
        assert placement.bytes == space.describe().bytes > 0


def test_bad_admin_requests_are_invalid_argument_naming_the_field(server: LocalServer) -> None:
    with outrig.connect(server.address, space="bad", retry_deadline=10.0) as space:
        with pytest.raises(
            outrig.InvalidArgumentError, match="max_entries: 1001 exceeds the limit of a page, 1000"
        ):
            space.browse(Job(), max_entries=1001)
        with pytest.raises(
            outrig.InvalidArgumentError, match="templates: a purge needs at least one template"
        ):
            space.purge([])
        with pytest.raises(outrig.InvalidArgumentError, match="id: is required"):
            space.cancel_registration(0)
        with pytest.raises(outrig.LeaseNotFoundError, match="registration 12345 in space 'bad'"):
            space.cancel_registration(12345)
        with pytest.raises(outrig.TransactionNotFoundError):
            space.abort_transaction(12345)
        with pytest.raises(outrig.InvalidArgumentError, match=r"templates\[0\].type_name"):
            space.browse(outrig.GenericEntry(""))


def test_every_admin_call_needs_the_admin_grant_and_a_refusal_is_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text(
        '[[grant]]\nprincipals = ["*"]\nresources = ["outrig://*", "outrig://*/*"]\n'
        'actions = ["read", "write", "take", "notify", "renew", "cancel"]\n'
        '[[grant]]\nprincipals = ["*"]\nresources = ["outrig://open", "outrig://open/*"]\n'
        'actions = ["admin"]\n'
    )
    with (
        LocalServer(ServerConfig(policy=policy)) as server,
        outrig.connect(server.address, space="closed", retry_deadline=10.0) as space,
    ):
        space.write(Job(n=1))
        calls = {
            "DescribeSpace": space.describe,
            "Browse": lambda: space.browse(Job()),
            "Purge": lambda: space.purge(Job(), dry_run=True),
            "CancelRegistration": lambda: space.cancel_registration(1),
            "AbortTransaction": lambda: space.abort_transaction(1),
            "ListSpaces": space.list_spaces,
        }
        for name, call in calls.items():
            caplog.clear()
            with (
                caplog.at_level(logging.WARNING, logger="outrig.service.security"),
                pytest.raises(outrig.PermissionDeniedError, match="admin outrig://"),
            ):
                call()
            assert any("denied" in r.getMessage() and "admin" in r.getMessage() for r in caplog.records), name
        assert space.count(Job()) == 1  # nothing was purged
        opened = space.with_space("open")
        opened.write(Job(n=2))
        assert opened.describe().entries == 1  # admin on outrig://open and its types
        assert [e.entry for e in opened.browse(Job()).entries] == [Job(n=2)]


def test_any_language_reaches_the_admin_rpcs_through_the_generated_stub(server: LocalServer) -> None:
    with grpc.insecure_channel(server.address) as channel:
        stub = space_pb2_grpc.SpaceStub(channel)
        entry = pb.Entry(type_name="stub.T", fields={"k": pb.Value(int_value=7)})
        stub.Write(pb.WriteRequest(space="stubbed", entry=entry))
        described = stub.DescribeSpace(pb.DescribeSpaceRequest(space="stubbed"))
        assert [(t.type_name, t.entries) for t in described.types] == [("stub.T", 1)]
        page = stub.Browse(pb.BrowseRequest(space="stubbed"))
        assert [e.entry for e in page.entries] == [entry] and page.next == 0
        purged = stub.Purge(pb.PurgeRequest(space="stubbed", templates=[pb.Template(type_name="stub.T")]))
        assert purged.count == 1


async def test_the_async_sdk_has_the_admin_calls(server: LocalServer) -> None:
    async with outrig.aio.connect(server.address, space="inspect-async", retry_deadline=10.0) as space:
        await space.write_many([Job(n=i) for i in range(5)])
        described = await space.describe()
        assert [(t.type_name, t.entries) for t in described.types] == [("inspect.Job", 5)]
        page = await space.browse(Job(), max_entries=2)
        assert [e.entry.n for e in page.entries] == [0, 1] and page.next  # type: ignore[union-attr]
        assert await space.purge(Job(n=4), dry_run=True) == 1
        assert await space.purge(Job()) == 5
        async with space.notify(Job(), lease=60.0) as events:
            await space.cancel_registration(events.lease.id)
            assert [event async for event in events] == []
        txn = await space.transaction(lease=60.0)
        await space.abort_transaction(txn.id)
        with pytest.raises(outrig.TransactionAbortedError):
            await txn.commit()
