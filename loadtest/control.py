"""Killing and restarting the server under test: a server process the campaign started itself,
or shell commands for one it did not.

`outrig stress` starts the server as a `ManagedServer` and installs it here before Locust loads
the locustfile; plain ``locust -f loadtest/locustfile.py`` uses `CommandController` when given
``--kill-command`` and ``--restart-command``. The kill is a real SIGKILL: no clean shutdown, as
the original's ``System.exit`` in the space's process.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Protocol

__all__ = ["CommandController", "ControlError", "Controller", "ManagedServer", "install", "installed"]

_LISTENING = re.compile(r"outrig listening on (\S+)")
_WORKER = re.compile(r"outrig worker (\d+) listening on (\S+): pid (\d+)")
_RESTARTED = re.compile(r"outrig worker (\d+) restarted: pid (\d+)")


class ControlError(Exception):
    """The server could not be started, killed or restarted."""


class Controller(Protocol):
    """What the campaign needs to kill the server and bring it back."""

    def kill(self) -> None: ...

    def restart(self) -> None:
        """Start the server again and return once it accepts calls."""
        ...


_installed: Controller | None = None


def install(controller: Controller | None) -> None:
    """Make ``controller`` the one the campaign uses in this process."""
    global _installed
    _installed = controller


def installed() -> Controller | None:
    return _installed


class ManagedServer:
    """An `outrig serve` child process on a data dir, restartable on the same address.

    Its output goes to ``log`` (appended across restarts); the listening line is read from there.
    """

    def __init__(
        self,
        data_dir: Path,
        log: Path,
        *,
        serve_args: tuple[str, ...] = (),
        python: str = "",
        workers: int = 1,
    ) -> None:
        self.data_dir = data_dir
        self.log = log
        self.address = ""
        self.starts = 0
        self._serve_args = serve_args
        self._python = python or sys.executable
        self._process: subprocess.Popen[bytes] | None = None
        # With workers (`outrig serve --workers N`), a kill is of one worker in turn, which the
        # supervisor restarts: their own addresses and pids, from the log.
        self.workers = workers
        self.worker_addresses: list[str] = []
        self.worker_pids: list[int] = []
        self.kills = 0
        self._killed: tuple[int, int] | None = None  # (worker, log offset at its kill)

    def start(self, listen: str = "127.0.0.1:0", timeout: float = 120.0) -> str:
        """Start the server and return its address once it listens."""
        command = [
            self._python,
            "-m",
            "outrig.service",
            "serve",
            "--listen",
            listen,
            "--data-dir",
            str(self.data_dir),
            *self._serve_args,
            *(["--workers", str(self.workers)] if self.workers > 1 else []),
        ]
        offset = self.log.stat().st_size if self.log.exists() else 0
        environment = {k: v for k, v in os.environ.items() if not k.startswith("OUTRIG_")}
        with self.log.open("ab") as output:
            self._process = subprocess.Popen(
                command, stdout=output, stderr=subprocess.STDOUT, env=environment
            )
        self.starts += 1
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.log.open("rb") as output:
                output.seek(offset)
                found = _LISTENING.search(output.read().decode(errors="replace"))
            if found and self._workers_listed(offset):
                self.address = found.group(1)
                return self.address
            if self._process.poll() is not None:
                raise ControlError(
                    f"the server exited with status {self._process.returncode} before listening; "
                    f"see {self.log}"
                )
            time.sleep(0.05)
        self.stop()
        raise ControlError(f"the server did not listen within {timeout:.0f} s; see {self.log}")

    def _workers_listed(self, offset: int) -> bool:
        """Whether every worker has said where it listens (a lone server has none to say)."""
        if self.workers <= 1:
            return True
        with self.log.open("rb") as output:
            output.seek(offset)
            found = _WORKER.findall(output.read().decode(errors="replace"))
        if len(found) < self.workers:
            return False
        self.worker_addresses, self.worker_pids = [""] * self.workers, [0] * self.workers
        for index, address, pid in found[-self.workers :]:
            self.worker_addresses[int(index)], self.worker_pids[int(index)] = address, int(pid)
        return True

    def kill(self) -> None:
        if self._process is None or self._process.poll() is not None:
            raise ControlError("no running server to kill")
        if self.workers > 1:  # one worker, in turn: the supervisor restarts it
            victim = self.kills % self.workers
            self.kills += 1
            self._killed = (victim, self.log.stat().st_size)
            try:
                os.kill(self.worker_pids[victim], signal.SIGKILL)
            except ProcessLookupError as err:
                raise ControlError(
                    f"worker {victim} (pid {self.worker_pids[victim]}) is not running"
                ) from err
            return
        self._process.send_signal(signal.SIGKILL)
        self._process.wait()

    def restart(self) -> None:
        if not self.address:
            raise ControlError("the server was never started")
        if self._killed is not None:
            self._wait_restarted(*self._killed)
            self._killed = None
            return
        self.start(listen=self.address)

    def _wait_restarted(self, victim: int, offset: int, timeout: float = 120.0) -> None:
        """Return once the supervisor has restarted worker `victim` and it serves again."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.log.open("rb") as output:
                output.seek(offset)
                for index, pid in _RESTARTED.findall(output.read().decode(errors="replace")):
                    if int(index) == victim:
                        self.worker_pids[victim] = int(pid)
                        wait_until_serving(
                            self.worker_addresses[victim], max(1.0, deadline - time.monotonic())
                        )
                        return
            time.sleep(0.05)
        raise ControlError(f"worker {victim} was not restarted within {timeout:.0f} s; see {self.log}")

    def stop(self, timeout: float = 60.0) -> int | None:
        """Stop the server cleanly (SIGTERM), killing it after ``timeout`` seconds; its status."""
        process = self._process
        if process is None:
            return None
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        return process.returncode


class CommandController:
    """Kills and restarts a server through shell commands (``kill -9 ...``, ``docker kill ...``),
    then waits until ``address`` answers gRPC health checks again."""

    def __init__(self, kill_command: str, restart_command: str, address: str, timeout: float = 120.0) -> None:
        self.kill_command = kill_command
        self.restart_command = restart_command
        self.address = address
        self.timeout = timeout

    def kill(self) -> None:
        _run(self.kill_command, "--kill-command")

    def restart(self) -> None:
        _run(self.restart_command, "--restart-command")
        wait_until_serving(self.address, self.timeout)


def _run(command: str, flag: str) -> None:
    done = subprocess.run(command, shell=True, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise ControlError(f"{flag} exited with status {done.returncode}: {done.stderr.strip()[-500:]}")


def wait_until_serving(address: str, timeout: float) -> None:
    """Return once the server at ``address`` answers a gRPC health check with SERVING."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    deadline = time.monotonic() + timeout
    with grpc.insecure_channel(address) as channel:
        # types-grpcio-health-checking declares no methods on HealthStub: say what Check is.
        check: grpc.UnaryUnaryMultiCallable[health_pb2.HealthCheckRequest, health_pb2.HealthCheckResponse]
        check = health_pb2_grpc.HealthStub(channel).Check  # type: ignore[attr-defined]
        while True:
            try:
                reply = check(health_pb2.HealthCheckRequest(), timeout=1.0)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
            if time.monotonic() > deadline:
                raise ControlError(
                    f"the server at {address} did not serve within {timeout:.0f} s of its restart"
                )
            time.sleep(0.1)
