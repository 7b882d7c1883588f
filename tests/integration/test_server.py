"""The server as a gRPC peer sees it, through raw stubs: health, reflection, limits, bad input."""

from __future__ import annotations

import signal

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from outrig.v1 import space_pb2 as pb
from outrig.v1 import space_pb2_grpc


@pytest.fixture
def stub(server):
    with grpc.insecure_channel(
        server.address, options=[("grpc.max_send_message_length", 64 << 20)]
    ) as channel:
        yield space_pb2_grpc.SpaceStub(channel)


def _entry(**fields: pb.Value) -> pb.Entry:
    return pb.Entry(type_name="test.Thing", fields=fields)


def _status(call, *args, **kwargs) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as info:
        call(*args, **kwargs)
    return info.value.code(), info.value.details() or ""


def test_health_reports_serving(server):
    with grpc.insecure_channel(server.address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for service in ("", "outrig.v1.Space"):
            reply = health.Check(  # type: ignore[attr-defined]  # its stub declares no methods
                health_pb2.HealthCheckRequest(service=service), timeout=5
            )
            assert reply.status == health_pb2.HealthCheckResponse.SERVING


def test_reflection_lists_the_space_service(server):
    with grpc.insecure_channel(server.address) as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        # types-grpcio-reflection types the method as binascii's Incomplete (meaning typeshed's)
        replies = stub.ServerReflectionInfo(  # type: ignore[operator]
            iter([reflection_pb2.ServerReflectionRequest(list_services="")])
        )
        names = {service.name for reply in replies for service in reply.list_services_response.service}
    assert {"outrig.v1.Space", "grpc.health.v1.Health"} <= names


@pytest.mark.parametrize(
    ("request_", "code", "needle"),
    [
        (pb.WriteRequest(space="", entry=_entry()), grpc.StatusCode.INVALID_ARGUMENT, "space"),
        (pb.WriteRequest(space="a b", entry=_entry()), grpc.StatusCode.INVALID_ARGUMENT, "space"),
        (pb.WriteRequest(space="s"), grpc.StatusCode.INVALID_ARGUMENT, "entry"),
        (pb.WriteRequest(space="s", entry=pb.Entry()), grpc.StatusCode.INVALID_ARGUMENT, "entry.type_name"),
        (
            pb.WriteRequest(space="s", entry=_entry(x=pb.Value())),
            grpc.StatusCode.INVALID_ARGUMENT,
            "entry.fields['x']",
        ),
        (
            pb.WriteRequest(space="s", entry=_entry(), lease=pb.LeaseDuration(seconds=-1)),
            grpc.StatusCode.INVALID_ARGUMENT,
            "lease.seconds",
        ),
        (
            pb.WriteRequest(space="s", entry=_entry(), lease=pb.LeaseDuration(seconds=float("nan"))),
            grpc.StatusCode.INVALID_ARGUMENT,
            "lease.seconds",
        ),
        (
            pb.WriteRequest(
                space="s",
                entry=_entry(a=pb.Value(array_value=pb.TypedArray(dtype=pb.DTYPE_INT32, data=b"abc"))),
            ),
            grpc.StatusCode.INVALID_ARGUMENT,
            "array_value.data",
        ),
    ],
)
def test_bad_writes_name_the_field(stub, request_, code, needle):
    status, details = _status(stub.Write, request_, timeout=5)
    assert status == code
    assert needle in details


def test_bad_match_requests_name_the_field(stub, space_name):
    template = pb.Template(type_name="test.Thing")
    cases = [
        (pb.MatchRequest(space=space_name), "templates"),
        (pb.MatchRequest(space=space_name, templates=[template], timeout=-1), "timeout"),
        (pb.MatchRequest(space=space_name, templates=[template], timeout=float("inf")), "timeout"),
        (pb.MatchRequest(space=space_name, templates=[pb.Template()]), "templates[0].type_name"),
    ]
    for request, needle in cases:
        status, details = _status(stub.Read, request, timeout=5)
        assert status == grpc.StatusCode.INVALID_ARGUMENT
        assert needle in details
    status, details = _status(
        stub.TakeMany, pb.MatchRequest(space=space_name, templates=[template]), timeout=5
    )
    assert (status, "max_entries" in details) == (grpc.StatusCode.INVALID_ARGUMENT, True)


def test_nesting_and_field_limits(stub, space_name):
    value = pb.Value(int_value=1)
    for _ in range(40):
        value = pb.Value(list_value=pb.ListValue(items=[value]))
    status, details = _status(
        stub.Write, pb.WriteRequest(space=space_name, entry=_entry(deep=value)), timeout=5
    )
    assert status == grpc.StatusCode.INVALID_ARGUMENT
    assert "max_depth" in details
    many = {f"f{i}": pb.Value(int_value=i) for i in range(300)}
    status, details = _status(stub.Write, pb.WriteRequest(space=space_name, entry=_entry(**many)), timeout=5)
    assert status == grpc.StatusCode.INVALID_ARGUMENT
    assert "max_fields" in details


def test_oversized_message_is_resource_exhausted_and_server_keeps_serving(stub, space_name):
    big = pb.Value(bytes_value=b"x" * (17 << 20))  # over the default 16 MiB limit
    status, _ = _status(stub.Write, pb.WriteRequest(space=space_name, entry=_entry(big=big)), timeout=10)
    assert status == grpc.StatusCode.RESOURCE_EXHAUSTED
    reply = stub.Write(pb.WriteRequest(space=space_name, entry=_entry(n=pb.Value(int_value=1))), timeout=5)
    assert reply.lease.id > 0


def test_hd_array_fits_the_default_message_limit(stub, space_name):
    data = bytes(range(256)) * (921_600 * 4 // 256)
    array = pb.Value(array_value=pb.TypedArray(dtype=pb.DTYPE_INT32, data=data))
    stub.Write(pb.WriteRequest(space=space_name, entry=_entry(hd=array)), timeout=10)
    template = pb.Template(type_name="test.Thing", fields={"hd": array})
    reply = stub.Take(pb.MatchRequest(space=space_name, templates=[template], timeout=0), timeout=10)
    assert reply.entries[0].fields["hd"].array_value.data == data


def test_space_quota_answers_resource_exhausted(server_factory, tmp_path):
    config = tmp_path / "outrig.toml"
    config.write_text("[space_defaults]\nmax_entries = 2\n\n[spaces.big]\nmax_entries = 5\n")
    running = server_factory("--config", str(config))
    with grpc.insecure_channel(running.address) as channel:
        stub = space_pb2_grpc.SpaceStub(channel)
        for _ in range(2):
            stub.Write(pb.WriteRequest(space="small", entry=_entry()), timeout=5)
        status, details = _status(stub.Write, pb.WriteRequest(space="small", entry=_entry()), timeout=5)
        assert status == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "max_entries=2" in details
        request = pb.WriteManyRequest(space="big", entries=[_entry() for _ in range(6)])
        status, details = _status(stub.WriteMany, request, timeout=5)
        assert (status, "max_entries=5" in details) == (grpc.StatusCode.RESOURCE_EXHAUSTED, True)
        count = stub.Count(pb.CountRequest(space="big", templates=[pb.Template(type_name="test.Thing")]))
        assert count.count == 0  # all or nothing


def test_message_limit_is_configurable_from_the_environment(server_factory):
    running = server_factory(env={"OUTRIG_MAX_MESSAGE_BYTES": "1024"})
    with grpc.insecure_channel(running.address) as channel:
        stub = space_pb2_grpc.SpaceStub(channel)
        big = _entry(b=pb.Value(bytes_value=b"x" * 2048))
        status, _ = _status(stub.Write, pb.WriteRequest(space="s", entry=big), timeout=5)
        assert status == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_sigint_shuts_down_cleanly(server_factory):
    running = server_factory()
    assert running.stop(signal.SIGINT) == 0


def test_bad_config_exits_2_with_a_message(tmp_path):
    import subprocess
    import sys

    config = tmp_path / "bad.toml"
    config.write_text("[space_defaults]\nnot_a_setting = 1\n")
    done = subprocess.run(
        [sys.executable, "-m", "outrig.service", "serve", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 2
    assert "not_a_setting" in done.stderr


def test_sigterm_ends_blocked_takes_and_notify_streams_cleanly(server_factory):
    import threading
    import time

    import outrig

    from .entries import Task

    running = server_factory("--grace-seconds", "10")
    # No SDK retries: the take must show the server's own answer, not a retry's "connection refused".
    with (
        outrig.connect(running.address, space="s", retry_deadline=0) as space,
        space.notify(Task()) as events,
    ):
        threading.Timer(0.5, running.process.send_signal, [signal.SIGTERM]).start()
        started = time.monotonic()
        with pytest.raises(outrig.UnavailableError, match="shutting down"):
            space.take(Task(), timeout=60.0)
        assert time.monotonic() - started < 5.0  # at once, not after the 10 s grace
        assert list(events) == []  # the notify stream ended with OK
    assert running.process.wait(15) == 0


def test_an_entry_field_sent_twice_is_stored_as_merged(server, stub, space_name):
    """The server keeps entries as the bytes they arrived in; when a client sends the entry field
    twice (protobuf merges the two), it must keep the merged entry, not one of the halves."""
    first = pb.WriteRequest(space=space_name, entry=_entry(a=pb.Value(int_value=1)))
    second = pb.WriteRequest(entry=pb.Entry(fields={"b": pb.Value(int_value=2)}))
    with grpc.insecure_channel(server.address) as channel:
        write_raw = channel.unary_unary(
            "/outrig.v1.Space/Write",
            request_serializer=lambda raw: raw,
            response_deserializer=pb.WriteReply.FromString,
        )
        write_raw(first.SerializeToString() + second.SerializeToString(), timeout=10)
    template = pb.Template(type_name=first.entry.type_name, fields={"b": pb.Value(int_value=2)})
    reply = stub.Read(pb.MatchRequest(space=space_name, templates=[template], timeout=0), timeout=10)
    assert dict(reply.entries[0].fields) == {"a": pb.Value(int_value=1), "b": pb.Value(int_value=2)}
