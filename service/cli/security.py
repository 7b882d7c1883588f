"""`outrig certs dev`, `outrig keys ed25519` and `outrig token issue`: what a user needs to try TLS,
mutual TLS and tokens in minutes. cli/commands.py adds these parsers and calls `run`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

COMMANDS = ("certs", "keys", "token")


def add_parsers(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    certs = commands.add_parser("certs", help="make development certificates")
    certs_kind = certs.add_subparsers(dest="kind", required=True)
    dev = certs_kind.add_parser(
        "dev",
        help="write a development CA, a server and a client certificate",
        description="Write ca.pem/ca.key (a CA), server.pem/server.key (for localhost, 127.0.0.1 and ::1) "
        "and client.pem/client.key to DIR, for `outrig serve --tls-cert DIR/server.pem --tls-key "
        "DIR/server.key --tls-client-ca DIR/ca.pem`. For development only. "
        "Existing files are not overwritten.",
    )
    dev.add_argument("directory", metavar="DIR", type=Path)
    dev.add_argument("--client", default="client", help="the client certificate's CN (default: client)")
    dev.add_argument(
        "--client-uri", metavar="URI", help="a SAN URI for the client (it then names the principal)"
    )
    keys = commands.add_parser("keys", help="make token signing keys")
    keys_kind = keys.add_subparsers(dest="kind", required=True)
    ed25519 = keys_kind.add_parser(
        "ed25519",
        help="write an Ed25519 key pair for bearer tokens",
        description="Write DIR/token.key (private, mode 600: for `outrig token issue`) and DIR/token.pub "
        "(for `outrig serve --token-public-key`). Existing files are not overwritten.",
    )
    ed25519.add_argument("directory", metavar="DIR", type=Path)
    token = commands.add_parser("token", help="issue bearer tokens")
    token_kind = token.add_subparsers(dest="kind", required=True)
    issue = token_kind.add_parser(
        "issue", help="print a signed token", description="Print a bearer token (an EdDSA-signed JWT)."
    )
    issue.add_argument("--key", required=True, type=Path, metavar="KEY", help="the Ed25519 private key (PEM)")
    issue.add_argument("--principal", required=True, help="who the token names (its 'sub')")
    issue.add_argument("--ttl", default="1h", help="how long it is valid: 90s, 15m, 1h, 7d (default 1h)")
    issue.add_argument("--groups", default="", help="comma-separated groups (e.g. ops,dev)")
    issue.add_argument("--audience", default="outrig", help="the server's audience (default outrig)")


def run(args: argparse.Namespace) -> int:
    """Run one of the commands: 0 done, 2 it could not be done (the reason on stderr)."""
    try:
        from outrig.service.security import certs, tokens
    except ImportError as err:  # pragma: no cover - depends on the install
        print(f"outrig: this needs the server extras: pip install 'outrig[server]' ({err})", file=sys.stderr)
        return 2
    try:
        if args.command == "certs":
            for path in certs.write_dev_certificates(args.directory, args.client, args.client_uri):
                print(path)
        elif args.command == "keys":
            for path in tokens.write_key_pair(args.directory):
                print(path)
        else:
            groups = [g.strip() for g in args.groups.split(",") if g.strip()]
            key = tokens.load_private_key(args.key)
            print(tokens.issue_token(key, args.principal, tokens.parse_ttl(args.ttl), groups, args.audience))
    except (OSError, ValueError) as err:
        print(f"outrig {args.command}: {err}", file=sys.stderr)
        return 2
    return 0
