"""Redirecting one imported function of a loaded shared object: the slots are found from the
file's relocations, and nothing is written when the slot does not hold what is expected."""

from __future__ import annotations

import ctypes
import os
import sys
from pathlib import Path

import pytest

from outrig.service import process
from outrig.service.exceptions import ProcessTuningError

LINUX_GLIBC = sys.platform == "linux" and os.confstr("CS_GNU_LIBC_VERSION") is not None


def _upb_module() -> str:
    from google._upb import _message

    return str(_message.__file__)


@pytest.mark.skipif(not LINUX_GLIBC, reason="ELF and glibc")
def test_finds_the_slot_of_an_import() -> None:
    offsets = process.slot_offsets(_upb_module(), "malloc_trim")
    assert len(offsets) == 1
    assert process.slot_offsets(_upb_module(), "no_such_function") == []


@pytest.mark.skipif(not LINUX_GLIBC, reason="ELF and glibc")
def test_the_slot_holds_the_functions_address() -> None:
    libc = ctypes.CDLL(None)
    (offset,) = process.slot_offsets(_upb_module(), "malloc")
    held = ctypes.c_void_p.from_address(process._load_address(_upb_module()) + offset).value
    assert held == ctypes.cast(libc.malloc, ctypes.c_void_p).value


@pytest.mark.skipif(not LINUX_GLIBC, reason="ELF and glibc")
def test_nothing_is_written_when_the_slot_holds_something_else() -> None:
    abs_address = ctypes.cast(ctypes.CDLL(None).abs, ctypes.c_void_p).value or 1
    (offset,) = process.slot_offsets(_upb_module(), "malloc_trim")
    slot = process._load_address(_upb_module()) + offset
    held = ctypes.c_void_p.from_address(slot).value
    with pytest.raises(ProcessTuningError, match="holds"):
        process.redirect(_upb_module(), "malloc_trim", 1, abs_address)
    assert ctypes.c_void_p.from_address(slot).value == held


def test_refuses_what_is_not_an_elf_file(tmp_path: Path) -> None:
    text = tmp_path / "not-elf.so"
    text.write_bytes(b"#!/bin/sh\n" * 10)
    with pytest.raises(ProcessTuningError, match="not a 64-bit"):
        process.slot_offsets(str(text), "malloc_trim")


@pytest.mark.skipif(not LINUX_GLIBC, reason="ELF and glibc")
def test_an_object_that_does_not_import_the_name() -> None:
    with pytest.raises(ProcessTuningError, match="does not import"):
        process.redirect(_upb_module(), "no_such_function", 1, 2)
