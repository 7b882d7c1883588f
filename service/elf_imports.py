"""Redirect a function that a loaded shared object imports from another library (ELF, 64-bit
little-endian: x86-64 and AArch64 Linux).

A shared object calls an imported function, such as libc's `malloc_trim`, through a slot of its
global offset table that the dynamic linker fills with the function's address when the object is
loaded (CPython loads extension modules with RTLD_NOW, so every slot is filled by then).
`redirect` finds the slot from the object's relocations on disk and its load address, checks that
the slot holds the address it expects, and writes another function's address there. It touches
that one slot of that one object: every other caller of the function is unaffected.

It changes nothing, and says why, when anything is not as expected: another file format, no
relocation for the name, a slot holding something else (another library interposed, a lazy
binding not yet resolved).
"""

from __future__ import annotations

import ctypes
import mmap
import os
import struct
from dataclasses import dataclass

from .exceptions import ProcessTuningError

_ELF_MAGIC = b"\x7fELF"
_ELFCLASS64 = 2
_ELFDATA2LSB = 1
_SHT_RELA = 4
_SECTION = struct.Struct("<IIQQQQIIQQ")  # Elf64_Shdr
_RELA = struct.Struct("<QQq")  # Elf64_Rela
_SYMBOL = struct.Struct("<IBBHQQ")  # Elf64_Sym
#: The relocation types that fill a slot with a symbol's address: x86-64 GLOB_DAT and JUMP_SLOT,
#: AArch64 GLOB_DAT and JUMP_SLOT.
_SLOT_TYPES = {("x86_64", 6), ("x86_64", 7), ("aarch64", 1025), ("aarch64", 1026)}
_RTLD_DI_LINKMAP = 2
_PROT_READ, _PROT_WRITE, _PROT_EXEC = 1, 2, 4


@dataclass(frozen=True)
class _Section:
    type: int
    offset: int
    size: int
    link: int


def slot_offsets(path: str, name: str) -> list[int]:
    """The offsets (from the object's load address) of the slots through which the shared object
    at `path` calls the imported function `name`."""
    with open(path, "rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as image:
        if image[:4] != _ELF_MAGIC or image[4] != _ELFCLASS64 or image[5] != _ELFDATA2LSB:
            raise ProcessTuningError(f"{path} is not a 64-bit little-endian ELF file")
        machine = {62: "x86_64", 183: "aarch64"}.get(struct.unpack_from("<H", image, 0x12)[0])
        if machine is None:
            raise ProcessTuningError(f"{path} is for a machine this does not know")
        (table,) = struct.unpack_from("<Q", image, 0x28)  # e_shoff
        entry_size, count = struct.unpack_from("<HH", image, 0x3A)  # e_shentsize, e_shnum
        sections = [
            _Section(fields[1], fields[4], fields[5], fields[6])
            for fields in (_SECTION.unpack_from(image, table + i * entry_size) for i in range(count))
        ]
        wanted = name.encode()
        offsets = []
        for section in sections:
            if section.type != _SHT_RELA:
                continue
            symbols = sections[section.link]
            strings = sections[symbols.link]
            for start in range(section.offset, section.offset + section.size, _RELA.size):
                offset, info, _ = _RELA.unpack_from(image, start)
                if (machine, info & 0xFFFFFFFF) not in _SLOT_TYPES:
                    continue
                symbol_name = _SYMBOL.unpack_from(image, symbols.offset + (info >> 32) * _SYMBOL.size)[0]
                at = strings.offset + symbol_name
                if image[at : at + len(wanted) + 1] == wanted + b"\0":
                    offsets.append(offset)
        return offsets


def _load_address(path: str) -> int:
    """Where the dynamic linker loaded the (already loaded) shared object at `path`."""
    libc = ctypes.CDLL(None)
    handle = ctypes.CDLL(path, mode=os.RTLD_NOW | os.RTLD_NOLOAD)._handle
    link_map = ctypes.c_void_p()
    if libc.dlinfo(ctypes.c_void_p(handle), _RTLD_DI_LINKMAP, ctypes.byref(link_map)) != 0:
        raise ProcessTuningError(f"dlinfo found no link map for {path}")
    return ctypes.c_size_t.from_address(link_map.value or 0).value  # link_map.l_addr


def _protection(address: int) -> int:
    """The current protection of the page holding `address`, from /proc/self/maps."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            span, permissions = line.split()[:2]
            low, high = (int(part, 16) for part in span.split("-"))
            if low <= address < high:
                flags = zip(permissions[:3], "rwx", (_PROT_READ, _PROT_WRITE, _PROT_EXEC), strict=True)
                return sum(bit for have, letter, bit in flags if have == letter)
    raise ProcessTuningError(f"address {address:#x} is not mapped")


def _write_pointer(address: int, value: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mprotect.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    page = address & ~(mmap.PAGESIZE - 1)
    protection = _protection(address)
    if not protection & _PROT_WRITE and libc.mprotect(page, mmap.PAGESIZE, protection | _PROT_WRITE) != 0:
        raise ProcessTuningError(f"mprotect failed: {os.strerror(ctypes.get_errno())}")
    ctypes.c_void_p.from_address(address).value = value
    if not protection & _PROT_WRITE:
        libc.mprotect(page, mmap.PAGESIZE, protection)


def redirect(path: str, name: str, expected: int, replacement: int) -> int:
    """Point the shared object at `path`'s slots for the imported function `name`, which must
    hold `expected` (the function's address), at `replacement`. Returns how many slots were
    redirected; raises ProcessTuningError, having written nothing, when none could be."""
    offsets = slot_offsets(path, name)
    if not offsets:
        raise ProcessTuningError(f"{os.path.basename(path)} does not import {name}")
    base = _load_address(path)
    slots = [base + offset for offset in offsets]
    for slot in slots:
        held = ctypes.c_void_p.from_address(slot).value
        if held != expected:
            raise ProcessTuningError(f"the slot for {name} holds {held or 0:#x}, not {expected:#x}")
    for slot in slots:
        _write_pointer(slot, replacement)
    return len(slots)
