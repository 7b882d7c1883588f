"""`outrig serve --workers 2` as a user runs it: real processes on port 0, embedded with a data dir
and in memory. Spaces are spread over both workers, any port answers any call (forwarded to the
owner), Locate names the owner's own address and the SDK sends calls there; a SIGKILLed worker is
restarted while the SDK retries, with every acknowledged write kept (data dir) or none (in
memory); SIGTERM stops them all; a killed supervisor leaves no worker behind; a data dir made
for another number of workers is refused."""

from __future__ import annotations

import dataclasses
import os
import signal
import socket
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

import outrig

from ..conftest import free_port, start_server
from ..polling import scrape, wait_until
from ..worker_processes import Workers, alive, start_workers


@dataclasses.dataclass
class Job(outrig.Entry, type_name="workers.Job"):
    n: int | None = None


@pytest.fixture(scope="module", params=["data-dir", "in-memory"])
def workers(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Workers]:
    """Two workers for the module's tests (each uses spaces of its own names)."""
    data = tmp_path_factory.mktemp("workers") / "data"
    running = start_workers(2, *(["--data-dir", str(data)] if request.param == "data-dir" else []))
    running.durable = request.param == "data-dir"
    yield running
    assert running.stop() == 0


def test_spaces_spread_over_the_workers_and_any_port_answers(workers: Workers) -> None:
    spaces = [*workers.spaces_of(0, 2, prefix="spread"), *workers.spaces_of(1, 2, prefix="spread")]
    ports = [workers.public, *workers.addresses]
    for n, space in enumerate(spaces):
        with outrig.connect(workers.public, space=space, direct=False) as at_public:
            at_public.write(Job(n=n))
        owner = workers.addresses[workers.owner(space)]
        for port in ports:
            with outrig.connect(port, space=space, direct=False) as there:
                assert there.read_nowait(Job()) == Job(n=n)
                assert there.count(Job()) == 1
                location = there.locate()
                assert location.address == owner
                if port != workers.public:
                    assert location.here == (port == owner)
    # Each worker lists the spaces it serves, at its own address.
    for index, address in enumerate(workers.addresses):
        with outrig.connect(address, direct=False) as at_worker:
            listed = {p.space: p for p in at_worker.list_spaces()}
        assert all(workers.owner(s) == index for s in listed)
        assert {s for s in spaces if workers.owner(s) == index} <= set(listed)
        assert {p.address for p in listed.values()} == {address}


def test_the_sdk_sends_a_space_s_calls_to_its_worker(workers: Workers) -> None:
    (space_name,) = workers.spaces_of(1, prefix="routed")
    with outrig.connect(workers.addresses[0], space=space_name) as space:
        space.write(Job(n=1))
        assert space.target == workers.addresses[1]  # straight to the owner, no forwarding hop
        assert space.take_nowait(Job()) == Job(n=1)


def test_through_the_shared_port_the_sdk_goes_to_the_worker_s_own_port(workers: Workers) -> None:
    """Whichever worker a connection to the public port reaches, a space's calls go to its owner's
    own port (LocateReply.shared_address), so that a reconnection landing on the other worker
    costs no forwarding hop."""
    for owner in (0, 1):
        (space_name,) = workers.spaces_of(owner, prefix="shared")
        with outrig.connect(workers.public, space=space_name) as space:
            space.write(Job(n=owner))
            assert space.target == workers.addresses[owner]
            assert space.take_nowait(Job()) == Job(n=owner)


def test_streams_blocking_calls_and_transactions_cross_the_workers() -> None:
    """Through the port of the worker that does not serve the space (`direct=False`: forwarded):
    a blocking take woken by a write through the other port, a notify stream, contents, and a
    transaction that commits."""
    workers = start_workers(2)
    try:
        (name,) = workers.spaces_of(1)
        with (
            outrig.connect(workers.addresses[0], space=name, direct=False) as through,
            outrig.connect(workers.addresses[1], space=name, direct=False) as at_owner,
            through.notify(Job()) as events,
        ):
            taken: list[object] = []
            taker = threading.Thread(target=lambda: taken.append(through.take(Job(n=1), timeout=20)))
            taker.start()
            wait_for_waiters_of(workers, name)
            at_owner.write(Job(n=1))
            taker.join(30)
            assert taken == [Job(n=1)]
            assert next(iter(events)).entry == Job(n=1)
            with through.transaction() as txn:
                txn.write_many([Job(n=2), Job(n=3)])
                assert at_owner.count(Job()) == 0
            assert sorted(j.n or 0 for j in through.contents(Job()) if isinstance(j, Job)) == [2, 3]
    finally:
        assert workers.stop() == 0


def wait_for_waiters_of(workers: Workers, space: str) -> None:
    """Wait until the owner of `space` has one read or take parked in it (its ListSpaces cannot
    say; its describe can)."""
    owner = workers.addresses[workers.owner(space)]
    with outrig.connect(owner, space=space, direct=False) as at_owner:
        wait_until(lambda: at_owner.describe().waiters == 1, what="a parked take")


def test_a_killed_worker_is_restarted_while_the_sdk_retries(workers: Workers) -> None:
    durable = workers.durable
    (kept,) = workers.spaces_of(0, prefix="kept")
    (killed,) = workers.spaces_of(1, prefix="killed")
    with (
        outrig.connect(workers.public, space=kept, direct=False) as on_kept,
        outrig.connect(workers.public, space=killed, direct=False) as on_killed,
        outrig.connect(workers.addresses[0], space=killed) as routed,
    ):
        on_kept.write_many([Job(n=n) for n in range(5)])
        on_killed.write_many([Job(n=n) for n in range(5)])
        assert routed.count(Job()) == 5 and routed.target == workers.addresses[1]
        old = workers.pids[1]
        os.kill(old, signal.SIGKILL)
        # Calls during the restart are retried by the SDK until the restarted worker serves:
        # forwarded by whichever worker the public port reached, or sent to the worker directly.
        on_killed.write(Job(n=99))
        routed.write(Job(n=100))
        new = workers.wait_restarted(1)
        assert new != old and alive(new) and not alive(old)
        assert on_kept.count(Job()) == 5
        expected = [*range(5), 99, 100] if durable else [99, 100]
        taken = on_killed.take_many(Job(), max_entries=100)
        assert sorted(j.n or 0 for j in taken if isinstance(j, Job)) == expected
    assert f"worker-1 (pid {old}) ended by signal SIGKILL" in workers.server.log.read_text()


def test_sigterm_stops_every_worker_and_sighup_reaches_each(tmp_path: Path) -> None:
    workers = start_workers(2)
    workers.server.process.send_signal(signal.SIGHUP)
    wait_until(
        lambda: workers.server.log.read_text().count("SIGHUP: no policy file configured") == 2,
        what="both workers logged the SIGHUP",
    )
    assert workers.stop() == 0
    assert not any(alive(pid) for pid in workers.pids)


def test_a_killed_supervisor_leaves_no_worker_behind() -> None:
    workers = start_workers(2)
    workers.server.process.kill()
    workers.server.process.wait()
    wait_until(lambda: not any(alive(pid) for pid in workers.pids), what="both workers ended")
    workers.stop()


def _outrig(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "outrig.service", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)


def _serve(*args: str) -> subprocess.CompletedProcess[str]:
    return _outrig("serve", "--listen", "127.0.0.1:0", *args)


def test_a_data_dir_of_another_number_of_workers_is_refused(tmp_path: Path) -> None:
    data = tmp_path / "data"
    workers = start_workers(2, "--data-dir", str(data))
    with outrig.connect(workers.public, space="kept", direct=False) as space:
        space.write(Job(n=1))
    assert workers.stop() == 0
    three = _serve("--workers", "3", "--data-dir", str(data))
    assert three.returncode == 2
    assert "was started with --workers 2, not 3" in three.stderr and "start with --workers 2" in three.stderr
    one = _serve("--workers", "1", "--data-dir", str(data))
    assert one.returncode == 2 and "holds the stores of 2 workers" in one.stderr
    # `outrig check` checks each worker's store; `outrig backup` copies each, and the copy serves.
    checked = _outrig("check", str(data))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "worker 0 (" in checked.stdout and "worker 1 (" in checked.stdout
    assert checked.stdout.count("check: ok") == 2
    copy = tmp_path / "copy"
    copied = _outrig("backup", str(data), str(copy))
    assert copied.returncode == 0, copied.stdout + copied.stderr
    assert (copy / "workers" / "1" / "outrig.db").exists() and (copy / "workers.json").exists()
    # Started again with its own number, it has what it had.
    again = start_workers(2, "--data-dir", str(copy))
    with outrig.connect(again.public, space="kept", direct=False) as space:
        assert space.read_nowait(Job()) == Job(n=1)
    assert again.stop() == 0


def test_a_single_process_data_dir_is_refused_to_workers(tmp_path: Path) -> None:
    data = tmp_path / "single"
    lone = start_server("--data-dir", str(data))
    with outrig.connect(lone.address, space="kept") as space:
        space.write(Job(n=1))
    assert lone.stop() == 0
    refused = _serve("--workers", "2", "--data-dir", str(data))
    assert refused.returncode == 2
    assert "holds the store of a single process; --workers 2 cannot serve it" in refused.stderr


def _free_pair() -> int:
    """A loopback port p such that p and p + 1 are free now."""
    port = free_port()
    while not _free(port + 1):
        port = free_port()
    return port


def test_each_worker_serves_its_metrics_and_the_sdk_skips_the_forwarding_hop() -> None:
    metrics, console = _free_pair(), free_port()
    workers = start_workers(
        2, "--metrics-listen", f"127.0.0.1:{metrics}", "--console", f"127.0.0.1:{console}"
    )
    try:
        # The console is worker 0's.
        with urllib.request.urlopen(f"http://127.0.0.1:{console}/", timeout=10) as page:
            assert page.status == 200 and b"outrig" in page.read()
        assert "[worker-0]" in next(
            line for line in workers.server.log.read_text().splitlines() if "console on http://" in line
        )
        (space_name,) = workers.spaces_of(1)

        def forwarded() -> float:
            samples = [scrape(f"127.0.0.1:{metrics + i}") for i in range(2)]
            return sum(v for s in samples for k, v in s.items() if k.startswith("outrig_routed_calls_total"))

        # Through worker 0's own port, the SDK asks Locate and sends the space's calls to worker
        # 1's: at most the first call (sent before Locate answered) is forwarded.
        with outrig.connect(workers.addresses[0], space=space_name) as space:
            for n in range(20):
                space.write(Job(n=n))
            assert space.count(Job()) == 20
        assert forwarded() <= 1
        before = forwarded()
        with outrig.connect(workers.addresses[0], space=space_name, direct=False) as through:
            for _ in range(5):
                assert through.count(Job()) == 20
        assert forwarded() == before + 5  # without routing, worker 0 forwards each
        with outrig.connect(workers.public, space=space_name) as space:
            assert space.count(Job()) == 20
        scrapes = [scrape(f"127.0.0.1:{metrics + i}") for i in range(2)]
        assert scrapes[1][f'outrig_entries{{space="{space_name}",type="workers.Job"}}'] == 20
        assert not any(key.startswith(f'outrig_entries{{space="{space_name}"') for key in scrapes[0])
        assert scrapes[1]['outrig_requests_total{code="OK",method="Write"}'] == 20
    finally:
        assert workers.stop() == 0


def test_given_ports_are_the_listen_port_and_the_next_ones_and_must_be_free() -> None:
    port = free_port()
    while not all(_free(port + i) for i in (1, 2)):
        port = free_port()
    workers = start_workers(2, "--listen", f"127.0.0.1:{port}")
    try:
        assert workers.public == f"127.0.0.1:{port}"
        assert workers.addresses == [f"127.0.0.1:{port + 1}", f"127.0.0.1:{port + 2}"]
        # A second supervisor on the same port is refused, not let in to share it.
        refused = _serve("--workers", "2", "--listen", f"127.0.0.1:{port}")
        assert refused.returncode == 2 and f"listen: cannot bind 127.0.0.1:{port}" in refused.stderr
        with outrig.connect(workers.public, space="given", direct=False) as space:
            space.write(Job(n=1))
            assert space.count(Job()) == 1
    finally:
        assert workers.stop() == 0


def _free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def test_a_worker_that_cannot_start_stops_them_all_with_its_status() -> None:
    refused = _serve("--workers", "2", "--listen", "0.0.0.0:0")
    assert refused.returncode == 2
    assert "refusing to serve on 0.0.0.0 without authentication" in refused.stderr
    assert "a worker ended (status 2) before it served: stopping" in refused.stderr
