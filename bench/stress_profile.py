"""Where the outrig server spends its time during a stress campaign, sampled with py-spy.

    python bench/stress_profile.py [--seconds S] [--out DIR] [-- OUTRIG STRESS OPTIONS ...]

Runs `outrig stress` (by default the full-size stress-with-shutdown profile: 10,000 entries,
500 writers, 500 readers, one kill, restart_wait 10 s) and samples the server it starts with
``py-spy record --threads --native`` twice: during the writes, in the first server process, and
during the reads and takes, in the process restarted after the kill; and the Locust process
that runs the users, during the writes. Each window lasts S seconds (default 4) and starts 0.2 s
after that server process prints its listening line. The tables are bench/hotspots.py's: the
main thread's busy share, its busy samples by owner, and the top functions.

Needs py-spy (``pip install py-spy``; sampling another process needs root or ptrace rights).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from hotspots import Profile, _py_spy, parse, report


def _server_pids(data_dir: Path) -> list[int]:
    done = subprocess.run(
        ["pgrep", "-f", f"outrig.service serve .*--data-dir {data_dir}"],
        capture_output=True,
        text=True,
        check=False,
    )
    return [int(pid) for pid in done.stdout.split()]


def _listening_lines(log: Path) -> int:
    return log.read_text(errors="replace").count("outrig listening on") if log.exists() else 0


def _record(pid: int, seconds: float, raw: Path) -> subprocess.Popen[str]:
    command = [_py_spy(), "record", "-p", str(pid), "-d", str(int(seconds)), "-f", "raw", "-o", str(raw)]
    return subprocess.Popen(
        [*command, "--threads", "--native"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=4.0, help="length of each sampling window")
    parser.add_argument("--out", type=Path, help="where the campaign's reports and raw profiles go")
    parser.add_argument("stress_args", nargs=argparse.REMAINDER, help="options for `outrig stress`")
    args = parser.parse_args(argv)
    if not _py_spy():
        sys.exit("bench/stress_profile.py needs py-spy: pip install py-spy")
    out: Path = args.out or Path(tempfile.mkdtemp(prefix="outrig-stress-profile-"))
    data_dir = (out / "data").resolve()
    stress = [a for a in args.stress_args if a != "--"]
    outrig = str(Path(sys.executable).with_name("outrig"))
    command = [
        outrig,
        "stress",
        "--report-dir",
        str(out),
        "--data-dir",
        str(data_dir),
        *stress,
        "--",
        "--only-summary",
    ]
    print(f"running: {' '.join(command)}", flush=True)
    started = time.monotonic()
    campaign = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    windows = [
        ("writes (first server process)", out / "writes.raw.txt"),
        ("reads and takes (after the restart)", out / "reads.raw.txt"),
    ]
    profiles: list[tuple[str, Profile]] = []
    seen: set[int] = set()
    for name, raw in windows:
        pid = 0
        while campaign.poll() is None and not pid:
            fresh = [p for p in _server_pids(data_dir) if p not in seen]
            pid = fresh[0] if fresh else 0
            time.sleep(0.05)
        if not pid:
            break
        seen.add(pid)
        # Sample the serving, not the start: wait for this process's listening line.
        log = out / "server.log"
        while campaign.poll() is None and _listening_lines(log) < len(seen):
            time.sleep(0.05)
        time.sleep(0.2)
        spies = [(f"server during the {name}", pid, raw, _record(pid, args.seconds, raw))]
        if not profiles:  # the Locust process too, once: it shares the 2 cores with the server
            client_raw = out / "locust.raw.txt"
            spies.append(
                (
                    "Locust process (the users) during the writes",
                    campaign.pid,
                    client_raw,
                    _record(campaign.pid, args.seconds, client_raw),
                )
            )
        for title, sampled, path, spy in spies:
            if spy.wait() != 0:
                assert spy.stderr is not None
                print(f"py-spy failed on {title}: {spy.stderr.read().strip()[-300:]}")
                continue
            profiles.append((title, parse(path, sampled, args.seconds)))
    output, _ = campaign.communicate()
    elapsed = time.monotonic() - started
    print(output[-2500:])
    print(
        f"campaign: {elapsed:.1f} s in all, exit status {campaign.returncode}; "
        f"reports and raw profiles in {out}"
    )
    print()
    for name, profile in profiles:
        report(name, profile, rate=0.0)


if __name__ == "__main__":
    main()
