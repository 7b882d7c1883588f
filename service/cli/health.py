"""`outrig health [HOST:PORT]`: ask a server's gRPC health service whether it is SERVING.

Made for container health checks (the image's HEALTHCHECK) and for Kubernetes exec probes where the
kubelet's native `grpc:` probe cannot go: it speaks plaintext only, and a server under mutual TLS
accepts no connection without a client certificate. With `--tls-ca` (and `--tls-cert`/`--tls-key`)
the probe connects as a TLS client.

Without an address it probes the server the environment describes: OUTRIG_LISTEN (default
127.0.0.1:7480), with an any-address host (0.0.0.0, ::) replaced by loopback, so the image's
HEALTHCHECK follows a changed port.

Exit status: 0 the service is SERVING; 1 anything else (NOT_SERVING, unknown service, no answer in
time, unreachable, a TLS file that cannot be read). Docker reserves 2 in health checks, so only a
command-line mistake, which argparse reports, exits 2.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from outrig.service.config import DEFAULT_LISTEN

if TYPE_CHECKING:  # gRPC is imported by the probe itself: `outrig serve` has no use for it before its re-exec
    import grpc

_ANY_ADDRESS = {"0.0.0.0": "127.0.0.1", "::": "::1", "[::]": "[::1]", "": "127.0.0.1"}


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    health = commands.add_parser(
        "health",
        help="probe a server's gRPC health service (exit 0 when SERVING)",
        description="Ask the gRPC health service of the server at ADDRESS whether SERVICE is SERVING. "
        "Without ADDRESS, probe OUTRIG_LISTEN (an any-address host becomes loopback). Exit status: 0 "
        "SERVING; 1 not serving, unreachable or no answer within --timeout.",
    )
    health.add_argument(
        "address", metavar="ADDRESS", nargs="?", help="HOST:PORT (default: from OUTRIG_LISTEN)"
    )
    health.add_argument(
        "--service",
        default="",
        help="the health service name to ask about: '' (default, the server) or outrig.v1.Space",
    )
    health.add_argument("--timeout", type=float, default=3.0, metavar="S", help="seconds to wait (default 3)")
    health.add_argument("--tls-ca", metavar="PEM", type=Path, help="connect with TLS, trusting this CA")
    health.add_argument("--tls-cert", metavar="PEM", type=Path, help="client certificate (mutual TLS)")
    health.add_argument("--tls-key", metavar="PEM", type=Path, help="the client certificate's private key")
    health.add_argument(
        "--server-name",
        metavar="NAME",
        help="the name to check the server's certificate against (when ADDRESS is an IP the "
        "certificate does not name)",
    )
    health.add_argument("--quiet", "-q", action="store_true", help="print nothing, only set the status")


def default_address(environ: Mapping[str, str] | None = None) -> str:
    """The address to probe when none is given: OUTRIG_LISTEN with an any-address host made loopback."""
    listen = (os.environ if environ is None else environ).get("OUTRIG_LISTEN") or DEFAULT_LISTEN
    host, _, port = listen.rpartition(":")
    return f"{_ANY_ADDRESS.get(host, host)}:{port}"


def _channel(args: argparse.Namespace, address: str) -> grpc.Channel:
    import grpc

    if args.tls_ca is None and args.tls_cert is None and args.tls_key is None:
        if args.server_name is not None:
            raise ValueError("--server-name needs TLS (--tls-ca)")
        return grpc.insecure_channel(address)
    if (args.tls_cert is None) != (args.tls_key is None):
        raise ValueError("give --tls-cert and --tls-key together")
    credentials = grpc.ssl_channel_credentials(
        root_certificates=args.tls_ca.read_bytes() if args.tls_ca is not None else None,
        certificate_chain=args.tls_cert.read_bytes() if args.tls_cert is not None else None,
        private_key=args.tls_key.read_bytes() if args.tls_key is not None else None,
    )
    options = [] if args.server_name is None else [("grpc.ssl_target_name_override", args.server_name)]
    return grpc.secure_channel(address, credentials, options)


def probe(args: argparse.Namespace) -> tuple[bool, str]:
    """(serving, what to print)."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    address = args.address or default_address()
    service = repr(args.service) if args.service else "the server"
    try:
        channel = _channel(args, address)
    except (OSError, ValueError) as err:
        return False, f"outrig health: {err}"
    with channel:
        # types-grpcio-health-checking declares no methods on HealthStub: say what Check is.
        check: grpc.UnaryUnaryMultiCallable[health_pb2.HealthCheckRequest, health_pb2.HealthCheckResponse]
        check = health_pb2_grpc.HealthStub(channel).Check  # type: ignore[attr-defined]
        try:
            reply = check(health_pb2.HealthCheckRequest(service=args.service), timeout=args.timeout)
        except grpc.RpcError as err:
            return False, f"outrig health: {address}: {err.code().name}: {err.details()}"
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    return reply.status == health_pb2.HealthCheckResponse.SERVING, f"{address}: {service} is {status}"


def run(args: argparse.Namespace) -> int:
    serving, message = probe(args)
    if not args.quiet:
        print(message, file=sys.stdout if serving else sys.stderr)
    return 0 if serving else 1
