"""The change log's protocol (service/protocol/changes.py), without a server: cursors round-trip
and every malformed, foreign or mis-sized one is refused naming its field; a reply re-cursored by
the fan-out decodes to the new cursor; a partitioned space's figures merge."""

from __future__ import annotations

import base64

import pytest
from hypothesis import given
from hypothesis import strategies as st

from outrig.service.engine.inspection import ChangeLogView
from outrig.service.exceptions import InvalidArgumentError
from outrig.service.protocol import changes
from outrig.v1 import space_pb2 as pb

positions = st.tuples(st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1))


@given(st.lists(positions, min_size=1, max_size=16))
def test_a_cursor_round_trips_and_is_url_safe(found: list[tuple[int, int]]) -> None:
    names = ["s"] if len(found) == 1 else [f"s~{k}" for k in range(len(found))]
    cursor = changes.encode_cursor(names, found)
    assert set(cursor) <= set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")
    assert changes.decode_cursor(cursor, names) == found


@given(st.binary(max_size=64))
def test_any_bytes_are_a_cursor_or_refused_naming_the_field(data: bytes) -> None:
    text = base64.urlsafe_b64encode(data).rstrip(b"=").decode()
    try:
        changes.decode_cursor(text, ["s"], "cursor")
    except InvalidArgumentError as err:
        refused = str(err)
    else:
        refused = "cursor: "
    assert refused.startswith("cursor: ")


@pytest.mark.parametrize(
    ("text", "names", "message"),
    [
        ("", ["s"], "since: empty"),
        ("@@@", ["s"], "is no cursor"),
        ("QQ=", ["s"], "is no cursor"),  # padding is not part of a cursor
        ("x" * (changes.MAX_CURSOR + 1), ["s"], "at most"),
        (changes.encode_cursor(["t"], [(1, 2)]), ["s"], "another space"),
        (changes.encode_cursor(["s~0", "s~1"], [(1, 2), (1, 3)]), ["s"], "2 positions, not of a space"),
        (changes.encode_cursor(["s~0"], [(1, 2)]), ["s~0", "s~1"], "not of 2 partitions"),
        (changes.encode_cursor(["s~1", "s~0"], [(1, 2), (1, 3)]), ["s~0", "s~1"], "partition 0"),
    ],
)
def test_bad_cursors_are_refused(text: str, names: list[str], message: str) -> None:
    with pytest.raises(InvalidArgumentError, match=message):
        changes.decode_cursor(text, names)


def test_kinds_and_names_are_checked() -> None:
    assert changes.kinds(pb.ChangesRequest()) == changes.ALL_KINDS
    assert changes.kinds(pb.ChangesRequest(kinds=[pb.CHANGE_KIND_TAKE])) == {"take"}
    with pytest.raises(InvalidArgumentError, match=r"kinds\[0\]: 0 is no ChangeKind"):
        changes.kinds(pb.ChangesRequest(kinds=[0]))  # type: ignore[list-item]
    assert changes.durable_name("") == ""
    with pytest.raises(InvalidArgumentError, match="durable: is required"):
        changes.durable_name("", required=True)
    with pytest.raises(InvalidArgumentError, match="no subscription name"):
        changes.durable_name("-starts-badly")


def test_a_reply_takes_the_merged_cursor_appended() -> None:
    reply = changes.progress_reply("first")
    cursor, change = changes.reply_parts(reply)
    assert (cursor, change) == ("first", False)
    merged = changes.with_cursor(reply, "merged")
    assert pb.ChangesReply.FromString(merged).cursor == "merged"
    assert changes.reply_parts(merged) == ("merged", False)


def test_a_partitioned_spaces_figures_are_its_partitions_together() -> None:
    names = ["s~0", "s~1"]
    parts = [
        changes.change_log_figures(names[0], ChangeLogView(7, 10, 3, 8, 800, {"a": 9, "b": 4})),
        changes.change_log_figures(names[1], ChangeLogView(8, 5, 1, 5, 500, {"a": 2})),
    ]
    merged = changes.merged_figures(names, parts)
    assert (merged.head, merged.count, merged.bytes) == (15, 13, 1300)
    assert changes.decode_cursor(merged.head_cursor, names) == [(7, 10), (8, 5)]
    assert changes.decode_cursor(merged.oldest_cursor, names) == [(7, 2), (8, 0)]
    by_name = {info.name: info for info in merged.subscriptions}
    assert by_name["a"].position == 11
    assert changes.decode_cursor(by_name["a"].cursor, names) == [(7, 9), (8, 2)]
    assert by_name["b"].cursor == ""  # partition 1 has no "b": no cursor of every partition
