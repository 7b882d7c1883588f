"""`outrig stress`: one command that runs a whole campaign headless.

It starts a server on a fresh data dir (unless ``--target`` names one it does not manage), runs
Locust in this process on the packaged locustfile with the campaign's options, kills and restarts
the server as the campaign asks, has Locust write its CSV files and HTML report into the report
directory, and prints the verdict last. The exit status is the verdict's: 0 passed, 1 failed;
2 for bad options or a server that would not start.

It must run in a process where gevent patched the standard library before gRPC was imported:
`outrig.service.cli` starts it in a fresh interpreter that imports Locust first.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from locust import events
from locust.main import main as locust_main

import outrig.loadtest
from outrig.loadtest import control
from outrig.loadtest.control import ControlError, ManagedServer
from outrig.loadtest.options import CAMPAIGNS, add_arguments, namespace_args, params_from

__all__ = ["main", "parser"]


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="outrig stress",
        description="Run a Locust campaign against outrig, headless, and print its verdict last: "
        "`verdict: written=N read=N taken=N lost=N duplicated=N retries=N empty=yes|no` (the "
        "at-least-once profile: `verdict: jobs=N acked=A dead=M redelivered=R lost=0 duplicated_acks=0`). "
        "Arguments after `--` go to Locust as they are (e.g. -- --only-summary). "
        "Exit status: 0 the campaign passed; 1 it failed; 2 bad options or no server.",
    )
    add_arguments(parser, campaign_flag="--profile")
    group = parser.add_argument_group("the run")
    group.add_argument(
        "--target",
        metavar="HOST:PORT",
        help="run against this server instead of starting one "
        "(kills need --kill-command and --restart-command)",
    )
    group.add_argument(
        "--report-dir",
        type=Path,
        metavar="DIR",
        help="where Locust's CSV files and HTML report, the server's log and its data dir go "
        "(default: ./outrig-stress-<profile>-<time>)",
    )
    group.add_argument(
        "--data-dir",
        type=Path,
        metavar="DIR",
        help="the started server's data dir (default: REPORT_DIR/data)",
    )
    group.add_argument(
        "--durability",
        choices=["always", "interval"],
        default="always",
        help="the started server's --durability (interval: a kill may lose the last 20 ms, as documented)",
    )
    group.add_argument(
        "--commit-interval-ms", type=int, metavar="MS", help="the started server's --commit-interval-ms"
    )
    group.add_argument(
        "--workers",
        type=int,
        default=1,
        metavar="N",
        help="the started server runs N worker processes (outrig serve --workers N); a kill is then "
        "a SIGKILL of one worker in turn, which the supervisor restarts (default 1: one process)",
    )
    group.add_argument(
        "--partitions",
        type=int,
        default=1,
        metavar="N",
        help="the started server serves the campaign's space in N partitions by its entries' serial "
        "(docs/scaling.md; default 1: unpartitioned)",
    )
    parser.add_argument("locust_args", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    return parser


def _space_config(report_dir: Path, space: str, partitions: int, *, quick_backoff: bool) -> Path:
    """A configuration file for the campaign's space: in `partitions` by the campaign entries'
    serial; with `quick_backoff`, nacked jobs back off from 50 ms (at most 0.5 s) rather than
    the default 1 s (at most 10 min), so poison jobs reach their dead-letter space in seconds."""
    config = report_dir / "space.toml"
    lines = [f"[spaces.{space}]"]
    if partitions > 1:
        lines += ['partition_by = "serial"', f"partitions = {partitions}"]
    if quick_backoff:
        lines += ["nack_backoff = 0.05", "nack_backoff_max = 0.5"]
    config.write_text("\n".join(lines) + "\n")
    return config


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    if args.campaign is None:
        args.campaign = CAMPAIGNS[0]
    locust_args = [a for a in args.locust_args if a != "--"]
    try:
        params_from(args)
    except ValueError as err:
        print(f"outrig stress: {err}", file=sys.stderr)
        return 2
    report_dir: Path = args.report_dir or Path(
        f"outrig-stress-{args.campaign}-{time.strftime('%Y%m%d-%H%M%S')}"
    )
    report_dir.mkdir(parents=True, exist_ok=True)
    server: ManagedServer | None = None
    if args.target:
        address = args.target
    else:
        data_dir: Path = args.data_dir or report_dir / "data"
        if (data_dir / "outrig.db").exists():
            print(
                f"outrig stress: {data_dir} already holds a store; a campaign starts from a fresh one",
                file=sys.stderr,
            )
            return 2
        data_dir.mkdir(parents=True, exist_ok=True)
        serve_args = ["--durability", args.durability]
        if args.commit_interval_ms is not None:
            serve_args += ["--commit-interval-ms", str(args.commit_interval_ms)]
        quick_backoff = args.campaign == "at-least-once"
        if args.partitions > 1 or quick_backoff:
            config = _space_config(
                report_dir, params_from(args).space, args.partitions, quick_backoff=quick_backoff
            )
            serve_args += ["--config", str(config)]
        server = ManagedServer(
            data_dir, report_dir / "server.log", serve_args=tuple(serve_args), workers=args.workers
        )
        try:
            address = server.start()
        except ControlError as err:
            print(f"outrig stress: {err}", file=sys.stderr)
            return 2
        control.install(server)
        # Listeners of `quitting` run newest first: this one, registered before the campaign's,
        # stops the server after the campaign has listed what is left in the space.
        events.quitting.add_listener(lambda **_kw: server.stop())
    print(
        f"outrig stress: profile {args.campaign} against {address}"
        + (f" (started here; log {server.log})" if server else "")
        + f"; reports in {report_dir}/",
        flush=True,
    )
    locustfile = Path(outrig.loadtest.__file__).with_name("locustfile.py")
    sys.argv = [
        "locust",
        "-f",
        str(locustfile),
        "--headless",
        "--host",
        address,
        "--csv",
        str(report_dir / "stats"),
        "--html",
        str(report_dir / "report.html"),
        *namespace_args(args),
        *locust_args,
    ]
    try:
        locust_main()
    except SystemExit as done:
        code = done.code
    else:
        code = 0
    finally:
        if server is not None:
            server.stop()
    return code if isinstance(code, int) else 1
