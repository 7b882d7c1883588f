"""What security costs: throughput with a 10,000-grant policy vs none, the check with a 16-byte vs
a 3.6 MB payload, and TLS on vs off.

    python bench/security.py [--quick] [--seconds S] [--rounds N] [--runs N]

1. Throughput, end to end. Each run starts a fresh `outrig serve` process in one of four
   configurations and runs 10 client threads (a connection each, blocking SDK) that loop
   `read_nowait` of a small entry they wrote first: the cheapest call, so the one where a
   per-call check shows most.
     - plaintext:      no TLS, no authentication (the loopback default);
     - tls:            TLS, no authentication;
     - tls+token:      TLS and a bearer token on every call, no policy;
     - tls+token+policy: the same, and a policy of 10,000 grants (one per principal, the bench
                       principal's among them, plus 100 grants to "*" on other spaces).
   Rounds are interleaved (the order rotates each round); figures are medians over rounds x runs.
   Ratios: policy = (tls+token+policy) / (tls+token), TLS aside (target >= 0.95);
   tls = tls / plaintext.
2. The check alone, in process: `Guard.check` (authenticate the token from the cache, work out the
   resource, ask the policy's decision cache) on a decoded Write request whose entry is 16 bytes
   vs a 921,600 x int32 array (3.6 MB), with the 10,000-grant policy. The two must cost the same:
   the check reads names, never the payload. Also the cost of a decision on a cache miss, which
   looks only at the principal's own grants (and "*"'s), with 10 vs 10,000 grants.

Prints the core count and versions. Asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import grpc
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from google import protobuf
from measure import Sample, Window
from servers import start_outrig_with

import outrig
from outrig.service.config import ServerConfig
from outrig.service.security import certs, tokens
from outrig.service.security.policy import parse_policy
from outrig.service.security.principal import Principal
from outrig.service.security.settings import build_guard
from outrig.service.transport import handlers
from outrig.v1 import space_pb2 as pb

_OWN_CONNECTION = [("grpc.use_local_subchannel_pool", 1)]
PRINCIPAL = "bench-user"
CLIENTS = 10


@dataclass
class Job(outrig.Entry, type_name="bench.Job"):
    client: int | None = None
    note: str | None = None


def policy_text(grants: int) -> str:
    """`grants` grants, one per principal, the bench principal's in the middle; 100 more for "*"."""
    lines = []
    for i in range(grants):
        resources = f'"outrig://space{i}/*"'
        who, actions = f"user{i}", '"read"'
        if i == grants // 2:
            who, resources, actions = PRINCIPAL, resources + ', "outrig://bench/*"', '"read", "write"'
        lines.append(f'[[grant]]\nprincipals = ["{who}"]\nresources = [{resources}]\nactions = [{actions}]\n')
    for i in range(100):
        lines.append(
            f'[[grant]]\nprincipals = ["*"]\nresources = ["outrig://public{i}/-"]\nactions = ["read"]\n'
        )
    return "".join(lines)


@dataclass(frozen=True)
class Material:
    dir: Path
    token: str
    key: Ed25519PrivateKey

    def path(self, name: str) -> str:
        return str(self.dir / name)


def make_material(root: Path) -> Material:
    certs.write_dev_certificates(root)
    private, _ = tokens.write_key_pair(root)
    key = tokens.load_private_key(private)
    (root / "policy.toml").write_text(policy_text(10_000))
    return Material(root, tokens.issue_token(key, PRINCIPAL, 3600), key)


@dataclass(frozen=True)
class Configuration:
    name: str
    tls: bool
    token: bool
    policy: bool


CONFIGURATIONS = (
    Configuration("plaintext", tls=False, token=False, policy=False),
    Configuration("tls", tls=True, token=False, policy=False),
    Configuration("tls+token", tls=True, token=True, policy=False),
    Configuration("tls+token+policy", tls=True, token=True, policy=True),
)


def _flags(configuration: Configuration, material: Material) -> list[str]:
    flags = ["--in-memory", "--log-level", "WARNING"]
    if configuration.tls:
        flags += ["--tls-cert", material.path("server.pem"), "--tls-key", material.path("server.key")]
    if configuration.token:
        flags += ["--token-public-key", material.path("token.pub")]
    if configuration.policy:
        flags += ["--policy", material.path("policy.toml")]
    return flags


def _client(
    configuration: Configuration,
    material: Material,
    address: str,
    number: int,
    start: threading.Barrier,
    windows: list[Window],
    counts: list[int | Exception],
) -> None:
    tls = outrig.TLS(ca=material.path("ca.pem")) if configuration.tls else None
    token = material.token if configuration.token else None
    try:
        with outrig.connect(address, space="bench", options=_OWN_CONNECTION, tls=tls, token=token) as space:
            space.write(Job(client=number, note="x" * 32), lease=600.0)
            template = Job(client=number)
            start.wait()
            warm, end = windows[0].warm, windows[0].end
            done = 0
            while (now := time.monotonic()) < end:
                if space.read_nowait(template) is None:
                    raise RuntimeError("the entry this client wrote is gone")
                if now >= warm:
                    done += 1
            counts[number] = done
    except Exception as err:
        counts[number] = err
        start.abort()


def measure(configuration: Configuration, material: Material, seconds: float, warmup: float) -> Sample:
    workdir = Path(tempfile.mkdtemp(prefix=f"outrig-bench-security-{configuration.name}-"))
    server = start_outrig_with(workdir, *_flags(configuration, material))
    try:
        counts: list[int | Exception] = [0] * CLIENTS
        windows: list[Window] = []

        def go() -> None:  # once every client is connected: the window, and CPU time at its edges
            windows.append(Window(warmup, seconds, server))

        start = threading.Barrier(CLIENTS, action=go)
        threads = [
            threading.Thread(
                target=_client, args=(configuration, material, server.address, i, start, windows, counts)
            )
            for i in range(CLIENTS)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        failed = [count for count in counts if isinstance(count, Exception)]
        failed.sort(key=lambda err: isinstance(err, threading.BrokenBarrierError))
        if failed:
            raise RuntimeError(f"{len(failed)} clients failed ({configuration.name})") from failed[0]
        return windows[0].sample(sum(count for count in counts if isinstance(count, int)))
    finally:
        server.stop()
        shutil.rmtree(workdir, ignore_errors=True)


class _Context:
    """What `Guard.check` reads of a grpc.aio ServicerContext: the call's metadata and peer."""

    def __init__(self, token: str) -> None:
        self._metadata = (("user-agent", "bench"), ("authorization", f"Bearer {token}"))

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._metadata

    def peer(self) -> str:
        return "ipv4:127.0.0.1:1"

    def auth_context(self) -> dict[str, list[bytes]]:
        return {}


def _write_request(entry: pb.Entry) -> handlers.Received[pb.WriteRequest]:
    raw = pb.WriteRequest(space="bench", entry=entry).SerializeToString()
    return handlers.Received(pb.WriteRequest.FromString(raw), raw)


def _per_call(call: Callable[[], object], n: int) -> float:
    started = time.perf_counter()
    for _ in range(n):
        call()
    return (time.perf_counter() - started) / n


def check_costs(material: Material, rounds: int, n: int) -> None:
    config = ServerConfig(token_public_key=material.dir / "token.pub", policy=material.dir / "policy.toml")
    guard = build_guard(config)
    context = _Context(material.token)
    small = pb.Entry(type_name="bench.Job", fields={"b": pb.Value(bytes_value=b"x" * 16)})
    big = pb.Entry(
        type_name="bench.Job",
        fields={"frame": pb.Value(array_value=pb.TypedArray(dtype=pb.DTYPE_INT32, data=bytes(4 * 921_600)))},
    )
    requests = {"16 B": _write_request(small), "3.6 MB": _write_request(big)}
    samples: dict[str, list[float]] = {name: [] for name in requests}
    for _ in range(rounds):
        for name, request in requests.items():
            guard.check(context, "Write", request)  # warm the caches
            samples[name].append(_per_call(lambda r=request: guard.check(context, "Write", r), n))  # type: ignore[misc]
    print(f"| payload | Guard.check per call (median of {rounds} rounds x {n:,}) | min | max |")
    print("|---|---|---|---|")
    for name, values in samples.items():
        size = len(requests[name].raw)
        print(
            f"| {name} ({size:,} bytes on the wire) | {statistics.median(values) * 1e6:.2f} us | "
            f"{min(values) * 1e6:.2f} | {max(values) * 1e6:.2f} |"
        )
    check_ratio = statistics.median(samples["3.6 MB"]) / statistics.median(samples["16 B"])
    print(f"ratio 3.6 MB / 16 B: {check_ratio:.2f}")
    print()
    print("| grants | decision on a cache miss (median) |")
    print("|---|---|")
    principal = Principal(PRINCIPAL)
    for grants in (10, 10_000):
        policy = parse_policy(_toml(policy_text(grants)))
        times = [
            _per_call(lambda p=policy: p._decide(principal, "read", "bench", "bench.Job"), n // 10)  # type: ignore[misc]
            for _ in range(rounds)
        ]
        print(f"| {grants:,} | {statistics.median(times) * 1e6:.2f} us |")
    print()


def _toml(text: str) -> dict[str, object]:
    import tomllib

    return tomllib.loads(text)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="a short smoke run: 1 round x 1 run of 1 s")
    parser.add_argument("--seconds", type=float, default=3.0, help="measured seconds per run (default 3)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--runs", type=int, default=2, help="runs per configuration per round")
    args = parser.parse_args()
    seconds, warmup, rounds, runs, n = args.seconds, 0.5, args.rounds, args.runs, 20_000
    if args.quick:
        seconds, warmup, rounds, runs, n = 1.0, 0.3, 1, 1, 2_000

    print(
        f"outrig security bench: {os.cpu_count()} cores, Python {platform.python_version()}, "
        f"grpcio {grpc.__version__}, protobuf {protobuf.__version__}"
    )
    root = Path(tempfile.mkdtemp(prefix="outrig-bench-security-pki-"))
    try:
        material = make_material(root)
        print()
        print("## The check alone (in process, 10,000-grant policy, token cached)")
        print()
        check_costs(material, max(rounds, 3), n)
        print("## Throughput: read_nowait calls/s, 10 client threads, a fresh server per run")
        print(f"{rounds} rounds x {runs} runs of {seconds:g} s (after {warmup:g} s warm-up), interleaved")
        print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
        results: dict[str, list[Sample]] = {}
        for round_number in range(rounds):
            shift = round_number % len(CONFIGURATIONS)
            order = CONFIGURATIONS[shift:] + CONFIGURATIONS[:shift]
            for _ in range(runs):
                for configuration in order:
                    sample = measure(configuration, material, seconds, warmup)
                    results.setdefault(configuration.name, []).append(sample)
        print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        print()
        medians = {name: statistics.median(s.rate for s in values) for name, values in results.items()}
        cpu = {name: statistics.median(s.server_cpu for s in values) for name, values in results.items()}
        print(
            "| configuration | calls/s (median) | min | max | vs plaintext | server CPU per call (median) |"
        )
        print("|---|---|---|---|---|---|")
        for configuration in CONFIGURATIONS:
            rates = [s.rate for s in results[configuration.name]]
            print(
                f"| {configuration.name} | {medians[configuration.name]:,.0f} | {min(rates):,.0f} | "
                f"{max(rates):,.0f} | {medians[configuration.name] / medians['plaintext']:.2f} | "
                f"{cpu[configuration.name] * 1e6:.0f} us |"
            )
        print()

        def ratios(of: dict[str, float], inverse: bool) -> str:
            def r(a: str, b: str) -> float:
                return of[b] / of[a] if inverse else of[a] / of[b]

            return (
                f"policy={r('tls+token+policy', 'tls+token'):.2f} tls={r('tls', 'plaintext'):.2f} "
                f"token={r('tls+token', 'tls'):.2f}"
            )

        print(f"ratios of calls/s: {ratios(medians, inverse=False)}")
        print(f"ratios of server CPU per call (inverted: higher is cheaper): {ratios(cpu, inverse=True)}")
        print(
            "policy = 10,000 grants vs none, TLS aside (target >= 0.95); tls = TLS on vs off; "
            "token = a token on every call vs none, on TLS"
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
