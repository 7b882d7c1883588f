"""The `outrig` command: `outrig serve` runs a server; `outrig backup` and `outrig check` copy and
verify a data dir's store, also while a server is using it; `outrig health` probes a server's
gRPC health service (service/cli/health.py); `outrig certs dev`, `outrig keys ed25519` and `outrig
token issue` make what TLS and tokens need (service/cli/security.py); `outrig stress` runs a
Locust campaign (outrig.loadtest.runner); `outrig stats`, `outrig dump` and `outrig spaces` show
what a running server holds (service/cli/admin.py); `outrig changes` streams a space's change log
(service/cli/changes.py)."""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from outrig.service import software_version
from outrig.service.cli import admin, changes, health, inspection
from outrig.service.cli import security as security_commands
from outrig.service.exceptions import ConfigError, StoreError
from outrig.service.logs import configure_logging

# `outrig stress` runs in a fresh interpreter that imports Locust, and with it gevent's patching of
# the standard library, before anything imports gRPC (this process already has).
_STRESS_BOOT = "import locust, sys; from outrig.loadtest.runner import main; sys.exit(main(sys.argv[1:]))"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="outrig", description="A JavaSpaces-style tuple space over gRPC.")
    parser.add_argument("--version", action="version", version=f"outrig {software_version()}")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser(
        "serve",
        help="run a server",
        description="Run an outrig server. Every option can also come from OUTRIG_<NAME> "
        "(OUTRIG_LISTEN, OUTRIG_DATA_DIR, ...) or from a TOML file given with --config; "
        "flags win over the environment, which wins over the file.",
    )
    serve.add_argument("--listen", metavar="HOST:PORT", help="address to serve on (default 127.0.0.1:7480)")
    serve.add_argument(
        "--backend",
        choices=["embedded", "postgres"],
        help="embedded (default: in memory, or SQLite with --data-dir) or postgres (several servers, one "
        "database: --dsn)",
    )
    serve.add_argument("--dsn", metavar="URL", help="the PostgreSQL database of --backend postgres")
    serve.add_argument(
        "--advertise",
        metavar="HOST:PORT",
        help="with --backend postgres: the address other servers and clients reach this one at "
        "(default: the listen address; this host's name when it listens on all interfaces)",
    )
    serve.add_argument(
        "--owner-lease",
        type=float,
        metavar="SECONDS",
        help="with --backend postgres: how long a space's ownership lasts unrenewed (default 3)",
    )
    serve.add_argument(
        "--data-dir",
        metavar="DIR",
        help="keep spaces durably in DIR (SQLite); without it they live in memory",
    )
    serve.add_argument(
        "--in-memory",
        action="store_const",
        const=True,
        help="ephemeral spaces, even if a data dir is configured",
    )
    serve.add_argument(
        "--durability",
        choices=["always", "interval"],
        help="always (default): reply once a change is on disk; interval: commit every "
        "--commit-interval-ms and reply at once (a crash loses up to that much)",
    )
    serve.add_argument(
        "--commit-interval-ms", type=int, metavar="MS", help="commit period for --durability interval"
    )
    serve.add_argument(
        "--request-window", type=float, metavar="S", help="seconds a request id is remembered (default 120)"
    )
    serve.add_argument(
        "--workers",
        metavar="N",
        help="run N worker processes sharing this machine's spaces and the listen port (0 or auto: one "
        "per core; default 1: this process alone); worker i also listens on the listen port + 1 + i",
    )
    serve.add_argument("--config", metavar="FILE", type=Path, help="a TOML configuration file")
    serve.add_argument("--max-message-bytes", type=int, metavar="N", help="largest request or reply")
    serve.add_argument("--grace-seconds", type=float, metavar="S", help="shutdown grace for in-flight calls")
    serve.add_argument(
        "--idle-release-seconds",
        type=float,
        metavar="S",
        help="give freed memory back to the system once the server has been idle this long "
        "(default 60; 0: never)",
    )
    serve.add_argument(
        "--allocator",
        choices=["auto", "tcmalloc", "glibc"],
        help="auto (default): run on tcmalloc (libtcmalloc_minimal.so.4) if it is installed and no other "
        "allocator is preloaded, by re-executing this process once with it in LD_PRELOAD; tcmalloc: the "
        "same, or fail; glibc: keep the allocator the process started with",
    )
    serve.add_argument("--log-level", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    serve.add_argument(
        "--log-format", choices=["text", "json"], help="text (default) or json: one object per line"
    )
    serve.add_argument(
        "--metrics-listen",
        metavar="HOST:PORT",
        help="serve Prometheus metrics on http://HOST:PORT/metrics (default: no metrics)",
    )
    serve.add_argument(
        "--console",
        metavar="HOST:PORT",
        help="serve the web console on http://HOST:PORT/ (default: none; loopback only unless the "
        "server authenticates callers)",
    )
    security = serve.add_argument_group("security (see docs/security.md)")
    security.add_argument("--tls-cert", metavar="PEM", help="the server's certificate chain: serve TLS")
    security.add_argument("--tls-key", metavar="PEM", help="the server certificate's private key")
    security.add_argument("--tls-client-ca", metavar="PEM", help="require client certificates from this CA")
    security.add_argument("--token-public-key", metavar="PEM", help="accept bearer tokens signed by this key")
    security.add_argument("--token-audience", metavar="NAME", help="the audience tokens must name (outrig)")
    security.add_argument(
        "--policy", metavar="FILE", help="a TOML grant policy (reloaded on SIGHUP and change)"
    )
    security.add_argument(
        "--insecure",
        action="store_const",
        const=True,
        help="allow listening beyond loopback without TLS or authentication",
    )
    backup = commands.add_parser(
        "backup",
        help="copy a data dir's store, also while a server is using it",
        description="Copy the store in DATA_DIR to DEST/outrig.db as one consistent snapshot, through "
        "SQLite's online backup: a server using DATA_DIR goes on serving. DEST is created if missing and "
        "becomes a data dir a server can start from. The copy is then checked as `outrig check` does. "
        "Exit status: 0 copied and the copy is ok; 1 copied, but the copy has problems; 2 nothing copied "
        "(DATA_DIR holds no store or an incompatible one, or DEST already holds a store). The data dir of "
        "`outrig serve --workers N`: each worker's store, to DEST/workers/I, and DEST records N.",
    )
    backup.add_argument("data_dir", metavar="DATA_DIR", type=Path, help="the data dir to copy")
    backup.add_argument("destination", metavar="DEST", type=Path, help="a directory with no store in it yet")
    check = commands.add_parser(
        "check",
        help="verify a data dir's store without changing it",
        description="Verify the store in DATA_DIR, also while a server is using it, without changing it: its "
        "format version, SQLite's integrity check, that every stored entry and notify registration "
        "decodes, that every row belongs to a known space, and that ids will not be handed out twice. "
        "Prints what each space holds and a last line `check: ok` or `check: N problem(s)`. Exit status: "
        "0 ok; 1 problems found; 2 DATA_DIR holds no store, an incompatible one, or cannot be read. The data "
        "dir of `outrig serve --workers N`: each worker's store, the worst status of all.",
    )
    check.add_argument("data_dir", metavar="DATA_DIR", type=Path, help="the data dir to check")
    health.add_parser(commands)
    security_commands.add_parsers(commands)
    admin.add_parsers(commands)
    inspection.add_parsers(commands)
    changes.add_parser(commands)
    commands.add_parser(
        "stress",
        add_help=False,
        help="run a Locust stress campaign headless and print its verdict (`outrig stress --help`)",
    )
    return parser


def _stress(argv: Sequence[str]) -> int:
    """Replace this process with the campaign runner (see `outrig.loadtest.runner`)."""
    if importlib.util.find_spec("locust") is None:
        print("outrig stress: needs its extra: pip install 'outrig[loadtest]'", file=sys.stderr)
        return 2
    sys.stdout.flush()
    # gevent's subprocess forks with os.fork, and gRPC's fork handlers then restart its poller in
    # the child, which aborts on the descriptors the child closes before exec (grpc/grpc#43157): a
    # restarted server died with status -6 before it could start. The campaign never uses gRPC
    # in a child, so it runs without gRPC's fork support.
    environment = dict(os.environ, GRPC_ENABLE_FORK_SUPPORT="false")
    os.execve(sys.executable, [sys.executable, "-c", _STRESS_BOOT, *argv], environment)


def _store_command(args: argparse.Namespace) -> int:
    """`outrig backup` and `outrig check`: 0 ok, 1 the store has problems, 2 nothing to work on.
    A data dir of `--workers N` has a store per worker: each is checked, or copied to the same
    place under DEST (which then records N too)."""
    from outrig.service.workers import recorded_workers

    try:
        workers = recorded_workers(args.data_dir)
    except ConfigError as err:
        print(f"outrig {args.command}: {err}", file=sys.stderr)
        return 2
    if workers is None:
        return _one_store_command(args, args.data_dir, getattr(args, "destination", None))
    from outrig.service.workers import record_workers, worker_data_dir

    worst = 0
    for i in range(workers):
        print(f"worker {i} ({worker_data_dir(args.data_dir, i)}):")
        destination = None if args.command == "check" else worker_data_dir(args.destination, i)
        worst = max(worst, _one_store_command(args, worker_data_dir(args.data_dir, i), destination))
    if args.command == "backup" and worst < 2:
        record_workers(args.destination, workers)
    return worst


def _one_store_command(args: argparse.Namespace, data_dir: Path, destination: Path | None) -> int:
    from outrig.service.backends.embedded.store.backup import backup_store
    from outrig.service.backends.embedded.store.check import check_store

    try:
        if destination is None:
            report = check_store(data_dir)
            print(report)
            return 0 if report.ok else 1
        copied = backup_store(data_dir, destination)
    except StoreError as err:
        print(f"outrig {args.command}: {err}", file=sys.stderr)
        return 2
    print(copied)
    return 0 if copied.check.ok else 1


def main(argv: Sequence[str] | None = None) -> int:
    own_command_line = argv is None  # only then may `serve` start this process again (--allocator)
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["stress"]:
        return _stress(argv[1:])
    args = _parser().parse_args(argv)
    if args.command in security_commands.COMMANDS:
        return security_commands.run(args)
    if args.command == "health":
        return health.run(args)
    if args.command in ("stats", "dump", "spaces", "move", "drain"):
        return admin.run(args)
    if args.command in inspection.COMMANDS:
        return inspection.run(args)
    if args.command == "changes":
        return changes.run(args)
    if args.command != "serve":
        return _store_command(args)
    try:
        from outrig.service import process
        from outrig.service.config import load_config
        from outrig.service.workers import WorkerRole, resolve_workers
    except ImportError as err:  # pragma: no cover - depends on the install
        print(f"outrig: the server needs its extras: pip install 'outrig[server]' ({err})", file=sys.stderr)
        return 2
    try:
        config = load_config(
            args.config,
            flags={
                "listen": args.listen,
                "backend": args.backend,
                "dsn": args.dsn,
                "advertise": args.advertise,
                "owner_lease": args.owner_lease,
                "data_dir": args.data_dir,
                "in_memory": args.in_memory,
                "durability": args.durability,
                "commit_interval_ms": args.commit_interval_ms,
                "request_window": args.request_window,
                "max_message_bytes": args.max_message_bytes,
                "grace_seconds": args.grace_seconds,
                "idle_release_seconds": args.idle_release_seconds,
                "allocator": args.allocator,
                "log_level": args.log_level,
                "log_format": args.log_format,
                "metrics_listen": args.metrics_listen,
                "console": args.console,
                "tls_cert": args.tls_cert,
                "tls_key": args.tls_key,
                "tls_client_ca": args.tls_client_ca,
                "token_public_key": args.token_public_key,
                "token_audience": args.token_audience,
                "policy": args.policy,
                "insecure": args.insecure,
                "workers": args.workers,
            },
        )
        role = WorkerRole.from_environ()  # this process is a worker its supervisor started
        configure_logging(config.log_level, config.log_format, "" if role is None else role.name)
        if own_command_line:
            process.run_on_allocator(config.allocator)  # tcmalloc: this process starts again on it
        from outrig.service import supervisor  # after: what a re-executed process imports again

        if role is not None:
            config = supervisor.worker_config(config, role)
        elif resolve_workers(config.workers) > 1:
            # The supervisor imports neither gRPC nor a backend: each worker is `outrig serve`.
            return asyncio.run(supervisor.supervise(config, argv, resolve_workers(config.workers)))
        try:
            from outrig.service.transport.server import serve
        except ImportError as err:  # pragma: no cover - depends on the install
            print(
                f"outrig: the server needs its extras: pip install 'outrig[server]' ({err})", file=sys.stderr
            )
            return 2
        asyncio.run(serve(config))
    except (ConfigError, StoreError) as err:
        print(f"outrig: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
