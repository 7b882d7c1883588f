"""`outrig spaces`, `describe`, `browse`, `purge` and `cancel` as an operator runs them, against a
real server: tables, `--json`, confirmation, and refusals."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import outrig
from outrig.service.cli.inspection import where_fields
from outrig.service.config import ServerConfig
from outrig.testing import LocalServer

from ..conftest import start_server


@dataclass
class Order(outrig.Entry, type_name="shop.Order"):
    n: int | None = None
    state: str | None = None


def outrig_cli(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "outrig.service", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.fixture
def server() -> Iterator[LocalServer]:
    with LocalServer() as running:
        with outrig.connect(running.address, space="shop", retry_deadline=10.0) as space:
            space.write_many([Order(n=i, state="new" if i < 6 else "paid") for i in range(10)])
        yield running


def test_where_reads_json_values_else_strings() -> None:
    assert where_fields(["n=1", "x=1.0", "ok=true", 's="1"', "job=resize", "e="]) == {
        "n": 1, "x": 1.0, "ok": True, "s": "1", "job": "resize", "e": "",
    }  # fmt: skip
    with pytest.raises(ValueError, match="expected FIELD=VALUE"):
        where_fields(["n"])
    with pytest.raises(ValueError, match="must be a number"):
        where_fields(["n=[1]"])


def test_spaces_and_describe(server: LocalServer) -> None:
    listed = outrig_cli("spaces", "--address", server.address, "--json")
    assert listed.returncode == 0, listed.stderr
    (shop,) = json.loads(listed.stdout)
    assert (shop["space"], shop["entries"]) == ("shop", 10) and shop["bytes"] > 0
    table = outrig_cli("describe", "shop", "--address", server.address)
    assert table.returncode == 0, table.stderr
    assert table.stdout.startswith("space shop: 10 entries, ")
    type_row = next(line for line in table.stdout.splitlines() if line.startswith("shop.Order"))
    assert type_row.split()[:4] == ["shop.Order", "10", str(shop["bytes"]), "10"]
    assert "n(10) state(2)" in type_row
    described = json.loads(outrig_cli("describe", "shop", "--address", server.address, "--json").stdout)
    assert described["entries"] == 10 and described["types"][0]["indexes"] == {"n": 10, "state": 2}


def test_browse_pages_with_a_cursor_and_filters(server: LocalServer) -> None:
    first = outrig_cli("browse", "shop", "--address", server.address, "--type", "shop.Order", "--limit", "4")
    assert first.returncode == 0, first.stderr
    header, *rows, last = first.stdout.splitlines()
    assert header.split() == ["id", "type", "expires", "delivery", "fields"]
    assert [json.loads(row.split(None, 4)[4])["n"] for row in rows] == [0, 1, 2, 3]
    assert last.startswith("next page: --after ")
    cursor = last.split()[-1]
    rest = outrig_cli("browse", "shop", "--address", server.address, "--after", cursor, "--all", "--json")
    page = json.loads(rest.stdout)
    assert [e["fields"]["n"] for e in page["entries"]] == [4, 5, 6, 7, 8, 9] and page["next"] == 0
    paid = outrig_cli(
        "browse",
        "shop",
        "--address",
        server.address,
        "--type",
        "shop.Order",
        "--where",
        "state=paid",
        "--json",
    )
    assert [e["fields"]["n"] for e in json.loads(paid.stdout)["entries"]] == [6, 7, 8, 9]
    assert all(e["type"] == "shop.Order" and e["expires_at"] for e in json.loads(paid.stdout)["entries"])


def test_describe_and_browse_show_pending_and_delayed_deliveries(server: LocalServer) -> None:
    with outrig.connect(server.address, space="shop", retry_deadline=10.0) as space:
        delivery = space.take(Order(n=0), ack=300.0)
        assert delivery is not None
        space.write(Order(n=10, state="later"), delay=600.0)
        table = outrig_cli("describe", "shop", "--address", server.address)
        assert "deliveries in flight 1, delayed entries 1, redelivered 0, dead-lettered 0" in table.stdout
        browsed = outrig_cli("browse", "shop", "--address", server.address, "--all")
        assert browsed.returncode == 0, browsed.stderr
        cells = {int(row.split()[0]): row.split()[3] for row in browsed.stdout.splitlines()[1:-1]}
        first = cells[min(cells)]  # n=0, the oldest: the one delivered
        assert first.startswith(f"pending:receipt={delivery.receipt},deadline=")
        assert first.endswith(",deliveries=1")
        assert sum(cell.startswith("delayed:until=") for cell in cells.values()) == 1
        assert sum(cell == "-" for cell in cells.values()) == 9
        listed = json.loads(outrig_cli("browse", "shop", "--address", server.address, "--json").stdout)
        (pending,) = [e for e in listed["entries"] if e["receipt"] is not None]
        assert (pending["receipt"], pending["deliveries"], pending["fields"]["n"]) == (delivery.receipt, 1, 0)
        delivery.ack()


def test_purge_asks_unless_yes_and_counts_in_a_dry_run(server: LocalServer) -> None:
    new = ("--type", "shop.Order", "--where", "state=new")
    dry = outrig_cli("purge", "shop", "--address", server.address, *new, "--dry-run")
    assert (dry.returncode, dry.stdout.strip()) == (0, "would purge 6")
    refused = outrig_cli("purge", "shop", "--address", server.address, *new, stdin="n\n")
    assert refused.returncode == 1
    assert "purge 6 entries of shop.Order where state=new from space 'shop'? [y/N]" in refused.stderr
    nothing = outrig_cli("purge", "shop", "--address", server.address, *new)  # no answer at all
    assert nothing.returncode == 1
    confirmed = outrig_cli("purge", "shop", "--address", server.address, *new, "--max", "2", stdin="y\n")
    assert (confirmed.returncode, confirmed.stdout.strip()) == (0, "purged 2")
    scripted = outrig_cli("purge", "shop", "--address", server.address, *new, "--yes", "--json")
    assert json.loads(scripted.stdout) == {"count": 4, "dry_run": False}
    with outrig.connect(server.address, space="shop", retry_deadline=10.0) as space:
        assert space.count(Order()) == 4


def test_cancel_ends_a_registration_and_aborts_a_transaction(server: LocalServer) -> None:
    with outrig.connect(server.address, space="shop", retry_deadline=10.0) as space:
        txn = space.transaction(lease=60.0)
        assert txn.take(Order(n=1), timeout=0) == Order(n=1, state="new")
        with space.notify(Order(), lease=60.0) as events:
            done = outrig_cli(
                "cancel", "shop", "--address", server.address, "--registration", str(events.lease.id)
            )
            assert (done.returncode, done.stdout.strip()) == (0, f"registration {events.lease.id} cancelled")
            assert list(events) == []
        done = outrig_cli("cancel", "shop", "--address", server.address, "--transaction", str(txn.id))
        assert done.returncode == 0, done.stderr
        assert space.read_nowait(Order(n=1)) == Order(n=1, state="new")  # the take is undone
    missing = outrig_cli("cancel", "shop", "--address", server.address, "--registration", "424242")
    assert missing.returncode == 2 and "LeaseNotFoundError" in missing.stderr


def test_refusals_exit_2_with_the_reason(server: LocalServer, tmp_path: Path) -> None:
    alone = outrig_cli("browse", "shop", "--address", server.address, "--where", "n=1")
    assert alone.returncode == 2 and "--where needs --type" in alone.stderr
    too_big = outrig_cli("browse", "shop", "--address", server.address, "--limit", "5000")
    assert too_big.returncode == 2 and "max_entries: 5000 exceeds the limit of a page, 1000" in too_big.stderr
    policy = tmp_path / "policy.toml"
    policy.write_text(
        '[[grant]]\nprincipals = ["*"]\nresources = ["outrig://*", "outrig://*/*"]\nactions = ["read"]\n'
    )
    with LocalServer(ServerConfig(policy=policy)) as guarded:
        for command in (("describe", "shop"), ("browse", "shop"), ("purge", "shop", "--type", "T", "--yes")):
            denied = outrig_cli(*command, "--address", guarded.address)
            assert denied.returncode == 2
            assert "PermissionDeniedError" in denied.stderr and "admin outrig://shop" in denied.stderr


def test_the_commands_speak_tls_with_a_token(tmp_path: Path) -> None:
    from outrig.service.security import certs, tokens

    certs.write_dev_certificates(tmp_path)
    private, _ = tokens.write_key_pair(tmp_path)
    token = tmp_path / "token"
    token.write_text(tokens.issue_token(tokens.load_private_key(private), "ops", 3600))
    server = start_server(
        "--tls-cert", str(tmp_path / "server.pem"), "--tls-key", str(tmp_path / "server.key"),
        "--token-public-key", str(tmp_path / "token.pub"),
    )  # fmt: skip
    try:
        with outrig.connect(
            server.address, space="tls", tls=outrig.TLS(ca=tmp_path / "ca.pem"), token=token.read_text()
        ) as space:
            space.write(Order(n=1))
        secure = (
            "--address",
            server.address,
            "--tls-ca",
            str(tmp_path / "ca.pem"),
            "--token-file",
            str(token),
        )
        described = outrig_cli("describe", "tls", *secure, "--json")
        assert described.returncode == 0, described.stderr
        assert json.loads(described.stdout)["entries"] == 1
        anonymous = outrig_cli(
            "describe", "tls", "--address", server.address, "--tls-ca", str(tmp_path / "ca.pem")
        )
        assert anonymous.returncode == 2 and "UnauthenticatedError" in anonymous.stderr
    finally:
        server.stop()
