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
        self, data_dir: Path, log: Path, *, serve_args: tuple[str, ...] = (), python: str = ""
    ) -> None:
        self.data_dir = data_dir
        self.log = log
        self.address = ""
        self.starts = 0
        self._serve_args = serve_args
        self._python = python or sys.executable
        self._process: subprocess.Popen[bytes] | None = None

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
            if found:
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

    def kill(self) -> None:
        if self._process is None or self._process.poll() is not None:
            raise ControlError("no running server to kill")
        self._process.send_signal(signal.SIGKILL)
        self._process.wait()

    def restart(self) -> None:
        if not self.address:
            raise ControlError("the server was never started")
        self.start(listen=self.address)

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
