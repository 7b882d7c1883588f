"""Development certificates, the principal a certificate names, and the per-RPC access table."""

from __future__ import annotations

from pathlib import Path

import pytest

from outrig._protocol import METHODS
from outrig.service.config import Limits
from outrig.service.exceptions import InvalidArgumentError
from outrig.service.security import certs
from outrig.service.security.access import ACCESS, Access
from outrig.service.transport.handlers import Received
from outrig.v1 import space_pb2 as pb


def test_dev_certificates_are_written_once(tmp_path: Path) -> None:
    written = certs.write_dev_certificates(tmp_path / "pki", client="alice")
    assert sorted(p.name for p in written) == sorted(
        ["ca.pem", "ca.key", "server.pem", "server.key", "client.pem", "client.key"]
    )
    assert all(p.stat().st_mode & 0o777 == 0o600 for p in written if p.suffix == ".key")
    assert certs.certificate_principal((tmp_path / "pki" / "client.pem").read_bytes()) == "alice"
    with pytest.raises(FileExistsError, match="not overwriting"):
        certs.write_dev_certificates(tmp_path / "pki")


def test_a_san_uri_names_the_principal_before_the_cn() -> None:
    ca = certs.new_ca()
    with_uri = certs.issue(ca, "alice", uri="spiffe://example.org/alice")
    assert certs.certificate_principal(with_uri.cert) == "spiffe://example.org/alice"


def test_every_rpc_has_an_access_entry() -> None:
    assert set(ACCESS) == set(METHODS)


LIMITS = Limits()


def _received(message: object) -> Received[object]:
    return Received(message, b"")


def test_a_write_asks_for_the_entry_type_and_its_supertypes() -> None:
    request = pb.WriteRequest(space="jobs", entry=pb.Entry(type_name="app.Urgent", supertypes=["app.Task"]))
    assert ACCESS["Write"](_received(request), LIMITS) == Access("write", "jobs", ("app.Urgent", "app.Task"))
    many = pb.WriteManyRequest(
        space="jobs", entries=[pb.Entry(type_name="A"), pb.Entry(type_name="B", supertypes=["A"])]
    )
    assert ACCESS["WriteMany"](_received(many), LIMITS) == Access("write", "jobs", ("A", "B"))


def test_matching_asks_for_the_template_types_and_leases_for_the_space() -> None:
    match = pb.MatchRequest(space="jobs", templates=[pb.Template(type_name="A"), pb.Template(type_name="A")])
    assert ACCESS["Take"](match, LIMITS) == Access("take", "jobs", ("A",))
    assert ACCESS["Count"](
        pb.CountRequest(space="jobs", templates=[pb.Template(type_name="B")]), LIMITS
    ) == Access("read", "jobs", ("B",))
    assert ACCESS["RenewLeases"](pb.RenewLeasesRequest(space="jobs"), LIMITS) == Access(
        "renew", "jobs", (None,)
    )
    assert ACCESS["Notify"](pb.NotifyRequest(space="jobs", resume=7), LIMITS) == Access(
        "notify", "jobs", (None,)
    )


def test_access_validates_the_names_it_reads() -> None:
    with pytest.raises(InvalidArgumentError, match="space"):
        ACCESS["Read"](pb.MatchRequest(space="a b"), LIMITS)
    with pytest.raises(InvalidArgumentError, match=r"templates\[0\].type_name"):
        ACCESS["Read"](pb.MatchRequest(space="s", templates=[pb.Template()]), LIMITS)
    long_name = "x" * (LIMITS.max_name_length + 1)
    request = pb.WriteRequest(space="s", entry=pb.Entry(type_name="T", supertypes=[long_name]))
    with pytest.raises(InvalidArgumentError, match=r"entry.supertypes\[0\]"):
        ACCESS["Write"](_received(request), LIMITS)
