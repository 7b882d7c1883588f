"""Server configuration: defaults < config file (TOML) < OUTRIG_* environment < command-line flags.

A config file looks like:

    listen = "127.0.0.1:7480"
    max_message_bytes = 16777216

    [limits]
    max_fields = 256

    [space_defaults]
    fifo = true
    max_entries = 1000000

    [spaces.jobs]          # overrides for the space named "jobs"
    max_entries = 5000

    [spaces.tasks]         # "tasks" in 4 partitions by the value of its entries' "region"
    partition_by = "region"
    partitions = 4
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from outrig.service.engine.leases import MAX_LEASE_SECONDS
from outrig.service.engine.partitions import MAX_PARTITIONS, Partitioning, split_name
from outrig.service.engine.space import SpaceSettings
from outrig.service.exceptions import ConfigError
from outrig.service.workers import WorkerRole

#: A space's name: letters, digits, '.', '_', '-', starting with a letter or digit (the codec
#: checks a request's with it too; a partition's adds "~k").
SPACE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")

DEFAULT_LISTEN = "127.0.0.1:7480"


@dataclass(frozen=True, slots=True)
class Limits:
    """Per-request limits; a request beyond one is refused with INVALID_ARGUMENT or RESOURCE_EXHAUSTED."""

    max_fields: int = 256  # fields per entry or template
    max_depth: int = 32  # nesting of lists and maps
    max_name_length: int = 256  # type, field and space names
    max_templates: int = 64  # templates per request
    max_batch: int = 10_000  # entries per write_many, take_many, read_many
    max_spaces: int = 1024  # named spaces per server
    max_timeout: float = 7 * 24 * 3600.0  # longest a read or take may block
    notify_queue: int = 10_000  # undelivered events per registration before dropping
    max_waiters: int = 100_000  # blocked reads and takes parked per space
    max_registrations: int = 10_000  # notify registrations per space
    contents_chunk: int = 256  # entries per contents message
    max_stream_ops: int = 1024  # operations in flight on one Mux stream
    max_ack: float = 43_200.0  # longest acknowledgement deadline of a take (seconds), and extension
    max_receipts: int = 1000  # receipts per batch ack, or settled by one take


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """Everything `outrig serve` needs."""

    listen: str = DEFAULT_LISTEN
    backend: str = "embedded"  # "embedded" (memory, or SQLite in data_dir) or "postgres" (dsn)
    dsn: str = ""  # the PostgreSQL database of the postgres backend (postgresql://...)
    # The postgres backend's tier (docs/postgres.md): the address other servers and the SDK reach
    # this server at (empty: the bound listen address, or this host's name for a wildcard), and
    # the seconds a space's ownership lasts unrenewed (renewed every third of it).
    advertise: str = ""
    owner_lease: float = 3.0
    data_dir: Path | None = None  # None: spaces live in memory only
    in_memory: bool = False  # ignore data_dir: ephemeral spaces
    durability: str = "always"  # "always": reply once durable; "interval": commit every commit_interval_ms
    commit_interval_ms: int = 20
    request_window: float = 120.0  # seconds a request id is remembered for retries
    max_message_bytes: int = 16 * 1024 * 1024
    grace_seconds: float = 5.0
    # Seconds the server must be idle before it gives freed memory back to the system (0: never);
    # see service/process.py.
    idle_release_seconds: float = 60.0
    # "auto": tcmalloc if installed, "tcmalloc", or "glibc" (service/process.py, run_on_allocator).
    allocator: str = "auto"
    reap_interval: float = 0.5
    reap_batch: int = 1000
    log_level: str = "INFO"
    log_format: str = "text"  # "text", or "json": one JSON object per line
    metrics_listen: str = ""  # HOST:PORT for Prometheus' /metrics; empty: no metrics
    console: str = ""  # HOST:PORT of the web console (docs/operations.md); empty: none
    # Security (docs/security.md): TLS, mutual TLS, bearer tokens, a grant policy.
    tls_cert: Path | None = None  # server certificate chain (PEM); with tls_key, the server speaks TLS
    tls_key: Path | None = None
    tls_client_ca: Path | None = None  # CA of client certificates: mutual TLS
    token_public_key: Path | None = None  # Ed25519 public key (PEM) of bearer tokens
    token_audience: str = "outrig"
    policy: Path | None = None  # TOML grant policy; without one, any authenticated caller may do anything
    insecure: bool = False  # allow listening beyond loopback without TLS or authentication
    policy_poll_interval: float = 1.0  # seconds between checks of the policy file for changes
    # `outrig serve --workers N` (service/supervisor.py): processes serving this machine's spaces
    # (0, or "auto": one per core this process may use; 1: this process alone, as ever).
    workers: int = 1
    # Set in a worker's own process only (from its environment, service/workers.py): who it is.
    worker: WorkerRole | None = None
    limits: Limits = field(default_factory=Limits)
    space_defaults: SpaceSettings = field(default_factory=SpaceSettings)
    spaces: Mapping[str, SpaceSettings] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # A partitioned space's dead-letter space is partitioned alike (`_with_dead_letters`).
        if any(settings.partitions > 1 for settings in self.spaces.values()):
            object.__setattr__(self, "spaces", _with_dead_letters(self.spaces))

    def space_settings(self, name: str) -> SpaceSettings:
        """The settings of a space, or of the space a partition ("jobs~3") is of."""
        found = self.spaces.get(name)
        if found is None:
            found = self.spaces.get(split_name(name)[0], self.space_defaults)
        return found

    def partitioning(self, space: str) -> Partitioning | None:
        """How `space` is partitioned; None: it is one partition (unpartitioned)."""
        settings = self.spaces.get(space)
        if settings is None or settings.partitions == 1:
            return None
        return Partitioning(settings.partition_by, settings.partitions)


_SCALARS = (
    "listen",
    "backend",
    "dsn",
    "advertise",
    "owner_lease",
    "data_dir",
    "in_memory",
    "durability",
    "commit_interval_ms",
    "request_window",
    "max_message_bytes",
    "grace_seconds",
    "idle_release_seconds",
    "allocator",
    "reap_interval",
    "reap_batch",
    "log_level",
    "log_format",
    "metrics_listen",
    "console",
    "tls_cert",
    "tls_key",
    "tls_client_ca",
    "token_public_key",
    "token_audience",
    "policy",
    "insecure",
    "policy_poll_interval",
    "workers",
)

_BACKENDS = frozenset({"embedded", "postgres"})
_PATHS = frozenset({"data_dir", "tls_cert", "tls_key", "tls_client_ca", "token_public_key", "policy"})


# Settings where zero (or less) would stop the server working: a reaper that spins, chunks of
# nothing, leases that end as they start. Quotas (max_entries, max_bytes) may be zero.
_POSITIVE = frozenset(
    {
        "max_message_bytes",
        "commit_interval_ms",
        "owner_lease",
        "request_window",
        "reap_interval",
        "reap_batch",
        "policy_poll_interval",
        "max_fields",
        "max_depth",
        "max_name_length",
        "max_templates",
        "max_batch",
        "max_spaces",
        "max_timeout",
        "notify_queue",
        "max_waiters",
        "max_registrations",
        "contents_chunk",
        "max_stream_ops",
        "max_ack",
        "max_receipts",
        "default_lease",
        "max_lease",
        "partitions",
        "changes_max_count",
        "changes_max_age",
        "changes_max_bytes",
    }
)
# Lease durations: finite ones at most the engine's maximum (inf is FOREVER).
_LEASES = frozenset({"default_lease", "max_lease"})
_DURABILITY = ("always", "interval")
_LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def _number(value: Any, whole: bool) -> int | float:
    if isinstance(value, bool):
        raise ValueError(value)
    if isinstance(value, str):
        return int(value) if whole else float(value)
    if whole and isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, int) or (not whole and isinstance(value, float)):
        return value
    raise ValueError(value)


def _indexes(section: str, value: Any) -> tuple[tuple[str, str], ...]:
    """A space's declared ordered indexes: a list of [type, field] pairs of non-empty strings."""
    pairs = value if isinstance(value, list) else None
    if pairs is None or not all(
        isinstance(pair, list) and len(pair) == 2 and all(isinstance(n, str) and n for n in pair)
        for pair in pairs
    ):
        raise ConfigError(
            f"{section}.indexes: invalid value {value!r} (expected a list of [type, field] pairs, "
            'such as [["jobs.Task", "priority"]])'
        )
    return tuple((type_name, field) for type_name, field in pairs)


def _convert(section: str, name: str, value: Any, current: Any) -> Any:
    """Check a file, environment or flag value and give it the type of the current value."""
    if name == "indexes":
        return _indexes(section, value)
    if name == "workers" and isinstance(value, str) and value.strip().lower() == "auto":
        return 0
    try:
        if isinstance(current, bool):
            if isinstance(value, bool):
                return value
            if isinstance(value, str) and value.lower() in _TRUE + _FALSE:
                return value.lower() in _TRUE
            raise ValueError(value)
        if isinstance(current, int | float):
            number = _number(value, whole=isinstance(current, int))
            if math.isnan(number) or number < 0 or (number == 0 and name in _POSITIVE):
                raise ValueError(value)
            if name in _LEASES and math.isfinite(number) and number > MAX_LEASE_SECONDS:
                raise ConfigError(
                    f"{section}.{name}: {value!r} exceeds the maximum lease of {MAX_LEASE_SECONDS} "
                    "seconds (100 years); use inf for FOREVER"
                )
            return number if isinstance(current, int) else float(number)
        if name in _PATHS:
            return None if value in (None, "") else Path(value)
        if not isinstance(value, str | Path) or (name == "token_audience" and not value):
            raise ValueError(value)
        if name == "backend":
            if value not in _BACKENDS:
                raise ValueError(value)
            return str(value)
        if name == "durability":
            if value not in _DURABILITY:
                raise ValueError(value)
            return value
        if name == "log_format":
            if value not in ("text", "json"):
                raise ValueError(value)
            return str(value)
        if name == "allocator":
            if value not in ("auto", "tcmalloc", "glibc"):
                raise ValueError(value)
            return str(value)
        if name == "log_level":
            level = str(value).upper()
            if level not in _LOG_LEVELS:
                raise ValueError(value)
            return level
        return str(value)
    except (TypeError, ValueError):
        if name == "durability":
            need = " or ".join(map(repr, _DURABILITY))
        elif name == "backend":
            need = " or ".join(map(repr, sorted(_BACKENDS)))
        else:
            need = "a positive number" if name in _POSITIVE else f"a value like {current!r}"
            if name == "workers":
                need = 'a number of processes, or 0 or "auto": one per core'

        raise ConfigError(f"{section}.{name}: invalid value {value!r} (expected {need})") from None


def _apply(obj: Any, values: Any, where: str) -> Any:
    if not isinstance(values, Mapping):
        raise ConfigError(f"{where}: expected a table of settings, got {values!r}")
    known = {f.name for f in dataclasses.fields(obj)}
    changes = {}
    for name, value in values.items():
        if name not in known:
            raise ConfigError(f"{where}: unknown setting {name!r} (known: {', '.join(sorted(known))})")
        changes[name] = _convert(where, name, value, getattr(obj, name))
    return dataclasses.replace(obj, **changes)


def _check_partitions(section: str, settings: SpaceSettings, *, default: bool) -> None:
    """A partitioned space names its routing field; partitions are declared per space."""
    if settings.partitions > MAX_PARTITIONS:
        raise ConfigError(
            f"{section}.partitions: {settings.partitions} exceeds the limit of {MAX_PARTITIONS}"
        )
    if settings.partitions > 1 and default:
        raise ConfigError(f"{section}.partitions: partitions are declared per space ([spaces.NAME])")
    if settings.partitions > 1 and not settings.partition_by:
        raise ConfigError(
            f"{section}.partition_by: a space of {settings.partitions} partitions needs its routing "
            'field (partition_by = "FIELD")'
        )


def _check_dead_letter(section: str, settings: SpaceSettings, limits: Limits, *, default: bool) -> None:
    """A dead-letter space is a space's own name; the backoff is a time."""
    name = settings.dead_letter
    if name and (default or not SPACE_NAME.fullmatch(name) or len(name) > limits.max_name_length):
        raise ConfigError(
            f"{section}.dead_letter: {name!r} "
            + (
                "is named per space ([spaces.NAME])"
                if default
                else "is no space name (letters, digits, . _ -)"
            )
        )
    for which in ("nack_backoff", "nack_backoff_max"):
        seconds = getattr(settings, which)
        if not math.isfinite(seconds) or seconds > MAX_LEASE_SECONDS:
            raise ConfigError(f"{section}.{which}: {seconds!r} is not a finite number of seconds")


def _with_dead_letters(spaces: Mapping[str, SpaceSettings]) -> dict[str, SpaceSettings]:
    """A partitioned space's dead-letter space is partitioned as it is (partition k dead-letters
    into partition k): declared so here unless the file declares it the same way already."""
    result = dict(spaces)
    for name, settings in spaces.items():
        if settings.partitions == 1:
            continue
        dead = settings.dead_letter or f"{name}.dead"
        declared = result.get(dead)
        if declared is None:
            result[dead] = dataclasses.replace(settings, dead_letter="", max_deliveries=0)
        elif (declared.partition_by, declared.partitions) != (settings.partition_by, settings.partitions):
            raise ConfigError(
                f"spaces.{dead}: the dead-letter space of {name!r} is partitioned as {name!r} is "
                f"(partition_by = {settings.partition_by!r}, partitions = {settings.partitions})"
            )
    return result


def load_config(
    file: Path | None = None,
    environ: Mapping[str, str] | None = None,
    flags: Mapping[str, Any] | None = None,
) -> ServerConfig:
    """Build the configuration from its three sources, later ones winning."""
    config = ServerConfig()
    data: dict[str, Any] = {}
    if file is not None:
        try:
            data = tomllib.loads(Path(file).read_text())
        except (OSError, tomllib.TOMLDecodeError) as err:
            raise ConfigError(f"config file {file}: {err}") from err
    environ = os.environ if environ is None else environ
    scalars = {k: v for k, v in data.items() if k in _SCALARS}
    unknown = set(data) - set(_SCALARS) - {"limits", "space_defaults", "spaces"}
    if unknown:
        raise ConfigError(f"config file {file}: unknown setting(s) {', '.join(sorted(unknown))}")
    for name in _SCALARS:
        env = environ.get(f"OUTRIG_{name.upper()}")
        if env is not None:
            scalars[name] = env
    for name, value in (flags or {}).items():
        if value is not None:
            scalars[name] = value
    config = _apply(config, scalars, "server")
    limits = _apply(config.limits, data.get("limits", {}), "limits")
    defaults = _apply(config.space_defaults, data.get("space_defaults", {}), "space_defaults")
    per_space = data.get("spaces", {})
    if not isinstance(per_space, Mapping):
        raise ConfigError(f"spaces: expected a table of spaces, got {per_space!r}")
    spaces = {name: _apply(defaults, values, f"spaces.{name}") for name, values in per_space.items()}
    _check_partitions("space_defaults", defaults, default=True)
    _check_dead_letter("space_defaults", defaults, limits, default=True)
    for name, settings in spaces.items():
        _check_partitions(f"spaces.{name}", settings, default=False)
        _check_dead_letter(f"spaces.{name}", settings, limits, default=False)
    result: ServerConfig = dataclasses.replace(config, limits=limits, space_defaults=defaults, spaces=spaces)
    if result.backend == "postgres" and not result.dsn:
        raise ConfigError("server.dsn: the postgres backend needs a database (--dsn postgresql://...)")
    return result
