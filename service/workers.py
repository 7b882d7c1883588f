"""One worker of `outrig serve --workers N`: who it is, where it and the others listen, and which
spaces are its own (docs/architecture.md, "Workers").

The supervisor (service/supervisor.py) starts each worker as `outrig serve` again, with its
`WorkerRole` in the environment: OUTRIG_WORKER_ROLE (JSON: its index, the workers' count, the
public listen address every worker shares through SO_REUSEPORT, each worker's own address, its
data dir and metrics address, the supervisor's pid) and OUTRIG_WORKER_SECRET (what a worker
presents on a call it forwards to another; never on a command line, where `ps` shows it).
`WorkerRole.from_environ` reads both and removes the secret from the environment, so that nothing
the worker starts inherits it.

`worker_of` places a name on a worker by a stable hash: the k partitions of one space ("S~k",
engine/partitions.py) go to (hash(S) + k) mod N, so that P = N partitions land one per worker;
any other name to hash(name) mod N. It is pure and shared by every worker, so each one knows,
without asking, which worker serves any space.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from outrig.service.engine.partitions import split_name
from outrig.service.exceptions import ConfigError

ROLE_VARIABLE = "OUTRIG_WORKER_ROLE"
SECRET_VARIABLE = "OUTRIG_WORKER_SECRET"


def _hash(name: str) -> int:
    return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "big")


def worker_of(name: str, count: int) -> int:
    """The worker (0 <= i < count) that serves the space or partition `name`."""
    if count == 1:
        return 0
    space, k = split_name(name)
    if k is None:
        return _hash(name) % count
    return (_hash(space) + k) % count


#: cgroup v2's CPU quota of this process's cgroup, as a container sees it ("max 100000": none).
CPU_MAX = Path("/sys/fs/cgroup/cpu.max")


def cpu_quota(path: Path = CPU_MAX) -> int | None:
    """The whole CPUs a cgroup v2 quota allows (rounded down, at least 1); None: no quota."""
    try:
        quota, period = path.read_text().split()[:2]
        if quota == "max":
            return None
        return max(1, int(quota) // int(period))
    except (OSError, ValueError):
        return None


def cores() -> int:
    """The cores this process may use: its CPU affinity, and no more than its cgroup's CPU
    quota (a container's CPU limit), at least 1."""
    try:
        affinity = max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        affinity = max(1, os.cpu_count() or 1)
    quota = cpu_quota()
    return affinity if quota is None else min(affinity, quota)


def resolve_workers(workers: int) -> int:
    """`workers` as configured (0: one per core) as a count of processes."""
    return cores() if workers == 0 else workers


@dataclass(frozen=True, slots=True)
class WorkerRole:
    """What the supervisor tells worker `index` of `count`."""

    index: int
    count: int
    public: str  # HOST:PORT every worker listens on (SO_REUSEPORT)
    addresses: tuple[str, ...]  # each worker's own HOST:PORT, where Locate and peers send calls
    secret: str  # presented on forwarded calls between the workers
    supervisor: int  # the supervisor's pid: a worker whose parent is another ends
    data_dir: Path | None = None  # this worker's own store (DATA_DIR/workers/<index>)
    metrics_listen: str = ""
    console: str = ""  # worker 0 serves the console, if one is configured

    @property
    def address(self) -> str:
        """This worker's own address."""
        return self.addresses[self.index]

    @property
    def name(self) -> str:
        return f"worker-{self.index}"

    def to_environ(self) -> dict[str, str]:
        """The environment variables that hand this role to a worker."""
        fields = dataclasses.asdict(self)
        secret = fields.pop("secret")
        fields["data_dir"] = None if self.data_dir is None else str(self.data_dir)
        return {ROLE_VARIABLE: json.dumps(fields), SECRET_VARIABLE: secret}

    @classmethod
    def from_environ(cls, environ: MutableMapping[str, str] | None = None) -> WorkerRole | None:
        """The role the supervisor gave this process (None: it is no worker); the secret is
        removed from `environ` (default: this process's environment)."""
        environ = os.environ if environ is None else environ
        text = environ.pop(ROLE_VARIABLE, None)
        secret = environ.pop(SECRET_VARIABLE, "")
        if text is None:
            return None
        try:
            fields: dict[str, Any] = json.loads(text)
            fields["addresses"] = tuple(fields["addresses"])
            fields["data_dir"] = None if fields.get("data_dir") is None else Path(fields["data_dir"])
            role = cls(secret=secret, **fields)
        except (ValueError, TypeError, KeyError) as err:
            raise ConfigError(
                f"{ROLE_VARIABLE}: not a worker's role from `outrig serve --workers`: {err}"
            ) from None
        if not secret or not 0 <= role.index < role.count == len(role.addresses):
            raise ConfigError(
                f"{ROLE_VARIABLE}: an incomplete worker's role (index, count, addresses, secret)"
            )
        return role


# ---------------------------------------------------------------- the data dir of N workers
#
#     DATA_DIR/workers.json      {"workers": N}: written when the first N workers start
#     DATA_DIR/outrig.lock       held by the supervisor while it runs
#     DATA_DIR/workers/<i>/      worker i's own store (outrig.db, outrig.lock), as a lone server's
#
# A name's worker depends on N (`worker_of`), so the stores of N workers are only right for N:
# another N is refused (`check_layout`) rather than serving each space from a store that may not
# hold it.

RECORD_NAME = "workers.json"
SINGLE_STORE = "outrig.db"  # a lone server's store (backends/embedded/store/schema.py's DB_NAME)


def worker_data_dir(data_dir: Path, index: int) -> Path:
    return data_dir / "workers" / str(index)


def recorded_workers(data_dir: Path) -> int | None:
    """The N a data dir was started with by `--workers N` (None: never by a supervisor)."""
    try:
        text = (data_dir / RECORD_NAME).read_text()
    except (FileNotFoundError, NotADirectoryError):  # no record (or no data dir): what holds it says
        return None
    except OSError as err:
        raise ConfigError(f"data dir {data_dir}: cannot read {RECORD_NAME}: {err}") from None
    try:
        count = json.loads(text)["workers"]
        if not isinstance(count, int) or isinstance(count, bool) or count < 1:
            raise ValueError(count)
    except (ValueError, TypeError, KeyError):
        raise ConfigError(
            f"data dir {data_dir}: {RECORD_NAME} is not a record of workers: {text[:64]!r}"
        ) from None
    return count


def check_layout(data_dir: Path, workers: int) -> None:
    """Refuse to serve `data_dir` with `workers` processes (1: a lone server) if it was made for
    another number, naming both and what to do."""
    recorded = recorded_workers(data_dir)
    if workers == 1 and recorded is not None:
        raise ConfigError(
            f"data dir {data_dir} holds the stores of {recorded} workers (its {RECORD_NAME}); a "
            f"single process (--workers 1) cannot serve it: start with --workers {recorded}"
        )
    if workers > 1 and recorded is None and (data_dir / SINGLE_STORE).exists():
        raise ConfigError(
            f"data dir {data_dir} holds the store of a single process; --workers {workers} cannot "
            "serve it: start with --workers 1, or give the workers a new data dir"
        )
    if workers > 1 and recorded is not None and recorded != workers:
        raise ConfigError(
            f"data dir {data_dir} was started with --workers {recorded}, not {workers}: a space's "
            f"worker depends on the number of workers, so its stores serve {recorded} workers only; "
            f"start with --workers {recorded}, or give {workers} workers a new data dir"
        )


def record_workers(data_dir: Path, workers: int) -> None:
    """Write DATA_DIR/workers.json (atomically: a crash leaves the old one or the new one)."""
    data_dir.mkdir(parents=True, exist_ok=True)
    partial = data_dir / f"{RECORD_NAME}.partial"
    with partial.open("w") as file:
        json.dump({"workers": workers}, file)
        file.flush()
        os.fsync(file.fileno())
    os.replace(partial, data_dir / RECORD_NAME)
