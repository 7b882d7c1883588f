"""The protocol of a space's change log (docs/notifications.md): cursors, a Changes request's
checks, and the replies of a Changes stream.

A cursor is an opaque string to its users: the url-safe base64, without padding, of an
`outrig.v1.ChangeCursor`, one `ChangePosition` (the CRC-32 of the space's or partition's name,
the log's epoch, the sequence number read through) per partition, in partition order; one for a
space that is not partitioned. Every refusal names its field (`since`, `cursor`, `kinds[2]`,
`durable`) and is an InvalidArgumentError; a cursor of another epoch is not refused here (the
backend answers it as compacted: its log is gone).

A stream's replies are built as bytes: a change's entry is its stored payload as it is
(`ChangesReply.entry` is field 1, a payload's frame), followed by the other fields; a partition's
reply takes the merged cursor by one more `cursor` field appended (`with_cursor`: protobuf keeps
the last value of a singular field), so that a fan-out re-encodes nothing.
"""

from __future__ import annotations

import base64
import binascii
import zlib
from collections.abc import Sequence

from google.protobuf.message import DecodeError

from outrig._protocol import CHANGE_KIND_NUMBERS, tag, varint
from outrig.service.config import SPACE_NAME
from outrig.service.engine.changes import CHANGE_KINDS, Change
from outrig.service.engine.inspection import ChangeLogView
from outrig.service.exceptions import CompactedError, InvalidArgumentError, excerpt
from outrig.service.protocol import wire
from outrig.v1 import space_pb2 as pb

#: The kinds of change, as the engine names them and as the wire numbers them.
KIND_NUMBERS: dict[str, int] = CHANGE_KIND_NUMBERS
KIND_NAMES: dict[int, str] = {number: name for name, number in KIND_NUMBERS.items()}
if set(KIND_NUMBERS) != set(CHANGE_KINDS):
    raise AssertionError("the wire's ChangeKind and the engine's CHANGE_KINDS differ")
ALL_KINDS = frozenset(CHANGE_KINDS)

#: The longest cursor accepted, in characters: 1,024 partitions' positions (at most 28 bytes
#: each, as base64) fit in it with room to spare.
MAX_CURSOR = 48 * 1024
#: The longest durable subscription name.
MAX_SUBSCRIPTION_NAME = 128

#: One position: a space's or partition's (CRC-32 of its name, epoch, seq read through).
Position = tuple[int, int]

_CURSOR = tag(pb.ChangesReply.DESCRIPTOR.fields_by_name["cursor"])
_CURSOR_NUMBER = pb.ChangesReply.DESCRIPTOR.fields_by_name["cursor"].number
_KIND_NUMBER = pb.ChangesReply.DESCRIPTOR.fields_by_name["kind"].number


def name_key(name: str) -> int:
    """The `ChangePosition.space` of a space's or partition's log: the CRC-32 of its name."""
    return zlib.crc32(name.encode())


def encode_cursor(names: Sequence[str], positions: Sequence[Position]) -> str:
    """The cursor of these logs (`names`, in partition order) at these (epoch, seq) positions."""
    cursor = pb.ChangeCursor()
    for name, (epoch, seq) in zip(names, positions, strict=True):
        cursor.positions.add(space=name_key(name), epoch=epoch, seq=seq)
    return base64.urlsafe_b64encode(cursor.SerializeToString()).rstrip(b"=").decode()


def decode_cursor(text: str, names: Sequence[str], field: str = "since") -> list[Position]:
    """The (epoch, seq) positions a cursor holds for the logs `names` (in partition order).
    InvalidArgumentError naming `field` if it is malformed, of another space, or of another
    number of partitions."""
    if not text:
        raise InvalidArgumentError(f"{field}: empty, which is no cursor")
    if len(text) > MAX_CURSOR:
        raise InvalidArgumentError(f"{field}: a cursor of {len(text)} characters (at most {MAX_CURSOR})")
    try:
        data = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
        if base64.urlsafe_b64encode(data).rstrip(b"=").decode() != text.rstrip("="):
            raise ValueError("not url-safe base64")
        cursor = pb.ChangeCursor.FromString(data)
    except (binascii.Error, ValueError, DecodeError) as err:
        raise InvalidArgumentError(f"{field}: {excerpt(text)} is no cursor ({err})") from None
    if len(cursor.positions) != len(names):
        what = "a space" if len(names) == 1 else f"{len(names)} partitions"
        raise InvalidArgumentError(
            f"{field}: a cursor of {len(cursor.positions)} positions, not of {what} "
            f"({names[0].partition('~')[0]!r}'s cursors hold {len(names)})"
        )
    found = []
    for i, (name, position) in enumerate(zip(names, cursor.positions, strict=True)):
        if position.space != name_key(name):
            which = "space" if len(names) == 1 else f"partition {i}"
            raise InvalidArgumentError(f"{field}: a cursor of another space (its {which} is not {name!r}'s)")
        found.append((position.epoch, position.seq))
    return found


def since(request: pb.ChangesRequest, names: Sequence[str]) -> list[Position] | None:
    """The request's `since`, decoded for the logs `names`; None: from the head."""
    if not request.HasField("since"):
        return None
    return decode_cursor(request.since, names, "since")


def kinds(request: pb.ChangesRequest) -> frozenset[str]:
    """The kinds of change asked for (none: every kind)."""
    if not request.kinds:
        return ALL_KINDS
    wanted = set()
    for i, number in enumerate(request.kinds):
        name = KIND_NAMES.get(number)
        if name is None:
            raise InvalidArgumentError(
                f"kinds[{i}]: {number} is no ChangeKind (CHANGE_KIND_WRITE=1 ... CHANGE_KIND_DEAD=6)"
            )
        wanted.add(name)
    return frozenset(wanted)


def durable_name(name: str, field: str = "durable", *, required: bool = False) -> str:
    """A durable subscription's name, checked: like a space name, at most 128 characters; ""
    (none) unless `required`."""
    if not name:
        if required:
            raise InvalidArgumentError(f"{field}: is required (a durable subscription's name)")
        return ""
    if len(name) > MAX_SUBSCRIPTION_NAME or not SPACE_NAME.fullmatch(name):
        raise InvalidArgumentError(
            f"{field}: {excerpt(name)} is no subscription name (letters, digits, . _ -, starting "
            f"with a letter or digit, at most {MAX_SUBSCRIPTION_NAME} characters)"
        )
    return name


def start_reply(cursor: str, oldest: str) -> bytes:
    """A stream's first message: where it starts, and the oldest cursor the log holds."""
    return pb.ChangesReply(cursor=cursor, oldest=oldest).SerializeToString()


def change_reply(change: Change, cursor: str) -> bytes:
    """A message carrying one change and the cursor after it."""
    rest = pb.ChangesReply(
        cursor=cursor,
        kind=KIND_NUMBERS[change.kind],  # type: ignore[arg-type]  # a ChangeKind's number
        at=change.at,
        transaction=change.transaction,
        seq=change.seq,
    )
    if change.visible_at is not None:
        rest.visible_at = change.visible_at
    payload = change.entry.payload
    assert isinstance(payload, bytes)  # the servicer's stored payloads are bytes (engine/model.py)
    return payload + rest.SerializeToString()


def progress_reply(cursor: str) -> bytes:
    """A message with a cursor and no change: the stream read past changes that did not match."""
    return pb.ChangesReply(cursor=cursor).SerializeToString()


def reply_parts(reply: bytes) -> tuple[str, bool]:
    """An encoded ChangesReply's cursor (the last one it holds), and whether it carries a change."""
    cursor = ""
    change = False
    for number, value in wire.fields(memoryview(reply)):
        if number == _CURSOR_NUMBER and isinstance(value, memoryview):
            cursor = bytes(value).decode()
        elif number == _KIND_NUMBER and value:
            change = True
    return cursor, change


def with_cursor(reply: bytes, cursor: str) -> bytes:
    """The reply with `cursor` in place of its own (appended: the last value of a field wins)."""
    data = cursor.encode()
    return b"".join((reply, _CURSOR, varint(len(data)), data))


class CompactedCursorError(CompactedError):
    """A `CompactedError` with the oldest cursor still readable encoded (the ErrorInfo's
    "oldest"): the transport knows the logs' names a cursor is made of, the backend does not."""

    def __init__(self, err: CompactedError, cursor: str) -> None:
        super().__init__(str(err), epoch=err.epoch, oldest=err.oldest)
        self.cursor = cursor


def change_log_figures(space: str, view: ChangeLogView) -> pb.ChangeLogFigures:
    """DescribeSpace's figures of a space's (or a partition's) change log, with its cursors."""
    names = (space,)
    figures = pb.ChangeLogFigures(
        epoch=view.epoch,
        head=view.head,
        oldest=view.oldest,
        count=view.count,
        bytes=view.bytes,
        head_cursor=encode_cursor(names, [(view.epoch, view.head)]),
        oldest_cursor=encode_cursor(names, [(view.epoch, view.oldest - 1)]),
    )
    for name, position in sorted(view.subscriptions.items()):
        figures.subscriptions.add(
            name=name, position=position, cursor=encode_cursor(names, [(view.epoch, position)])
        )
    return figures


def merged_figures(names: Sequence[str], parts: Sequence[pb.ChangeLogFigures]) -> pb.ChangeLogFigures:
    """A partitioned space's change log figures from its partitions' (`names`, in order): sums,
    and cursors of every partition's positions (a subscription some partition lacks: no cursor)."""

    def position(cursor: str, name: str) -> Position:
        ((epoch, seq),) = decode_cursor(cursor, (name,), "cursor")
        return epoch, seq

    merged = pb.ChangeLogFigures(
        head=sum(p.head for p in parts),
        oldest=sum(p.oldest for p in parts),
        count=sum(p.count for p in parts),
        bytes=sum(p.bytes for p in parts),
        head_cursor=encode_cursor(
            names, [position(p.head_cursor, n) for n, p in zip(names, parts, strict=True)]
        ),
        oldest_cursor=encode_cursor(
            names, [position(p.oldest_cursor, n) for n, p in zip(names, parts, strict=True)]
        ),
    )
    found: dict[str, dict[int, pb.SubscriptionInfo]] = {}
    for k, part in enumerate(parts):
        for info in part.subscriptions:
            found.setdefault(info.name, {})[k] = info
    for name, infos in sorted(found.items()):
        cursor = ""
        if len(infos) == len(parts):
            cursor = encode_cursor(names, [position(infos[k].cursor, n) for k, n in enumerate(names)])
        merged.subscriptions.add(name=name, position=sum(i.position for i in infos.values()), cursor=cursor)
    return merged
