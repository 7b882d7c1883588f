"""The web console end to end: a real server (`outrig serve --console`, TLS, bearer tokens and a
policy) and Debian's chromium, headless, driven by Playwright. It loads, shows a space the test
wrote, browses its entries page by page, tails its writes live, shows the calls per method, and
refuses a caller without the admin grant."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, expect, sync_playwright

import outrig
from outrig.service.security import certs, tokens

from ..conftest import ServerProcess, free_port, missing_tool, start_server
from ..polling import wait_until

CHROMIUM = Path("/usr/bin/chromium")
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
POLICY = """
[[grant]]
principals = ["alice"]
resources = ["outrig://*", "outrig://*/*"]
actions = ["*"]

[[grant]]
principals = ["bob"]
resources = ["outrig://*", "outrig://*/*"]
actions = ["read", "write", "take", "notify"]
"""


@dataclass
class Order(outrig.Entry, type_name="console.Order"):
    n: int | None = None
    note: str | None = None


@dataclass
class Console:
    server: ServerProcess
    url: str
    dir: Path
    key: object

    def token(self, principal: str) -> str:
        return tokens.issue_token(self.key, principal, 3600)  # type: ignore[arg-type]

    def space(self, principal: str = "alice") -> outrig.Space:
        tls = outrig.TLS(ca=self.dir / "ca.pem")
        return outrig.connect(self.server.address, space="shop", tls=tls, token=self.token(principal))


@pytest.fixture(scope="module")
def console(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Console]:
    directory = tmp_path_factory.mktemp("console")
    certs.write_dev_certificates(directory)
    private, _ = tokens.write_key_pair(directory)
    (directory / "policy.toml").write_text(POLICY)
    port = free_port()
    server = start_server(
        "--tls-cert", str(directory / "server.pem"), "--tls-key", str(directory / "server.key"),
        "--token-public-key", str(directory / "token.pub"), "--policy", str(directory / "policy.toml"),
        "--console", f"127.0.0.1:{port}",
    )  # fmt: skip
    try:
        yield Console(server, f"http://127.0.0.1:{port}", directory, tokens.load_private_key(private))
    finally:
        assert server.stop() == 0


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if not CHROMIUM.exists():
        missing_tool("Debian's chromium", "chromium")
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        yield launched
        launched.close()


def _log_in(page: Page, console: Console, principal: str) -> None:
    page.goto(console.url + "/")
    expect(page.locator("h1")).to_have_text("UNAUTHENTICATED")  # no token yet
    page.click("text=give a token")
    page.fill("#login textarea", console.token(principal))
    page.click("#login button")


def test_the_console_shows_browses_and_tails_a_space(console: Console, browser: Browser) -> None:
    with console.space() as space:
        space.write_many([Order(n=i, note="first" if i == 0 else None) for i in range(60)])
        page = browser.new_page()
        _log_in(page, console, "alice")
        expect(page.locator("h1")).to_have_text("Spaces")
        row = page.locator("#spaces tbody tr", has_text="shop")
        expect(row.locator("td").nth(1)).to_have_text("60")

        # The calls panel polls the server's own metrics through htmx.
        expect(page.locator("#rates")).to_contain_text("WriteMany", timeout=15_000)

        row.locator("a").click()
        expect(page.locator("h1")).to_have_text("Space shop")
        types = page.locator("#types tbody tr", has_text="console.Order")
        expect(types.locator("td").nth(1)).to_have_text("60")
        expect(types).to_contain_text("n (60)")

        types.locator("text=browse").click()
        entries = page.locator("#entries tr.entry")
        expect(entries).to_have_count(50)  # a page
        expect(entries.first.locator("td.fields")).to_have_text('{"n": 0, "note": "first"}')
        page.click("#more button")  # htmx fetches the next page into the table
        expect(entries).to_have_count(60)
        expect(page.locator("#more")).to_have_count(0)

        page.goto(console.url + "/spaces/shop/tail?type=console.Order")
        expect(page.locator("#tail-state")).to_have_text(re.compile("tailing"), timeout=15_000)
        space.write(Order(n=1000, note="live"))
        expect(page.locator("#tail-rows tr.event")).to_contain_text('"note": "live"', timeout=15_000)
        assert space.count(Order()) == 61  # the console took nothing
        assert space.describe().registrations == 1  # the tail's
        page.close()
        # The browser went away: the tail's handler is cancelled and its registration ends.
        wait_until(lambda: space.describe().registrations == 0 or None, what="the tail's registration to end")


def test_the_console_shows_deliveries_in_flight_and_delayed_entries(
    console: Console, browser: Browser
) -> None:
    with console.space() as space:
        space.take_many(Order(), max_entries=1000, timeout=0)  # what the other test left
        space.write_many([Order(n=i) for i in range(3)])
        space.write(Order(n=99), delay=3600.0)
        held = space.take(Order(n=1), timeout=0, ack=600.0)
        assert held is not None
        page = browser.new_page()
        _log_in(page, console, "alice")
        page.goto(console.url + "/spaces/shop")
        expect(page.locator("#deliveries")).to_contain_text("1 in flight")
        expect(page.locator("#deliveries")).to_contain_text("1 delayed")
        expect(page.locator("#change-log")).to_contain_text("changes held")  # the space's change log
        page.goto(console.url + "/spaces/shop/browse?type=console.Order")
        row = page.locator("#entries tr.entry", has_text='{"n": 1,')
        expect(row).to_contain_text(f"in flight: delivery 1, receipt {held.receipt}")
        expect(page.locator("#entries tr.entry", has_text='{"n": 99,')).to_contain_text("delayed until")
        page.close()
        held.ack()
        space.take_many(Order(), max_entries=1000, timeout=0)


def test_the_console_refuses_a_caller_without_the_admin_grant(console: Console, browser: Browser) -> None:
    with console.space("bob") as space:
        space.write(Order(n=1))  # bob may write, not administer
    page = browser.new_page()
    _log_in(page, console, "bob")
    expect(page.locator("h1")).to_have_text("PERMISSION_DENIED")
    expect(page.locator("#refusal")).to_contain_text("'bob' may not admin outrig://*")
    for path in (
        "/spaces/shop",
        "/spaces/shop/browse?type=console.Order",
        "/spaces/shop/tail?type=console.Order",
    ):
        response = page.goto(console.url + path)
        assert response is not None and response.status == 403, path
        expect(page.locator("#refusal")).to_contain_text("'bob' may not admin outrig://shop")
    page.close()
    denials = wait_until(
        lambda: "principal='bob' action=admin" in console.server.log.read_text() or None,
        what="the denial in the server's log",
    )
    assert denials


def test_the_console_serves_its_script_itself() -> None:
    """No external network at run time: htmx is the package's own static file."""
    from outrig.service.transport import console

    static = Path(console.__file__).parent / "static"
    assert (static / "htmx.min.js").stat().st_size > 40_000
    for template in (Path(console.__file__).parent / "templates").glob("*.html"):
        assert not re.search(r"""(src|href)=["']https?://""", template.read_text()), template.name


def test_a_console_beyond_loopback_needs_authentication() -> None:
    refused = subprocess.run(
        [
            sys.executable,
            "-m",
            "outrig.service",
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--console",
            "0.0.0.0:0",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert refused.returncode == 2
    assert "console: refusing to serve on 0.0.0.0 without authentication" in refused.stderr
