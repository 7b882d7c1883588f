"""The pure parts of `outrig serve --workers N` (service/workers.py): where a name is served, the
`workers` setting, a worker's role in its environment, and the data dir's record of N."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from outrig.service.config import load_config
from outrig.service.engine.partitions import partition_name
from outrig.service.exceptions import ConfigError
from outrig.service.supervisor import RESTART_BACKOFF_MAX, RESTART_RESET, Supervisor, restart_delay
from outrig.service.workers import (
    SECRET_VARIABLE,
    WorkerRole,
    check_layout,
    cores,
    cpu_quota,
    record_workers,
    recorded_workers,
    resolve_workers,
    worker_of,
)


@pytest.mark.parametrize("count", [2, 3, 4, 7])
def test_the_partitions_of_a_space_land_one_per_worker(count: int) -> None:
    for space in ("jobs", "orders", "x"):
        placed = [worker_of(partition_name(space, k), count) for k in range(count)]
        assert sorted(placed) == list(range(count))
        # A space of P = 2N partitions: two on each worker.
        twice = Counter(worker_of(partition_name(space, k), count) for k in range(2 * count))
        assert set(twice.values()) == {2}


def test_names_spread_over_the_workers_and_stay_where_they_are() -> None:
    names = [f"space-{n}" for n in range(4000)]
    placed = Counter(worker_of(name, 4) for name in names)
    assert set(placed) == {0, 1, 2, 3}
    assert all(800 < n < 1200 for n in placed.values()), placed
    # Stable: the same in every process (BLAKE2b, not Python's salted hash).
    assert [worker_of(name, 4) for name in ("jobs", "default", "a")] == [
        worker_of(name, 4) for name in ("jobs", "default", "a")
    ]
    assert {worker_of(name, 1) for name in names} == {0}
    assert worker_of("jobs~x", 3) == worker_of("jobs~x", 3)  # not a partition's name: a name


def test_the_workers_setting() -> None:
    assert load_config(environ={}).workers == 1
    assert load_config(environ={"OUTRIG_WORKERS": "auto"}).workers == 0
    assert load_config(environ={}, flags={"workers": "3"}).workers == 3
    assert resolve_workers(0) == cores() >= 1
    assert resolve_workers(5) == 5
    with pytest.raises(
        ConfigError, match=r"server\.workers: invalid value 'two' \(expected a number of processes"
    ):
        load_config(environ={"OUTRIG_WORKERS": "two"})
    with pytest.raises(ConfigError, match="300 workers"):
        Supervisor(load_config(environ={}), ["serve"], 300)


def test_a_role_travels_in_the_environment_and_its_secret_is_removed() -> None:
    role = WorkerRole(
        1, 2, "127.0.0.1:7480", ("127.0.0.1:7481", "127.0.0.1:7482"), "s3cret", 42, Path("/d/1")
    )
    environ = role.to_environ()
    assert "s3cret" not in environ["OUTRIG_WORKER_ROLE"]
    assert WorkerRole.from_environ(environ) == role
    assert SECRET_VARIABLE not in environ and not environ
    assert role.address == "127.0.0.1:7482" and role.name == "worker-1"
    assert WorkerRole.from_environ({}) is None
    with pytest.raises(ConfigError, match="OUTRIG_WORKER_ROLE: not a worker's role"):
        WorkerRole.from_environ({"OUTRIG_WORKER_ROLE": "{", SECRET_VARIABLE: "s"})
    incomplete = role.to_environ()
    del incomplete[SECRET_VARIABLE]
    with pytest.raises(ConfigError, match="incomplete"):
        WorkerRole.from_environ(incomplete)


def test_a_data_dir_records_its_workers(tmp_path: Path) -> None:
    check_layout(tmp_path, 1)  # a new data dir suits anyone
    check_layout(tmp_path, 4)
    record_workers(tmp_path, 2)
    assert recorded_workers(tmp_path) == 2
    check_layout(tmp_path, 2)
    with pytest.raises(ConfigError, match=r"was started with --workers 2, not 3.*start with --workers 2"):
        check_layout(tmp_path, 3)
    with pytest.raises(ConfigError, match=r"holds the stores of 2 workers.*--workers 1"):
        check_layout(tmp_path, 1)
    single = tmp_path / "single"
    single.mkdir()
    (single / "outrig.db").write_bytes(b"")
    check_layout(single, 1)
    with pytest.raises(ConfigError, match="store of a single process; --workers 2 cannot serve it"):
        check_layout(single, 2)
    (tmp_path / "workers.json").write_text('{"workers": "many"}')
    with pytest.raises(ConfigError, match="not a record of workers"):
        recorded_workers(tmp_path)


def test_a_cgroup_cpu_quota_caps_one_worker_per_core(tmp_path: Path) -> None:
    cpu_max = tmp_path / "cpu.max"
    for text, whole in (
        ("max 100000\n", None),
        ("200000 100000\n", 2),
        ("250000 100000", 2),
        ("50000 100000", 1),
    ):
        cpu_max.write_text(text)
        assert cpu_quota(cpu_max) == whole
    cpu_max.write_text("nonsense")
    assert cpu_quota(cpu_max) is None
    assert cpu_quota(tmp_path / "absent") is None


def test_restarts_back_off_to_a_bound_and_start_over_after_a_while() -> None:
    backoff, delays = 0.1, []
    for _ in range(10):  # a worker that ends at once, again and again
        delay, backoff = restart_delay(backoff, ran=0.5)
        delays.append(delay)
    assert delays[:4] == [0.1, 0.2, 0.4, 0.8]
    assert max(delays) == RESTART_BACKOFF_MAX == delays[-1]
    assert restart_delay(backoff, ran=RESTART_RESET) == (0.1, 0.2)  # it had served a while
