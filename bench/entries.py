"""The entries the end-to-end benchmarks write and read, shared by the clients and the no-op server.

The no-op server answers with canned copies of these (`canned_small`, `canned_batch`,
`canned_frame`), so that its replies carry the same bytes as outrig's: bench/run.py prints the
reply sizes of both servers side by side to show it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

import outrig
from outrig._codec import encode_entry
from outrig.v1 import space_pb2 as pb

#: The space every workload but notify uses (notify has its own, so that its writes stay apart).
SPACE = "bench"
NOTIFY_SPACE = "bench-notify"
#: The "HD array" of the Eclipse Milo benchmarks: 921,600 int32 values, 3.6 MB.
HD_LENGTH = 921_600
#: Entries preloaded for the scalar reads, with keys READ_KEY_BASE .. READ_KEY_BASE + READ_ENTRIES - 1:
#: every key then encodes to the same number of bytes, so every reply has the same size.
READ_ENTRIES = 1000
READ_KEY_BASE = 1000
#: Entries per read_many, write_many and take_many.
BATCH = 100
NOTE = "x" * 32


@dataclass
class Small(outrig.Entry, type_name="bench.Small"):
    """A small entry: four fields, about 70 bytes encoded."""

    key: int | None = None
    client: int | None = None
    group: str | None = None
    note: str | None = None


@dataclass
class Frame(outrig.Entry, type_name="bench.Frame"):
    """An entry carrying an HD array (numpy int32, HD_LENGTH values)."""

    tag: str | None = None
    client: int | None = None
    pixels: np.ndarray[Any, Any] | None = None


def hd_pixels() -> np.ndarray[Any, Any]:
    return np.arange(HD_LENGTH, dtype=np.int32)


def read_entries() -> list[Small]:
    """What outrig holds for the scalar reads and read_many (group "read")."""
    return [Small(key=READ_KEY_BASE + i, group="read", note=NOTE) for i in range(READ_ENTRIES)]


def hd_entry() -> Frame:
    """What outrig holds for the HD array reads."""
    return Frame(tag="hd", client=0, pixels=hd_pixels())


def canned_small() -> pb.Entry:
    return encode_entry(read_entries()[0])


def canned_batch(count: int) -> list[pb.Entry]:
    return [encode_entry(entry) for entry in read_entries()[:count]]


def canned_frame() -> pb.Entry:
    return encode_entry(hd_entry())
