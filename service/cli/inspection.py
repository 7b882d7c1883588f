"""`outrig describe`, `outrig browse`, `outrig purge` and `outrig cancel`: look inside a running
space through the admin API (the SDK's `Space.describe`, `browse`, `purge`, `cancel_registration`
and `abort_transaction`), as tables for people and, with `--json`, JSON for scripts.

Templates come from `--type T` (repeatable; an entry of a subtype matches its supertype) and
`--where FIELD=VALUE` (repeatable, applied to every type): VALUE is read as JSON when it is JSON
(`n=1` an int, `x=1.0` a double, `ok=true` a bool, `s="1"` a string), else as a string (`job=resize`).
The connection options are `outrig spaces`' (`--address`, TLS, `--token-file`). Every command
needs the admin action under a policy. Exit status: 0 done; 1 a purge not confirmed; 2 the
server could not be reached, refused, or the arguments are unusable.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any

from outrig.service.cli.admin import _connect_args, _connection_options, _document

__all__ = ["COMMANDS", "add_parsers", "run", "where_fields"]

COMMANDS = frozenset({"describe", "browse", "purge", "cancel"})


def add_parsers(commands: Any) -> None:
    describe = commands.add_parser(
        "describe",
        help="show what a space holds: types, indexes, waiters, registrations, transactions",
        description="Describe SPACE: its entries and bytes by type, the fields each type is indexed "
        "under, its parked reads and takes by template, notify registrations, open transactions, the "
        "age of its oldest entry, and the settings and quotas it runs under.",
    )
    describe.add_argument("space", metavar="SPACE")
    _connection_options(describe)
    _json_option(describe)
    browse = commands.add_parser(
        "browse",
        help="list a space's entries page by page, without taking them",
        description="List the entries of SPACE that match the templates (--type, --where; none: every "
        "entry) in arrival order, a page at a time, without taking them: each entry's lease id, type, "
        "lease end, delivery state (a pending delivery's receipt and deadline, or when a delayed entry "
        "becomes visible; how often it was delivered) and fields. The last line names the cursor of "
        "the next page (--after).",
    )
    browse.add_argument("space", metavar="SPACE")
    _template_options(browse, required=False)
    browse.add_argument("--after", type=int, default=0, metavar="CURSOR", help="start after this cursor")
    browse.add_argument("--limit", type=int, default=20, metavar="N", help="entries a page (1 to 1000; 20)")
    browse.add_argument("--all", action="store_true", help="every page, not only the first")
    _connection_options(browse)
    _json_option(browse)
    purge = commands.add_parser(
        "purge",
        help="remove a space's entries that match the templates",
        description="Remove the entries of SPACE that match the templates (--type, required; --where). "
        "Asks for confirmation, showing how many entries match, unless --yes; --dry-run only counts "
        "them. The server removes a batch at a time, serving other calls in between.",
    )
    purge.add_argument("space", metavar="SPACE")
    _template_options(purge, required=True)
    purge.add_argument("--max", type=int, default=0, metavar="N", help="remove at most N entries (0: all)")
    purge.add_argument("--dry-run", action="store_true", help="only count the entries that would go")
    purge.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    _connection_options(purge)
    _json_option(purge)
    cancel = commands.add_parser(
        "cancel",
        help="end a space's notify registration or abort its transaction, by id",
        description="End the notify registration --registration ID, or abort the transaction "
        "--transaction ID, of SPACE (`outrig describe` lists both).",
    )
    cancel.add_argument("space", metavar="SPACE")
    which = cancel.add_mutually_exclusive_group(required=True)
    which.add_argument("--registration", type=int, metavar="ID", help="the registration's id")
    which.add_argument("--transaction", type=int, metavar="ID", help="the transaction's id")
    _connection_options(cancel)


def _json_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON (for scripts) instead of a table")


def _template_options(parser: argparse.ArgumentParser, *, required: bool) -> None:
    parser.add_argument(
        "--type", dest="types", action="append", required=required, default=[], metavar="TYPE",
        help="an entry type (and its subtypes); repeatable",
    )  # fmt: skip
    parser.add_argument(
        "--where", action="append", default=[], metavar="FIELD=VALUE",
        help="a field the entries must equal (VALUE as JSON if it is JSON, else a string); repeatable",
    )  # fmt: skip


def where_fields(conditions: Sequence[str]) -> dict[str, Any]:
    """The fields of `--where FIELD=VALUE` options; ValueError naming a malformed one."""
    fields: dict[str, Any] = {}
    for condition in conditions:
        name, sep, text = condition.partition("=")
        if not sep or not name:
            raise ValueError(f"--where {condition!r}: expected FIELD=VALUE")
        try:
            fields[name] = json.loads(text)
        except json.JSONDecodeError:
            fields[name] = text
        if isinstance(fields[name], list | dict):
            raise ValueError(f"--where {condition!r}: VALUE must be a number, true, false, null or a string")
    return fields


def _templates(args: argparse.Namespace) -> list[Any] | None:
    import outrig

    fields = where_fields(args.where)
    if not args.types:
        if fields:
            raise ValueError("--where needs --type (the type whose field it is)")
        return None
    return [outrig.GenericEntry(name, (), dict(fields)) for name in args.types]


def run(args: argparse.Namespace) -> int:
    import outrig

    try:
        options = _connect_args(args)
        action: Callable[[Any, argparse.Namespace], int] = _ACTIONS[args.command]
        with outrig.connect(
            args.address, space=args.space, retry_deadline=args.retry_deadline, mux=False, **options
        ) as space:
            return action(space, args)
    except (outrig.OutrigError, ValueError, TypeError) as err:
        print(f"outrig {args.command}: {type(err).__name__}: {err}", file=sys.stderr)
        return 2


def _table(rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows
    ]


def _when(expires_at: float | None) -> str:
    if expires_at is None:
        return "never"
    return datetime.datetime.fromtimestamp(expires_at, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _templates_text(templates: Sequence[Any]) -> str:
    return " | ".join(
        t.type_name + (json.dumps(_document(t)["fields"], ensure_ascii=False) if t.fields else "")
        for t in templates
    )


def _describe(space: Any, args: argparse.Namespace) -> int:
    import dataclasses

    described = space.describe()
    if args.json:
        document = dataclasses.asdict(described)
        for group in (*document["waiting"], *document["registration_list"]):
            group["templates"] = [_document(t) for t in space_templates(group["templates"])]
        print(json.dumps(document, ensure_ascii=False, indent=2))
        return 0
    c = described.configuration
    age = "-" if described.oldest_entry_age is None else f"{described.oldest_entry_age:.0f}s"
    size = f"{described.entries:,} entries, {described.bytes:,} bytes"
    print(f"space {described.space}: {size}; oldest entry {age}")
    leases = f"default lease {c.default_lease or 'forever'}, max lease {c.max_lease or 'forever'}"
    print(
        f"quotas: max_entries {c.max_entries:,}, max_bytes {c.max_bytes:,}, max_registrations "
        f"{c.max_registrations:,}; {leases}; {'fifo' if c.fifo else 'newest first'}"
    )
    print(
        f"waiters {described.waiters}, registrations {described.registrations}, transactions "
        f"{described.transactions}, locked entries {described.locked}, leases expired {described.expired}"
    )
    limit = f"max_deliveries {c.max_deliveries}" if c.max_deliveries else "no max_deliveries"
    print(
        f"deliveries in flight {described.in_flight}, delayed entries {described.delayed}, redelivered "
        f"{described.redelivered}, dead-lettered {described.dead_lettered} ({limit}, dead letters to "
        f"{c.dead_letter or '-'})"
    )
    log = described.change_log
    if log is None:
        print("change log: off")
    else:
        held = f"{log.count:,} changes held ({log.bytes:,} bytes), seq {log.oldest} to {log.head}"
        subscriptions = ", ".join(f"{s.name} at {s.position}" for s in log.subscriptions) or "none"
        print(f"change log: {held}; durable subscriptions: {subscriptions}; head cursor {log.head_cursor}")
    if described.types:
        print()
        rows: list[tuple[str, ...]] = [
            ("type", "entries", "bytes", "with subtypes", "supertypes", "indexed fields (values)")
        ]
        rows += [
            (
                t.type_name,
                f"{t.entries:,}",
                f"{t.bytes:,}",
                f"{t.with_subtypes:,}",
                ",".join(t.supertypes) or "-",
                " ".join(f"{name}({n})" for name, n in sorted(t.indexes.items())) or "-",
            )
            for t in described.types
        ]
        print("\n".join(_table(rows)))
    if described.waiting:
        print()
        rows = [("waiting", "calls", "in transactions", "templates")]
        rows += [
            ("take" if g.take else "read", str(g.count), str(g.transactional), _templates_text(g.templates))
            for g in described.waiting
        ]
        print("\n".join(_table(rows)))
    if described.registration_list:
        print()
        rows = [("registration", "expires", "sequence", "transaction", "templates")]
        rows += [
            (
                str(r.id),
                _when(r.expires_at),
                str(r.sequence),
                str(r.transaction or "-"),
                _templates_text(r.templates),
            )
            for r in described.registration_list
        ]
        print("\n".join(_table(rows)))
    if described.transaction_list:
        print()
        rows = [("transaction", "expires", "written", "taken", "read locked", "waiting")]
        rows += [
            (str(t.id), _when(t.expires_at), str(t.written), str(t.taken), str(t.read_locked), str(t.waiters))
            for t in described.transaction_list
        ]
        print("\n".join(_table(rows)))
    return 0


def space_templates(items: Sequence[Any]) -> list[Any]:
    """Templates `dataclasses.asdict` turned into dicts, as GenericEntry objects again."""
    import outrig

    return [outrig.GenericEntry(t["type_name"], tuple(t["supertypes"]), t["fields"]) for t in items]


def _browse(space: Any, args: argparse.Namespace) -> int:
    templates = _templates(args)
    cursor, entries = args.after, []
    while True:
        page = space.browse(templates, after=cursor, max_entries=args.limit)
        entries += page.entries
        cursor = page.next
        if not args.all or not cursor:
            break
    if args.json:
        listed = [
            {
                "id": e.id,
                "expires_at": e.expires_at,
                "locked": e.locked,
                "receipt": e.receipt,
                "deadline": e.deadline,
                "visible_at": e.visible_at,
                "deliveries": e.deliveries,
                **_document(e.entry),
            }
            for e in entries
        ]
        print(json.dumps({"entries": listed, "next": cursor}, ensure_ascii=False))
        return 0
    rows: list[tuple[str, ...]] = [("id", "type", "expires", "delivery", "fields")]
    for e in entries:
        document = _document(e.entry)
        locked = " (read-locked)" if e.locked else ""
        rows.append(
            (
                str(e.id),
                document["type"],
                _when(e.expires_at) + locked,
                _delivery_text(e),
                json.dumps(document["fields"]),
            )
        )
    print("\n".join(_table(rows)))
    print(f"next page: --after {cursor}" if cursor else "(no more entries)")
    return 0


def _delivery_text(e: Any) -> str:
    """A browsed entry's delivery state, one word: its pending delivery (receipt, deadline), or
    when it is visible again (a delayed write, a delivery returned with a delay); its count."""
    count = f"deliveries={e.deliveries}" if e.deliveries else ""
    if e.receipt is not None:
        return ",".join(
            filter(None, (f"pending:receipt={e.receipt}", f"deadline={_when(e.deadline)}", count))
        )
    if e.visible_at is not None:
        return ",".join(filter(None, (f"delayed:until={_when(e.visible_at)}", count)))
    return count or "-"


def _purge(space: Any, args: argparse.Namespace) -> int:
    templates = _templates(args)
    what = " or ".join(args.types) + (f" where {' and '.join(args.where)}" if args.where else "")
    if args.dry_run or not args.yes:
        matching = space.purge(templates, dry_run=True, max_entries=args.max)
        if args.dry_run:
            print(
                json.dumps({"count": matching, "dry_run": True}) if args.json else f"would purge {matching:,}"
            )
            return 0
        answer = _ask(f"purge {matching:,} entries of {what} from space {args.space!r}? [y/N] ")
        if answer not in ("y", "yes"):
            print("outrig purge: not confirmed; nothing purged", file=sys.stderr)
            return 1
    removed = space.purge(templates, max_entries=args.max)
    print(json.dumps({"count": removed, "dry_run": False}) if args.json else f"purged {removed:,}")
    return 0


def _ask(question: str) -> str:
    print(question, end="", file=sys.stderr, flush=True)
    line = sys.stdin.readline()
    return line.strip().lower()


def _cancel(space: Any, args: argparse.Namespace) -> int:
    if args.registration is not None:
        space.cancel_registration(args.registration)
        print(f"registration {args.registration} cancelled")
    else:
        space.abort_transaction(args.transaction)
        print(f"transaction {args.transaction} aborted")
    return 0


_ACTIONS: dict[str, Callable[[Any, argparse.Namespace], int]] = {
    "describe": _describe,
    "browse": _browse,
    "purge": _purge,
    "cancel": _cancel,
}
