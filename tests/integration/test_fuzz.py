"""Fuzzing a real server with seeded random and mutated requests (issue 17, "Also build").

Valid encodings of every request type of outrig.v1.Space are mutated (bit flips, truncation,
splicing, huge lengths, overlong varints, groups, deep nesting, invalid UTF-8, random bytes) and
sent to every RPC: the unary methods, the Contents and Notify streams (with a short deadline), and
as the ops of Mux frames, which are mutated in turn. Every answer must be OK or one of the
refusals the protocol documents, never INTERNAL or UNKNOWN; afterwards the server still serves a
write and a take and reports SERVING, its memory has not run away, and its log is a few lines,
not a traceback per request. Against the in-memory and the durable (SQLite) embedded backend.

The seed is OUTRIG_FUZZ_SEED (17 unless set); a failure prints the requests that failed, hex.
"""

from __future__ import annotations

import asyncio
import functools
import os
import random
import struct
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from pathlib import Path

import grpc
import pytest
from google.protobuf.message import Message
from grpc_health.v1 import health_pb2, health_pb2_grpc

from outrig._protocol import varint
from outrig.v1 import space_pb2 as pb

from ..conftest import ServerProcess, start_server

SEED = int(os.environ.get("OUTRIG_FUZZ_SEED", "17"))
UNARY_PER_METHOD = 150  # mutated requests per method, each backend
MUX_FRAMES = 500  # Mux frames, each backend (one to four ops each)
DEADLINE = 0.5  # seconds: a call that would block (a take without timeout, a notify) ends here
IN_FLIGHT = 48  # calls at once
RSS_GROWTH = 200 * 1024 * 1024  # bytes the server may grow by, generously

#: What a reply may be: OK, a documented refusal, or the client's own deadline on a call that
#: blocks as asked. Never INTERNAL, UNKNOWN, or UNAVAILABLE from a server that is not stopping.
ALLOWED = frozenset(
    {
        grpc.StatusCode.OK,
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.UNIMPLEMENTED,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.CANCELLED,
    }
)
_BY_NUMBER = {code.value[0]: code for code in grpc.StatusCode}

STREAMING = frozenset({"Contents", "Notify"})
#: MuxOp's field for each unary method (proto/outrig/v1/space.proto).
OP_FIELDS = {
    "Write": 2, "WriteMany": 3, "Read": 4, "Take": 5, "ReadMany": 6, "TakeMany": 7,
    "RenewLeases": 8, "CancelLeases": 9, "Count": 10, "Begin": 11, "Commit": 12, "Abort": 13,
}  # fmt: skip
MARK = "MARK"  # in the seeds' strings: where invalid UTF-8 goes


# ---------------------------------------------------------------- valid requests to start from


def _values() -> dict[str, pb.Value]:
    nested = pb.Value(
        list_value=pb.ListValue(
            items=[
                pb.Value(int_value=-3),
                pb.Value(
                    map_value=pb.MapValue(items=[pb.MapItem(key=f"k{MARK}", value=pb.Value(bool_value=True))])
                ),
            ]
        )
    )
    return {
        "n": pb.Value(int_value=7),
        f"s{MARK}": pb.Value(string_value=f"text {MARK}"),
        "d": pb.Value(double_value=2.5),
        "b": pb.Value(bytes_value=b"\x00\x01"),
        "z": pb.Value(null_value=pb.Null()),
        "a": pb.Value(array_value=pb.TypedArray(dtype=pb.DTYPE_INT32, data=b"\x01\x00\x00\x00" * 4)),
        "l": nested,
    }


def _entry(big: bool = False) -> pb.Entry:
    entry = pb.Entry(type_name=f"fuzz.Thing{MARK}", supertypes=["fuzz.Base"], fields=_values())
    if big:  # over 64 KiB: the server's path that reads arrays through views
        entry.fields["big"].array_value.dtype = pb.DTYPE_UINT8
        entry.fields["big"].array_value.data = b"\x07" * 70_000
    return entry


def _templates() -> list[pb.Template]:
    values = _values()
    return [
        pb.Template(type_name=f"fuzz.Thing{MARK}", fields={"n": values["n"], "l": values["l"]}),
        pb.Template(type_name="fuzz.Base"),
    ]


def seeds(space: str) -> dict[str, list[bytes]]:
    """Valid requests of each method (some refused for what they say, none for their bytes)."""
    lease = pb.LeaseDuration(seconds=30.0)
    forever = pb.LeaseDuration(forever=True)
    match = [
        pb.MatchRequest(
            space=space, templates=_templates(), timeout=0.0, max_entries=5, request_id=f"r{MARK}"
        ),
        pb.MatchRequest(space=space, templates=_templates()[1:], timeout=0.01, if_exists=True, max_entries=2),
    ]
    requests: dict[str, Sequence[Message]] = {
        "Write": [
            pb.WriteRequest(space=space, entry=_entry(), lease=lease, request_id=f"w{MARK}"),
            pb.WriteRequest(space=space, entry=_entry(big=True), lease=forever),
        ],
        "WriteMany": [
            pb.WriteManyRequest(space=space, entries=[_entry(), _entry()], lease=lease),
            pb.WriteManyRequest(space=space, entries=[_entry(big=True), _entry()]),
        ],
        "Read": match,
        "Take": match,
        "ReadMany": match,
        "TakeMany": match,
        "Contents": [pb.ContentsRequest(space=space, templates=_templates(), max_entries=10)],
        "Count": [pb.CountRequest(space=space, templates=_templates())],
        "Notify": [
            pb.NotifyRequest(space=space, templates=_templates(), lease=lease),
            pb.NotifyRequest(space=space, resume=12345),
        ],
        "RenewLeases": [
            pb.RenewLeasesRequest(
                space=space,
                renewals=[pb.LeaseRenewal(id=1, duration=lease), pb.LeaseRenewal(id=2, duration=forever)],
            )
        ],
        "CancelLeases": [pb.CancelLeasesRequest(space=space, ids=[1, 2, 2**63])],
        "Begin": [pb.BeginRequest(space=space, lease=lease)],
        "Commit": [pb.EndRequest(space=space, transaction=77)],
        "Abort": [pb.EndRequest(space=space, transaction=78)],
    }
    return {method: [r.SerializeToString() for r in rs] for method, rs in requests.items()}


# ---------------------------------------------------------------- mutations


def _field(number: int, content: bytes) -> bytes:
    return varint((number << 3) | 2) + varint(len(content)) + content


def _nested(depth: int, maps: bool) -> bytes:
    value = b"\x18\x02"  # Value.int_value = 1 (sint64)
    for _ in range(depth):
        if maps:
            value = _field(9, _field(1, _field(1, b"k") + _field(2, value)))
        else:
            value = _field(8, _field(1, value))
    return value


def _deep(method: str, rng: random.Random, space: bytes) -> bytes:
    """A request of `method` with a field nested around protobuf's parse limit and beyond."""
    depth, maps = rng.choice([(31, False), (33, False), (48, False), (49, False), (300, False), (32, True),
                              (33, True), (120, True)])  # fmt: skip
    fields = _field(1, b"deep") + _field(2, _nested(depth, maps))
    if method in ("Write", "WriteMany"):
        return _field(1, space) + _field(2, _field(1, b"fuzz.Thing") + _field(3, fields))
    return _field(1, space) + _field(2, _field(1, b"fuzz.Thing") + _field(2, fields)) + b"\x19" + bytes(8)


_HUGE = (2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**63, 2**64 - 1, 16 * 1024 * 1024)
# The seeds' doubles (leases, timeouts, values), and what to put in their place.
_DOUBLES = tuple(struct.pack("<d", x) for x in (30.0, 0.01, 2.5))
_SPECIAL = tuple(
    struct.pack("<d", x)
    for x in (float("nan"), float("inf"), -float("inf"), 1e308, -1e308, 5e-324, -0.0, 2.0**63)
)
_BAD_UTF8 = (b"\xff", b"\xc0\x80", b"\xed\xa0\x80", b"\xf8\x88\x80\x80\x80", b"\xe2\x82", b"\x80")


def mutate(raw: bytes, rng: random.Random, pool: list[bytes]) -> bytes:
    """One mutation of `raw`, chosen by `rng`; `pool` gives other requests to splice in."""
    choice = rng.randrange(12)
    data = bytearray(raw)
    if choice == 0 and data:  # bit flips
        for _ in range(rng.randint(1, 4)):
            i = rng.randrange(len(data))
            data[i] ^= 1 << rng.randrange(8)
        return bytes(data)
    if choice == 1:  # truncation
        return raw[: rng.randrange(len(raw) + 1)]
    if choice == 2:  # splicing
        other = rng.choice(pool)
        return raw[: rng.randrange(len(raw) + 1)] + other[rng.randrange(len(other) + 1) :]
    if choice == 3:  # a huge length where a length goes
        i = rng.randrange(len(raw) + 1)
        tag = varint((rng.randint(1, 15) << 3) | 2)
        return raw[:i] + tag + varint(rng.choice(_HUGE)) + raw[i : i + rng.randint(0, 16)]
    if choice == 4:  # a length rewritten: every length byte of the first fields
        i = rng.randrange(min(len(raw), 64) + 1)
        return raw[:i] + varint(rng.choice(_HUGE)) + raw[i + 1 :]
    if choice == 5:  # invalid UTF-8 in a string
        return raw.replace(MARK.encode(), rng.choice(_BAD_UTF8), rng.randint(1, 3))
    if choice == 6:  # an overlong varint
        i = rng.randrange(len(raw) + 1)
        return raw[:i] + b"\xff" * rng.randint(10, 64) + raw[i:]
    if choice == 7:  # a group (or a wire type no one has)
        i = rng.randrange(len(raw) + 1)
        number = rng.randint(1, 20)
        kind = rng.choice([(3, 4), (3,), (4,), (6,), (7,)])
        return raw[:i] + b"".join(varint((number << 3) | k) for k in kind) + raw[i:]
    if choice == 8:  # random bytes
        return rng.randbytes(rng.randint(0, 48))
    if choice == 9:  # a field repeated
        i = rng.randrange(len(raw) + 1)
        return raw + raw[i : i + rng.randint(1, 200)]
    if choice == 10:  # a double made huge, tiny, infinite or not a number
        return raw.replace(rng.choice(_DOUBLES), rng.choice(_SPECIAL))
    return mutate(mutate(raw, rng, pool), rng, pool)  # two at once


def requests(rng: random.Random, space: str) -> Iterator[tuple[str, bytes]]:
    """(method, request bytes): every method's seeds, mutated, deep, and a few as they are."""
    by_method = seeds(space)
    pool = [raw for raws in by_method.values() for raw in raws]
    for method, raws in by_method.items():
        for n in range(UNARY_PER_METHOD):
            raw = rng.choice(raws)
            if n < 2:
                yield method, raw
            elif n % 12 == 0:
                yield method, _deep(method, rng, space.encode())
            else:
                yield method, mutate(raw, rng, pool)


def mux_frames(rng: random.Random, space: str) -> Iterator[bytes]:
    """MuxRequests of one to four ops, each a (mutated) request; some frames mutated whole."""
    by_method = seeds(space)
    pool = [raw for raws in by_method.values() for raw in raws]
    methods = list(OP_FIELDS)
    for _ in range(MUX_FRAMES):
        ops = []
        for op_id in range(rng.randint(1, 4)):
            method = rng.choice(methods)
            raw = rng.choice(by_method[method])
            body = mutate(raw, rng, pool) if rng.random() < 0.8 else raw
            field = OP_FIELDS[method] if rng.random() < 0.95 else rng.choice([0, 1, 14, 15, 99])
            ops.append(_field(1, b"\x08" + varint(op_id + 1) + _field(field, body)))
        frame = b"".join(ops)
        yield mutate(frame, rng, pool) if rng.random() < 0.3 else frame


# ---------------------------------------------------------------- sending them


class Outcomes:
    """Every status seen, and the requests whose answer was not allowed."""

    def __init__(self) -> None:
        self.messages = 0
        self.seen: dict[grpc.StatusCode, int] = {}
        self.bad: list[str] = []

    def add(self, what: str, raw: bytes, code: grpc.StatusCode, details: str) -> None:
        self.messages += 1
        self.seen[code] = self.seen.get(code, 0) + 1
        if code not in ALLOWED:
            self.bad.append(f"{what}: {code.name} {details[:200]!r} <- {raw[:120].hex()} ({len(raw)} bytes)")


async def _unary(channel: grpc.aio.Channel, method: str, raw: bytes, outcomes: Outcomes) -> None:
    call: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(f"/outrig.v1.Space/{method}")
    try:
        await call(raw, timeout=DEADLINE)
    except grpc.aio.AioRpcError as err:
        outcomes.add(method, raw, err.code(), err.details() or "")
    else:
        outcomes.add(method, raw, grpc.StatusCode.OK, "")


async def _stream(channel: grpc.aio.Channel, method: str, raw: bytes, outcomes: Outcomes) -> None:
    method_call: grpc.aio.UnaryStreamMultiCallable[bytes, bytes] = channel.unary_stream(
        f"/outrig.v1.Space/{method}"
    )
    call = method_call(raw, timeout=DEADLINE)
    try:
        async for _ in call:
            pass
    except grpc.aio.AioRpcError as err:
        outcomes.add(method, raw, err.code(), err.details() or "")
    else:
        outcomes.add(method, raw, grpc.StatusCode.OK, "")


async def _mux(channel: grpc.aio.Channel, frame: bytes, outcomes: Outcomes) -> None:
    call: grpc.aio.StreamStreamMultiCallable[bytes, pb.MuxReply] = channel.stream_stream(
        "/outrig.v1.Space/Mux", response_deserializer=pb.MuxReply.FromString
    )
    stream = call(iter([frame]), timeout=DEADLINE * 2)
    try:
        async for reply in stream:
            for result in reply.results:
                if result.WhichOneof("result") == "error":
                    code = _BY_NUMBER.get(result.error.code, grpc.StatusCode.UNKNOWN)
                    outcomes.add(f"Mux op {result.id}", frame, code, result.error.message)
                else:
                    outcomes.add(f"Mux op {result.id}", frame, grpc.StatusCode.OK, "")
    except grpc.aio.AioRpcError as err:
        outcomes.add("Mux", frame, err.code(), err.details() or "")
    else:
        outcomes.add("Mux", frame, grpc.StatusCode.OK, "")


async def fuzz(address: str, rng: random.Random) -> Outcomes:
    outcomes = Outcomes()
    gate = asyncio.Semaphore(IN_FLIGHT)
    options = [("grpc.max_send_message_length", 64 << 20), ("grpc.max_receive_message_length", 64 << 20)]

    async def limited(send: Callable[[], Awaitable[None]]) -> None:
        async with gate:
            await send()

    async with grpc.aio.insecure_channel(address, options=options) as channel:
        sends: list[Callable[[], Awaitable[None]]] = []
        for method, raw in requests(rng, "fuzz"):
            send = _stream if method in STREAMING else _unary
            sends.append(functools.partial(send, channel, method, raw, outcomes))
        for frame in mux_frames(rng, "fuzz"):
            sends.append(functools.partial(_mux, channel, frame, outcomes))
        rng.shuffle(sends)
        await asyncio.gather(*(limited(send) for send in sends))
    return outcomes


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def _still_serves(address: str) -> None:
    with grpc.insecure_channel(address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        reply = health.Check(  # type: ignore[attr-defined]  # its stub declares no methods
            health_pb2.HealthCheckRequest(service="outrig.v1.Space"), timeout=5
        )
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
        write: grpc.UnaryUnaryMultiCallable[bytes, pb.WriteReply] = channel.unary_unary(
            "/outrig.v1.Space/Write", response_deserializer=pb.WriteReply.FromString
        )
        take: grpc.UnaryUnaryMultiCallable[bytes, pb.MatchReply] = channel.unary_unary(
            "/outrig.v1.Space/Take", response_deserializer=pb.MatchReply.FromString
        )
        entry = pb.Entry(type_name="after.Fuzz", fields={"n": pb.Value(int_value=1)})
        assert write(pb.WriteRequest(space="after", entry=entry).SerializeToString(), timeout=5).lease.id > 0
        template = pb.Template(type_name="after.Fuzz")
        found = take(
            pb.MatchRequest(space="after", templates=[template], timeout=5.0).SerializeToString(), timeout=10
        )
        assert list(found.entries) == [entry]


@pytest.fixture(params=["memory", "sqlite"])
def fuzzed_server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ServerProcess]:
    args = ("--in-memory",) if request.param == "memory" else ("--data-dir", str(tmp_path / "data"))
    running = start_server(*args)
    yield running
    assert running.stop() == 0, "the server did not shut down cleanly after the fuzzing"


async def test_fuzzed_requests_get_refusals_never_errors(fuzzed_server: ServerProcess) -> None:
    pid = fuzzed_server.process.pid
    before = _rss(pid)
    started = time.perf_counter()
    outcomes = await fuzz(fuzzed_server.address, random.Random(SEED))
    elapsed = time.perf_counter() - started
    seen = {code.name: count for code, count in sorted(outcomes.seen.items(), key=lambda item: -item[1])}
    print(f"seed {SEED}: {outcomes.messages} answers in {elapsed:.1f} s: {seen}")
    assert not outcomes.bad, "\n".join(
        [f"seed {SEED}: {len(outcomes.bad)} answers not allowed", *outcomes.bad[:20]]
    )
    assert outcomes.seen.get(grpc.StatusCode.OK, 0) > 0  # the valid requests among them were served
    assert outcomes.seen[grpc.StatusCode.INVALID_ARGUMENT] > outcomes.messages // 4
    _still_serves(fuzzed_server.address)
    growth = _rss(pid) - before
    assert growth < RSS_GROWTH, f"the server grew by {growth / 2**20:.0f} MiB"
    log = fuzzed_server.log.read_text()
    assert len(log.splitlines()) < 100, log[-5000:]  # a line per method now and then, not one per request
