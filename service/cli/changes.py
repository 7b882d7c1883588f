"""`outrig changes SPACE ...`: a space's change log from a cursor, then live, through the SDK's
`Space.changes`, one JSON object per line on standard output:
`{"cursor": ..., "kind": "write", "at": ..., "transaction": 0, "entry": {"type": ...,
"supertypes": [...], "fields": {...}}}` (`visible_at` too for a delayed write), as `outrig dump`
writes an entry. Templates are `outrig describe`'s (`--type`, `--where`), the connection options
`outrig spaces`' (`--address`, TLS, `--token-file`).

`--since CURSOR` starts after a cursor (a line's `cursor`; none: from now), `--kinds` keeps some
kinds, `--durable NAME` reads (and makes) a durable subscription, and `--ack` acknowledges each
change once printed. `--max N` stops after N changes, `--idle S` after S seconds without one;
then the last line printed to standard error is `cursor: CURSOR`, where to go on from. Exit
status 0; 2 if the server cannot be reached or refuses (a compacted cursor prints the oldest one
still held).
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
from typing import Any

from outrig.service.cli.admin import _connect_args, _connection_options, _document
from outrig.service.cli.inspection import _template_options, _templates

__all__ = ["add_parser", "run"]

_KINDS = ("write", "take", "expire", "cancel", "purge", "dead")


def add_parser(commands: Any) -> None:
    changes = commands.add_parser(
        "changes",
        help="stream a space's changes (from a cursor, then live) as JSON lines",
        description="Stream the changes of SPACE's entries that match the templates (--type, --where; "
        "none: every entry): first those its change log holds after --since, then each as it happens, one "
        "JSON object per line with the cursor after it. Needs the notify action under a policy.",
    )
    changes.add_argument("space", metavar="SPACE")
    _template_options(changes, required=False)
    changes.add_argument("--since", metavar="CURSOR", help="start after this cursor (default: from now)")
    changes.add_argument(
        "--kinds", nargs="+", choices=_KINDS, metavar="KIND", help=f"only these kinds ({', '.join(_KINDS)})"
    )
    changes.add_argument("--durable", metavar="NAME", help="read (and make) the durable subscription NAME")
    changes.add_argument(
        "--ack", action="store_true", help="acknowledge each change once printed (--durable)"
    )
    changes.add_argument("--max", type=int, default=0, metavar="N", help="stop after N changes (0: never)")
    changes.add_argument(
        "--idle",
        type=float,
        default=0.0,
        metavar="S",
        help="stop after S seconds without a change (0: never)",
    )
    _connection_options(changes, retry=30.0)  # the SDK's default: a stream resumes across restarts


def _line(change: Any) -> str:
    document: dict[str, Any] = {
        "cursor": change.cursor,
        "kind": change.kind,
        "at": change.at,
        "transaction": change.transaction,
        "entry": _document(change.entry),
    }
    if change.visible_at is not None:
        document["visible_at"] = change.visible_at
    return json.dumps(document, ensure_ascii=False)


def run(args: argparse.Namespace) -> int:
    import outrig

    if args.ack and not args.durable:
        print("outrig changes: --ack needs --durable NAME", file=sys.stderr)
        return 2
    stream: Any = None
    try:
        options = _connect_args(args)
        templates = _templates(args)
        with (
            outrig.connect(
                args.address, space=args.space, retry_deadline=args.retry_deadline, **options
            ) as space,
            space.changes(templates, since=args.since, kinds=args.kinds, durable=args.durable) as stream,
        ):
            idle = _Idle(stream, args.idle)
            for printed, change in enumerate(stream, 1):
                idle.seen()
                print(_line(change), flush=True)
                if args.ack:
                    stream.ack(change.cursor)
                if args.max and printed >= args.max:
                    break
            idle.stop()
            print(f"cursor: {stream.cursor}", file=sys.stderr)
    except outrig.CompactedError as err:
        print(f"outrig changes: CompactedError: {err}; oldest cursor: {err.oldest}", file=sys.stderr)
        return 2
    except (outrig.OutrigError, ValueError, TypeError) as err:
        print(f"outrig changes: {type(err).__name__}: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        if stream is not None:
            print(f"cursor: {stream.cursor}", file=sys.stderr)
        return 0
    return 0


class _Idle:
    """Closes the stream after `seconds` without a change (0: never), from a timer thread."""

    def __init__(self, stream: Any, seconds: float) -> None:
        self._stream = stream
        self._seconds = seconds
        self._timer: threading.Timer | None = None
        self.seen()

    def seen(self) -> None:
        self.stop()
        if self._seconds > 0:
            self._timer = threading.Timer(self._seconds, self._stream.close)
            self._timer.daemon = True
            self._timer.start()

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
