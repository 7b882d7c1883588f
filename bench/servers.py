"""Starting and stopping the server processes the benchmarks measure: outrig, the no-op gRPC server
and redis-server. Each runs as its own process on a free port of 127.0.0.1, with its log in a work
dir, and can report its resident memory and CPU time while it runs."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

#: Large enough for the HD array entry (3.6 MB) with room to spare; the SDK's default is 64 MiB too.
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
REDIS_MISSING = (
    "redis-server was not found, so the Redis rows were skipped; install it with "
    "`apt-get install -y redis-server` (Debian) and run again"
)
_HERE = Path(__file__).resolve().parent
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")

# Raised quotas: the HD array writes hold up to a few GB between cleanups, and the scaling
# section stores 1,000,000 entries (the default quota) plus the ones it writes while measuring.
OUTRIG_CONFIG = """\
[space_defaults]
max_entries = 10000000
max_bytes = 68719476736
"""


class ServerProcess:
    """A server process this bench started."""

    def __init__(
        self, name: str, process: subprocess.Popen[str], address: str, log: Path, startup_seconds: float = 0.0
    ) -> None:
        self.name = name
        self.process = process
        self.address = address
        self.log = log
        self.startup_seconds = startup_seconds  # from Popen to the line that gives the address

    @property
    def pid(self) -> int:
        return self.process.pid

    def rss_bytes(self) -> int:
        """Resident memory now (VmRSS)."""
        with open(f"/proc/{self.pid}/statm") as statm:
            return int(statm.read().split()[1]) * _PAGE

    def cpu_seconds(self) -> float:
        """User + system CPU time used so far, all threads included."""
        with open(f"/proc/{self.pid}/stat") as stat:
            fields = stat.read().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS

    def allocator(self) -> str:
        """The allocator serving the process's malloc, from the libraries it maps: tcmalloc or
        jemalloc if one is loaded (`outrig serve --allocator auto` preloads tcmalloc where it is
        installed), else glibc."""
        with open(f"/proc/{self.pid}/maps") as maps:
            mapped = maps.read()
        for name in ("tcmalloc", "jemalloc"):
            if f"lib{name}" in mapped:
                return name
        return "glibc"

    def check_alive(self) -> None:
        if self.process.poll() is not None:
            raise RuntimeError(f"{self.name} exited with {self.process.returncode}; its log: {self.log}")

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if it has not exited after 15 s."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.process.stdout is not None:
            self.process.stdout.close()

    def stop_cleanly(self, timeout: float) -> float:
        """SIGTERM; the seconds until the process exited. Raises if it does not exit within
        `timeout` (then it is killed) or exits with a status other than 0."""
        started = time.perf_counter()
        self.process.send_signal(signal.SIGTERM)
        try:
            code = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise RuntimeError(f"{self.name} did not stop within {timeout:g} s of SIGTERM") from None
        finally:
            if self.process.stdout is not None:
                self.process.stdout.close()
        if code != 0:
            raise RuntimeError(f"{self.name} exited with {code}:\n{self.log.read_text()[-2000:]}")
        return time.perf_counter() - started


def stop_all(servers: Iterable[ServerProcess], workdir: Path) -> None:
    """Stop every server a bench started, then remove its work dir."""
    for server in servers:
        server.stop()
    shutil.rmtree(workdir, ignore_errors=True)


def _start_python_server(
    name: str, command: list[str], pattern: str, workdir: Path, extra_env: Mapping[str, str] | None = None
) -> ServerProcess:
    """Start a server that prints its address on stdout once it serves (`extra_env` added to its
    environment: an LD_PRELOAD, GLIBC_TUNABLES)."""
    log = workdir / f"{name}.log"
    environment = {k: v for k, v in os.environ.items() if not k.startswith("OUTRIG_")}
    environment.update(extra_env or {})
    with log.open("w") as stderr:
        began = time.perf_counter()
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=stderr, text=True, env=environment)
        assert process.stdout is not None
        line = process.stdout.readline()
        seconds = time.perf_counter() - began
    match = re.search(pattern, line)
    if match is None:
        process.kill()
        process.wait()
        raise RuntimeError(f"{name} did not start:\n{log.read_text()[-2000:]}")
    return ServerProcess(name, process, match.group(1), log, seconds)


# How `python` runs outrig's CLI; bench/pair_costs.py runs variant servers through itself.
OUTRIG_PROGRAM = ("-m", "outrig.service")


def start_outrig_with(
    workdir: Path,
    *flags: str,
    name: str = "outrig",
    program: Sequence[str] = OUTRIG_PROGRAM,
    python: str = sys.executable,
    extra_env: Mapping[str, str] | None = None,
) -> ServerProcess:
    """`outrig serve --listen 127.0.0.1:0 FLAGS...`, its log in workdir/NAME.log (`python`: the
    interpreter, another checkout's virtualenv for a before/after run; `extra_env`: added to its
    environment)."""
    command = [python, *program, "serve", "--listen", "127.0.0.1:0", *flags]
    return _start_python_server(name, command, r"outrig listening on (\S+)", workdir, extra_env)


def _bench_flags(workdir: Path) -> list[str]:
    """Raised message size and quotas (a config file in workdir), warnings only in the log."""
    config = workdir / "outrig.toml"
    config.write_text(OUTRIG_CONFIG)
    return ["--max-message-bytes", str(MAX_MESSAGE_BYTES), "--config", str(config), "--log-level", "WARNING"]


def start_outrig(
    workdir: Path,
    name: str = "outrig",
    program: Sequence[str] = OUTRIG_PROGRAM,
    python: str = sys.executable,
    extra_env: Mapping[str, str] | None = None,
) -> ServerProcess:
    """An in-memory `outrig serve` with raised message size and quotas."""
    return start_outrig_with(
        workdir,
        "--in-memory",
        *_bench_flags(workdir),
        name=name,
        program=program,
        python=python,
        extra_env=extra_env,
    )


def start_durable_outrig(
    workdir: Path,
    *flags: str,
    name: str = "outrig-durable",
    python: str = sys.executable,
    extra_env: Mapping[str, str] | None = None,
) -> ServerProcess:
    """`outrig serve --data-dir workdir/NAME-data --durability always FLAGS...` (a fresh, empty data
    dir), with start_outrig's raised message size and quotas."""
    data = workdir / f"{name}-data"
    shutil.rmtree(data, ignore_errors=True)
    return start_outrig_with(
        workdir,
        "--data-dir",
        str(data),
        "--durability",
        "always",
        *_bench_flags(workdir),
        *flags,
        name=name,
        python=python,
        extra_env=extra_env,
    )


def start_noop(workdir: Path) -> ServerProcess:
    command = [
        sys.executable, str(_HERE / "noop_server.py"), "--listen", "127.0.0.1:0",
        "--max-message-bytes", str(MAX_MESSAGE_BYTES),
    ]  # fmt: skip
    return _start_python_server("noop", command, r"noop listening on (\S+)", workdir)


def redis_available() -> bool:
    return shutil.which("redis-server") is not None


def free_port() -> int:
    """A port of 127.0.0.1 free now (another process may take it before it is used)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def start_redis(workdir: Path, aof_always: bool = False) -> ServerProcess:
    """redis-server on a free port; ready once it answers PING. Nothing is saved to disk, or with
    `aof_always` every write is appended to an AOF in workdir/redis-aof and fsynced before the reply
    (`--appendonly yes --appendfsync always`; Redis fsyncs once per event-loop pass, for all the
    clients whose writes arrived in it)."""
    port = free_port()
    name = "redis-aof" if aof_always else "redis"
    directory = workdir / name if aof_always else workdir
    directory.mkdir(exist_ok=True)
    log = workdir / f"{name}.log"
    persistence = ["--appendonly", "yes", "--appendfsync", "always"] if aof_always else ["--appendonly", "no"]
    command = [
        "redis-server", "--bind", "127.0.0.1", "--port", str(port), "--save", "", *persistence,
        "--dir", str(directory),
    ]  # fmt: skip
    with log.open("w") as output:
        process = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT, text=True)
    server = ServerProcess(name, process, f"127.0.0.1:{port}", log)
    deadline = time.monotonic() + 10.0
    while True:
        server.check_alive()
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1.0) as sock:
                sock.sendall(b"PING\r\n")
                if sock.recv(64).startswith(b"+PONG"):
                    return server
        except OSError:
            pass
        if time.monotonic() > deadline:
            server.stop()
            raise RuntimeError(f"redis-server did not answer PING within 10 s; its log: {log}")
        time.sleep(0.05)
