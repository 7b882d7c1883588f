"""The `outrig` command: `outrig serve` runs a server."""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from outrig.service.exceptions import ConfigError


def _version() -> str:
    try:
        return importlib.metadata.version("outrig")
    except importlib.metadata.PackageNotFoundError:
        return "0+unknown"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="outrig", description="A JavaSpaces-style tuple space over gRPC.")
    parser.add_argument("--version", action="version", version=f"outrig {_version()}")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser(
        "serve",
        help="run a server",
        description="Run an outrig server. Every option can also come from OUTRIG_<NAME> "
        "(OUTRIG_LISTEN, OUTRIG_DATA_DIR, ...) or from a TOML file given with --config; "
        "flags win over the environment, which wins over the file.",
    )
    serve.add_argument("--listen", metavar="HOST:PORT", help="address to serve on (default 127.0.0.1:7480)")
    serve.add_argument("--data-dir", metavar="DIR", help="where the space's data lives")
    serve.add_argument("--config", metavar="FILE", type=Path, help="a TOML configuration file")
    serve.add_argument("--max-message-bytes", type=int, metavar="N", help="largest request or reply")
    serve.add_argument("--grace-seconds", type=float, metavar="S", help="shutdown grace for in-flight calls")
    serve.add_argument("--log-level", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        from outrig.service.config import load_config
        from outrig.service.server import serve
    except ImportError as err:  # pragma: no cover - depends on the install
        print(f"outrig: the server needs its extras: pip install 'outrig[server]' ({err})", file=sys.stderr)
        return 2
    try:
        config = load_config(
            args.config,
            flags={
                "listen": args.listen,
                "data_dir": args.data_dir,
                "max_message_bytes": args.max_message_bytes,
                "grace_seconds": args.grace_seconds,
                "log_level": args.log_level,
            },
        )
        logging.basicConfig(
            level=config.log_level,
            format="%(asctime)s %(levelname)s %(name)s: %(message)s",
            stream=sys.stderr,
        )
        asyncio.run(serve(config))
    except ConfigError as err:
        print(f"outrig: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
