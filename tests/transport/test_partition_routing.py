"""Where a call of a partitioned space goes, as the SDK decides it (outrig._routing) and as the
server does (service/transport/routing.py `Router`), checked against each other: the SDK names a
partition only where the server would route the call to that very partition, and the server
serves a call naming a partition as named only when its entries route there.

tests/integration/test_partitions.py and tests/conformance/test_partitioned_conformance.py run
the same routing through real servers; here the two deciders meet on many more requests."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from outrig._codec import encode_value
from outrig._routing import ID_STRIDE, request_partition
from outrig.service.config import ServerConfig
from outrig.service.engine import SpaceSettings
from outrig.service.exceptions import InvalidArgumentError, RoutingValueError
from outrig.service.transport import handlers
from outrig.service.transport.routing import FanOut, Router
from outrig.v1 import space_pb2 as pb

P = 4
CONFIG = ServerConfig(spaces={"jobs": SpaceSettings(partition_by="region", partitions=P)})

# Routing values of every kind a field can hold, lists and None among them (no partition's).
values = st.one_of(
    st.none(),
    st.text(max_size=6),
    st.integers(-(2**63), 2**63 - 1),
    st.booleans(),
    st.floats(allow_nan=False),
    st.binary(max_size=6),
    st.lists(st.integers(0, 3), max_size=2),
)
absent = object()


def _fields(region: Any) -> dict[str, pb.Value]:
    fields = {"n": encode_value(1)}
    if region is not absent:
        fields["region"] = encode_value(region)
    return fields


def _entry(region: Any) -> pb.Entry:
    return pb.Entry(type_name="t.Job", fields=_fields(region))


def _template(region: Any, how: str) -> pb.Template:
    template = pb.Template(type_name="t.Job", fields={"n": encode_value(1)})
    if region is absent:
        return template
    if how == "field":
        template.fields["region"].CopyFrom(encode_value(region))
    elif how == "equal":
        template.matchers["region"].equal.CopyFrom(encode_value(region))
    else:
        template.matchers["region"].one_of.values.append(encode_value(region))
    return template


regions = st.one_of(st.just(absent), values)
hows = st.sampled_from(["field", "equal", "one_of"])
calls = st.one_of(
    st.tuples(st.just("Write"), regions).map(lambda c: (c[0], pb.WriteRequest(entry=_entry(c[1])))),
    st.tuples(st.just("WriteMany"), st.lists(regions, min_size=1, max_size=3)).map(
        lambda c: (c[0], pb.WriteManyRequest(entries=[_entry(r) for r in c[1]]))
    ),
    st.tuples(
        st.sampled_from(["Take", "Read", "TakeMany", "ReadMany", "Count"]),
        st.lists(st.tuples(regions, hows), min_size=1, max_size=3),
    ).map(
        lambda c: (
            c[0],
            (pb.CountRequest if c[0] == "Count" else pb.MatchRequest)(
                templates=[_template(r, how) for r, how in c[1]]
            ),
        )
    ),
)


def _received(request: Any) -> Any:
    """A request as the server holds it: a write as its `handlers.Received`."""
    if isinstance(request, pb.WriteRequest | pb.WriteManyRequest):
        received = handlers.receiving(type(request))(request.SerializeToString())
        assert isinstance(received, handlers.Received)
        return received
    return request


def _named(request: Any) -> str:
    return str((request.message if isinstance(request, handlers.Received) else request).space)


@settings(max_examples=400, deadline=None)
@given(call=calls)
def test_the_sdk_names_a_partition_only_where_the_server_routes_the_call(call: tuple[str, Any]) -> None:
    name, request = call
    request.space = "jobs"
    k = request_partition(request, "region", P)
    router = Router(CONFIG)
    held = _received(request)
    try:
        fan = router.route(name, held)
    except (InvalidArgumentError, RoutingValueError):
        assert k is None or name == "WriteMany"  # the SDK sends it home, which refuses it
        return
    if k is None:
        return  # the server routes it, or fans it out
    assert fan is None and _named(held) == f"jobs~{k}"
    # Sent as the SDK sends it, naming the partition, the call is served as named...
    request.space = f"jobs~{k}"
    for _ in range(2):  # ...the second time as the first (the name is known by then)
        assert router.route(name, _received(request)) is None
    # ...and a write that names another partition is refused, naming the entry.
    if name == "Write":
        request.space = f"jobs~{(k + 1) % P}"
        with pytest.raises(InvalidArgumentError, match=r"^entry: routes to another partition"):
            router.route(name, _received(request))


def test_a_call_under_a_transaction_goes_to_the_transactions_partition() -> None:
    router = Router(CONFIG)
    for k in range(P):
        transaction = 5 * ID_STRIDE + k
        request = pb.MatchRequest(
            space="jobs", templates=[_template(absent, "field")], transaction=transaction
        )
        assert request_partition(request, "region", P) == k
        assert router.route("Take", request) is None and request.space == f"jobs~{k}"


def test_a_write_naming_a_partition_is_checked_every_time() -> None:
    router = Router(CONFIG)
    entry = _entry("eu")
    k = request_partition(pb.WriteRequest(entry=entry), "region", P)
    assert k is not None
    right, wrong = f"jobs~{k}", f"jobs~{(k + 1) % P}"
    for _ in range(2):
        assert router.route("Write", _received(pb.WriteRequest(space=right, entry=entry))) is None
        with pytest.raises(
            InvalidArgumentError, match=rf"entry: routes to another partition of 'jobs' than {(k + 1) % P}"
        ):
            router.route("Write", _received(pb.WriteRequest(space=wrong, entry=entry)))
    elsewhere = next(
        _entry(r)
        for r in (f"r{i}" for i in range(100))
        if request_partition(pb.WriteRequest(entry=_entry(r)), "region", P) != k
    )
    many = pb.WriteManyRequest(space=right, entries=[entry, elsewhere, entry])
    with pytest.raises(InvalidArgumentError, match=r"^entries\[1\]: routes to another partition"):
        router.route("WriteMany", _received(many))
    for request, where in (
        (pb.WriteRequest(space=right, entry=_entry(absent)), r"entry\.fields\['region'\]"),
        (pb.WriteRequest(space=right, entry=_entry(None)), r"entry\.fields\['region'\]"),
        (pb.WriteManyRequest(space=right, entries=[entry, _entry(["a"])]), r"entries\[1\]\.fields"),
    ):
        with pytest.raises(RoutingValueError, match=where):
            router.route(type(request).__name__.removesuffix("Request"), _received(request))


def test_a_name_that_is_no_partition_of_the_space_is_refused_or_left_to_the_name_check() -> None:
    router = Router(CONFIG)
    for _ in range(2):
        with pytest.raises(InvalidArgumentError, match=f"names partition {P} of 'jobs', which has {P}"):
            router.route("Count", pb.CountRequest(space=f"jobs~{P}"))
        with pytest.raises(
            InvalidArgumentError, match="names partition 1 of 'other', which is not partitioned"
        ):
            router.route("Count", pb.CountRequest(space="other~1"))
    # "jobs~01" is partition 1 to the router, and no space name to the name check, which refuses
    # it (codec.space_name); the router keeps no such spelling.
    assert router.route("Count", pb.CountRequest(space="jobs~01")) is None
    assert router.route("Count", pb.CountRequest(space="jobs~x")) is None
    assert set(router._named) <= {f"jobs~{k}" for k in range(P)}


def test_a_call_of_the_whole_space_still_fans_out() -> None:
    router = Router(CONFIG)
    fan = router.route("Count", pb.CountRequest(space="jobs", templates=[_template(absent, "field")]))
    assert isinstance(fan, FanOut) and fan.partitions == tuple(range(P))


@settings(max_examples=200, deadline=None)
@given(call=calls)
def test_a_server_with_no_space_configured_routes_no_call(call: tuple[str, Any]) -> None:
    """`Router.partitioned` false (no `[spaces.NAME]`), which lets the servicer skip `route`: then
    `route` serves every call as it names its space, partitions' names included, and renames none."""
    name, request = call
    assert Router(CONFIG).partitioned
    router = Router(ServerConfig())
    assert not router.partitioned
    for space in ("jobs", "jobs~1", "other"):
        request.space = space
        held = _received(request)
        assert router.route(name, held) is None
        assert _named(held) == space
