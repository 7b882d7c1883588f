"""`outrig stats`, `outrig dump` and `outrig spaces`: what a running server holds, for an operator.

- `outrig stats METRICS` reads a server's Prometheus endpoint (`--metrics-listen`) and prints
  each space's figures and the calls so far, as a table.
- `outrig dump HOST:PORT --space S --type T ...` lists the entries of a space that match the given
  types (and their subtypes) through the SDK, one JSON object per line: `{"type": ...,
  "supertypes": [...], "fields": {...}}`. Bytes and arrays are written as base64 (arrays with
  their typecode), so that a dump can be read back by any language. `--where` narrows it by
  matchers (`priority>=5`, `name^=eu-`, `region@=["eu","uk"]`) and `--order-by` sorts it.
- `outrig spaces --address HOST:PORT` lists every space of the server's tier and its owner (the
  ListSpaces RPC, through the SDK), as a table: space, owner, address, epoch, lease left, here,
  entries and bytes (or `--json`).
  `--tls-ca`, `--tls-cert`/`--tls-key` and `--server-name` as `outrig health` takes them, and
  `--token-file` for a bearer token (over TLS only, as the SDK sends one).
"""

from __future__ import annotations

import argparse
import array
import base64
import dataclasses
import json
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["add_parsers", "run"]

_SAMPLE = re.compile(r"^(?P<name>[a-z_]+)(?:\{(?P<labels>[^}]*)\})? (?P<value>\S+)$")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
_COLUMNS = (
    "space_entries",
    "space_bytes",
    "waiters",
    "registrations",
    "transactions",
    "leases_expired_total",
)


def add_parsers(commands: Any) -> None:
    stats = commands.add_parser(
        "stats",
        help="print what a running server holds, from its metrics endpoint",
        description="Read a server's Prometheus metrics (outrig serve --metrics-listen) and print each "
        "space's entries, bytes, parked waiters, registrations, open transactions and expired leases, "
        "then the calls by method and status. Exit status 2 if the endpoint cannot be read.",
    )
    stats.add_argument(
        "metrics", metavar="HOST:PORT", help="the server's --metrics-listen address (or a URL)"
    )
    dump = commands.add_parser(
        "dump",
        help="list a space's entries as JSON lines",
        description="List the entries of a space that match the given types (and their subtypes), one JSON "
        "object per line on standard output, through a server's gRPC port. Exit status 2 if the server "
        "cannot be reached or refuses.",
    )
    dump.add_argument("target", metavar="HOST:PORT", help="the server's gRPC address")
    dump.add_argument("--space", default="default", help="the space (default: default)")
    dump.add_argument(
        "--type", dest="types", action="append", required=True, metavar="TYPE", help="a type name; repeatable"
    )
    dump.add_argument("--max-entries", type=int, default=0, metavar="N", help="at most N entries (0: all)")
    dump.add_argument(
        "--where",
        action="append",
        default=[],
        metavar="COND",
        help="only entries whose field satisfies COND, repeatable (all must hold): FIELD=V, FIELD!=V, "
        "FIELD>V, FIELD>=V, FIELD<V, FIELD<=V, FIELD^=PREFIX, FIELD@=[V, ...] (one of); V is JSON "
        '(5, 5.0, "eu", true), a bare word a string; FIELD=null: missing, FIELD!=null: present',
    )
    dump.add_argument(
        "--order-by",
        action="append",
        default=[],
        metavar="FIELD",
        help="list in this field's order, --order-by=-FIELD descending; repeatable (later keys break ties)",
    )
    dump.add_argument(
        "--pending",
        action="store_true",
        help="also list the matching entries no read sees (needs the admin grant): each in flight, with its "
        'pending delivery ("delivery": receipt, deadline, deliveries), or delayed ("visible_at"), after the '
        "visible ones, in arrival order",
    )
    _retry_option(dump)
    spaces = commands.add_parser(
        "spaces",
        help="list the spaces of a server's tier and their owners",
        description="List every space of the tier of the server at --address and its owner, as a table: "
        "space, owner (server id), address, epoch, lease left (seconds), here (owned by the server "
        "asked), and the entries and bytes it holds (- when its owner did not answer). A lone server lists "
        "its own spaces, all here. Under a policy it needs the admin action on outrig://*. Exit status 2 if "
        "the server cannot be reached or refuses.",
    )
    _connection_options(spaces)
    spaces.add_argument("--json", action="store_true", help="print JSON (for scripts) instead of a table")
    move = commands.add_parser(
        "move",
        help="move a space to another server of its tier",
        description="Hand SPACE over to another server of the tier (its owner does it, whichever server "
        "--address names): the owner stops serving it, lets what it acknowledged commit, and passes the "
        "ownership on; clients retry into the new owner. --to names the server (its id or address, as "
        "`outrig spaces` lists them); without it, the least loaded other server. Needs the admin action on "
        "outrig://SPACE. Prints the address it moved to. Exit status 2 if it could not be moved.",
    )
    move.add_argument("space", metavar="SPACE", help="the space to move")
    move.add_argument("--to", default="", metavar="SERVER", help="the server to move it to (id or address)")
    _connection_options(move, retry=None)
    drain = commands.add_parser(
        "drain",
        help="hand every space of a server to the others of its tier (before stopping it)",
        description="Drain the server at --address: it takes no new spaces and hands each of its own to the "
        "least loaded other server, then prints each space and where it went. Stop it afterwards. Needs the "
        "admin action on outrig://*. Exit status 2 if it could not drain.",
    )
    _connection_options(drain, retry=None)


def _seconds(text: str) -> float:
    """argparse's type for a number of seconds >= 0."""
    try:
        seconds = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not seconds >= 0:  # NaN too
        raise argparse.ArgumentTypeError(f"must be >= 0 seconds, got {text}")
    return seconds


def _retry_option(parser: argparse.ArgumentParser, default: float = 5.0) -> None:
    parser.add_argument(
        "--retry-deadline",
        type=_seconds,
        default=default,
        metavar="S",
        help="keep retrying an unreachable or unavailable server for S seconds before giving up with "
        f"exit status 2 (default {default:g}; 0: one try)",
    )


def _connection_options(parser: argparse.ArgumentParser, *, retry: float | None = 5.0) -> None:
    """--address, --retry-deadline (default `retry`; None: no such option) and the TLS and token
    options."""
    parser.add_argument("--address", required=True, metavar="HOST:PORT", help="the server's gRPC address")
    if retry is not None:
        _retry_option(parser, retry)
    parser.add_argument("--tls-ca", metavar="PEM", type=Path, help="connect with TLS, trusting this CA")
    parser.add_argument("--tls-cert", metavar="PEM", type=Path, help="client certificate (mutual TLS)")
    parser.add_argument("--tls-key", metavar="PEM", type=Path, help="the client certificate's private key")
    parser.add_argument(
        "--server-name",
        metavar="NAME",
        help="the name to check the server's certificate against (when HOST is an IP the certificate "
        "does not name)",
    )
    parser.add_argument(
        "--token-file", metavar="PATH", type=Path, help="a file holding a bearer token (needs TLS)"
    )


def run(args: argparse.Namespace) -> int:
    if args.command == "stats":
        return _stats(args.metrics)
    if args.command in ("move", "drain"):
        return _tier_change(args)
    return _spaces(args) if args.command == "spaces" else _dump(args)


def _stats(address: str) -> int:
    import urllib.error  # here, as gRPC is in the other commands: `outrig serve` has no use for them
    import urllib.request

    url = address if "://" in address else f"http://{address}/metrics"
    try:
        with urllib.request.urlopen(url, timeout=10) as reply:
            text = reply.read().decode()
    except (OSError, urllib.error.URLError) as err:
        print(f"outrig stats: cannot read {url}: {err}", file=sys.stderr)
        return 2
    spaces: dict[str, dict[str, float]] = {}
    calls: dict[tuple[str, str], float] = {}
    for line in text.splitlines():
        found = _SAMPLE.match(line)
        if found is None:
            continue
        name = found["name"].removeprefix("outrig_")
        labels = dict(_LABEL.findall(found["labels"] or ""))
        value = float(found["value"])
        if name in _COLUMNS and "space" in labels:
            spaces.setdefault(labels["space"], {})[name] = value
        elif name == "requests_total":
            calls[(labels.get("method", "?"), labels.get("code", "?"))] = value
    print("space".ljust(24) + "".join(f"{column.replace('_total', ''):>16}" for column in _COLUMNS))
    for space in sorted(spaces):
        row = spaces[space]
        print(space[:24].ljust(24) + "".join(f"{int(row.get(column, 0)):>16,}" for column in _COLUMNS))
    if calls:
        print()
        print("method".ljust(24) + "code".ljust(24) + "calls".rjust(16))
        for (method, code), count in sorted(calls.items()):
            print(method.ljust(24) + code.ljust(24) + f"{int(count):>16,}")
    return 0


def _json_value(value: Any) -> Any:
    if isinstance(value, bytes | bytearray | memoryview):
        return {"bytes": base64.b64encode(bytes(value)).decode()}
    if isinstance(value, array.array):
        return {"array": value.typecode, "data": base64.b64encode(value.tobytes()).decode()}
    if isinstance(value, list):
        return [_json_value(item) for item in value]
    if isinstance(value, dict):
        return {str(key): _json_value(item) for key, item in value.items()}
    return value


def _document(entry: Any) -> dict[str, Any]:
    """A dumped entry: a GenericEntry, or an instance of a class registered in this process."""
    from outrig._entry import GenericEntry, entry_info

    if isinstance(entry, GenericEntry):
        type_name, supertypes, fields = entry.type_name, entry.supertypes, entry.fields
    else:
        info = entry_info(type(entry))
        type_name, supertypes = info.type_name, info.supertypes
        fields = {name: getattr(entry, name) for name, _ in info.fields if getattr(entry, name) is not None}
    return {
        "type": type_name,
        "supertypes": list(supertypes),
        "fields": {name: _json_value(value) for name, value in fields.items()},
    }


_CONDITION = re.compile(r"^([^=!<>^@]+?)(!=|>=|<=|\^=|@=|=|>|<)(.*)$", re.DOTALL)


def _json_or_word(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def where_matcher(condition: str) -> tuple[str, Any]:
    """(field, matcher or value) of a `--where` condition; ValueError if it is not one."""
    import outrig

    found = _CONDITION.match(condition)
    if found is None:
        raise ValueError(f"--where {condition!r}: expected FIELD OP VALUE, OP one of = != > >= < <= ^= @=")
    field, op, text = found.group(1).strip(), found.group(2), found.group(3).strip()
    value = _json_or_word(text)
    if value is None and op in ("=", "!="):
        return field, outrig.Missing if op == "=" else outrig.Present
    if op == "@=":
        if not isinstance(value, list):
            raise ValueError(f"--where {condition!r}: @= takes a JSON list of values")
        return field, outrig.OneOf(*value)
    if op == "^=":
        return field, outrig.Prefix(str(text if not isinstance(value, str) else value))
    makers = {
        "=": lambda v: v,
        "!=": outrig.Not,
        ">": outrig.GT,
        ">=": outrig.GE,
        "<": outrig.LT,
        "<=": outrig.LE,
    }
    return field, makers[op](value)


def _dump_templates(args: argparse.Namespace) -> list[Any]:
    import outrig

    conditions: dict[str, list[Any]] = {}
    for condition in args.where:
        field, matcher = where_matcher(condition)
        conditions.setdefault(field, []).append(matcher)
    fields = {name: found[0] if len(found) == 1 else outrig.All(*found) for name, found in conditions.items()}
    return [outrig.GenericEntry(name, fields=fields) for name in args.types]


def _dump(args: argparse.Namespace) -> int:
    import outrig

    try:
        templates = _dump_templates(args)
    except ValueError as err:
        print(f"outrig dump: {err}", file=sys.stderr)
        return 2
    order_by = [outrig.desc(key[1:]) if key.startswith("-") else key for key in args.order_by]
    try:
        with outrig.connect(args.target, space=args.space, retry_deadline=args.retry_deadline) as space:
            for entry in space.contents(templates, max_entries=args.max_entries, order_by=order_by or None):
                print(json.dumps(_document(entry), ensure_ascii=False))
            if args.pending:
                _dump_pending(space, templates)
    except outrig.OutrigError as err:
        print(f"outrig dump: {type(err).__name__}: {err}", file=sys.stderr)
        return 2
    return 0


def _dump_pending(space: Any, templates: list[Any]) -> None:
    """`outrig dump --pending`: the hidden matches (in flight or delayed), browsed page by page."""
    after = 0
    while True:
        page = space.browse(templates, after=after, max_entries=1000)
        for browsed in page.entries:
            if browsed.receipt is None and browsed.visible_at is None:
                continue
            document = _document(browsed.entry)
            document["deliveries"] = browsed.deliveries
            if browsed.receipt is not None:
                document["delivery"] = {"receipt": browsed.receipt, "deadline": browsed.deadline}
            else:
                document["visible_at"] = browsed.visible_at
            print(json.dumps(document, ensure_ascii=False))
        if not page.next:
            return
        after = page.next


def _connect_args(args: argparse.Namespace) -> dict[str, Any]:
    """`outrig.connect`'s tls= and token= from the TLS and token options; ValueError if unusable."""
    import outrig

    tls = None
    if args.tls_ca is not None or args.tls_cert is not None or args.tls_key is not None:
        tls = outrig.TLS(ca=args.tls_ca, cert=args.tls_cert, key=args.tls_key, server_name=args.server_name)
    elif args.server_name is not None:
        raise ValueError("--server-name needs TLS (--tls-ca)")
    token = None
    if args.token_file is not None:
        try:
            token = args.token_file.read_text().strip()
        except OSError as err:
            raise ValueError(f"--token-file: cannot read {args.token_file}: {err}") from err
    return {"tls": tls, "token": token}


def _tier_change(args: argparse.Namespace) -> int:
    """`outrig move` and `outrig drain`, through the generated stub (the SDK has no calls for an
    operator's changes of the tier)."""
    import grpc

    from outrig._protocol import reason_in
    from outrig._tls import channel_credentials, token_metadata
    from outrig.v1 import space_pb2 as pb
    from outrig.v1 import space_pb2_grpc

    try:
        options = _connect_args(args)
    except ValueError as err:
        print(f"outrig {args.command}: {err}", file=sys.stderr)
        return 2
    credentials = channel_credentials(options["tls"], options["token"])
    target = args.address
    tls = options["tls"]
    channel = (
        grpc.insecure_channel(target)
        if credentials is None
        else grpc.secure_channel(target, credentials, options=tls.options() if tls else None)
    )
    metadata = tuple(token_metadata(options["token"]))
    with channel:
        stub = space_pb2_grpc.SpaceStub(channel)
        try:
            if args.command == "move":
                reply = stub.MoveSpace(
                    pb.MoveSpaceRequest(space=args.space, to=args.to), timeout=60, metadata=metadata
                )
                print(f"{args.space} -> {reply.address}")
            else:
                drained = stub.Drain(pb.DrainRequest(), timeout=300, metadata=metadata)
                for moved in drained.moved:
                    print(f"{moved.space} -> {moved.address}")
                print(f"drained: {len(drained.moved)} space(s) moved")
        except grpc.RpcError as err:
            code = err.code() if isinstance(err, grpc.Call) else None
            details = err.details() if isinstance(err, grpc.Call) else str(err)
            reason = reason_in(err.trailing_metadata()) if isinstance(err, grpc.Call) else 0
            why = f" ({pb.ErrorReason.Name(reason)})" if reason else ""
            print(f"outrig {args.command}: {code.name if code else 'error'}{why}: {details}", file=sys.stderr)
            return 2
    return 0


def _lease_left(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.1f}s"


def spaces_table(placements: Sequence[Any]) -> list[str]:
    """The lines `outrig spaces` prints for `outrig.Placement`s: a header, then one per space."""
    rows = [("space", "owner", "address", "epoch", "lease left", "here", "entries", "bytes")]
    rows += [
        (
            p.space,
            p.owner or "-",
            p.address or "-",
            str(p.epoch),
            _lease_left(p.expires_in),
            "yes" if p.here else "no",
            "-" if p.entries is None else f"{p.entries:,}",
            "-" if p.bytes is None else f"{p.bytes:,}",
        )
        for p in placements
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows
    ]


def _spaces(args: argparse.Namespace) -> int:
    import outrig

    try:
        with outrig.connect(
            args.address, retry_deadline=args.retry_deadline, mux=False, **_connect_args(args)
        ) as space:
            placements = space.list_spaces()
    except (outrig.OutrigError, ValueError, TypeError) as err:
        print(f"outrig spaces: {type(err).__name__}: {err}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps([dataclasses.asdict(p) for p in placements]))
        return 0
    for line in spaces_table(placements):
        print(line)
    return 0
