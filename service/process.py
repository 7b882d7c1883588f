"""Process-wide settings of an `outrig serve` process: glibc's allocator and Python's collector.

Only `outrig serve` applies them, to its own process: an application that embeds the server
keeps the allocator and collector settings it has.

**The allocator.** By default glibc serves an allocation above its mmap threshold (128 KiB at
first, adapting up to 32 MiB) with a fresh mapping, and gives the free memory at the top of its
heap back to the kernel as soon as more than its trim threshold (twice the mmap threshold) is free
there. A server that stores 3.6 MB entries and drops others then gets fresh pages for nearly every
entry it stores, and each page faults in on first touch: about 2 ms per 3.6 MB on the project's
VMs, against 0.1 ms to copy 3.6 MB into pages already mapped. `tune_malloc` keeps allocations up
to 32 MiB in the heap, where freed ones are reused, and turns glibc's automatic trimming off (a
trim threshold of -1, as mallopt(3) documents). With a threshold of 2 GiB (the most a positive
int allows), cancelling a run of 600 HD array entries (2.2 GB) gave it all back at once, and the
next run faulted its pages in again.

Freed memory is given back once the server is idle: `release_when_idle` calls malloc_trim after
a period in which the process used almost no CPU (`--idle-release-seconds`, default 60 s), much
as tcmalloc and jemalloc return unused pages some time after they were freed. A period of 10 s
was too short: a pause of 16 s between two bursts of HD array writes gave everything back, and
the next burst paid 2.2 ms of page faults for each 3.6 MB entry it stored. Nothing is changed
off glibc, or when the environment sets glibc's malloc thresholds (MALLOC_*_ variables or
glibc.malloc tunables): those are the operator's call.

**protobuf's own trims.** protobuf's upb module calls malloc_trim(0) itself after every 10,000
frees of its arenas' blocks (write+take pairs at about 500 a second set one off within 1.6 s).
That gives back all free memory, whatever the thresholds say, including the free pages inside
the heap, so the next 3.6 MB entry stored faults its pages in again: 850-1,300 faults and about
2 ms per HD array write, against under 150 without those trims. `keep_protobuf_from_trimming`
points the upb module's import of malloc_trim at libc's `abs`, which does nothing with the 0 it
is given (`redirect`, below; only that module's calls change), under the same conditions
as `tune_malloc`; `release_when_idle` still trims once the server is idle.

**The collector.** Python's cyclic collector runs a young collection every 700 net allocations of
container objects. A write_many of 100 small entries has over 1,100 alive before the engine files
them, so they were collected, promoted and counted towards full collections, which walk every
stored entry: a fifth of the event loop's busy time under write_many(100) + take_many(100). `tune_collector`
raises that first threshold to 10,000; the request's objects are then mostly freed by reference
counting before a collection sees them.
"""

from __future__ import annotations

import asyncio
import ctypes
import gc
import logging
import mmap
import os
import signal
import struct
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from outrig.service.exceptions import ConfigError, ProcessTuningError

log = logging.getLogger("outrig.service")

# mallopt(3) parameters (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3

#: Allocations up to this size come from the heap: glibc's own upper bound for its adaptive
#: threshold on 64-bit systems, and above the default max_message_bytes (16 MiB).
MMAP_THRESHOLD = 32 * 1024 * 1024
#: Free memory at the top of the heap kept for reuse while the server is busy: -1 is "never trim"
#: (mallopt(3)); release_when_idle trims explicitly.
TRIM_THRESHOLD = -1
#: `release_when_idle`: the share of one core below which a period is idle.
IDLE_CPU_SHARE = 0.01

#: Net allocations of container objects between young collections (Python's default: 700).
YOUNG_COLLECTION_THRESHOLD = 10_000

_OPERATOR_VARIABLES = (
    "MALLOC_MMAP_THRESHOLD_",
    "MALLOC_TRIM_THRESHOLD_",
    "MALLOC_TOP_PAD_",
    "MALLOC_MMAP_MAX_",
)
_OPERATOR_TUNABLES = ("glibc.malloc.mmap_threshold", "glibc.malloc.trim_threshold", "glibc.malloc.top_pad")


def _set_by_operator(environ: Mapping[str, str]) -> bool:
    tunables = environ.get("GLIBC_TUNABLES", "")
    return any(name in environ for name in _OPERATOR_VARIABLES) or any(
        t in tunables for t in _OPERATOR_TUNABLES
    )


def _libc() -> ctypes.CDLL | None:
    """The C library, if it is glibc."""
    try:
        if os.confstr("CS_GNU_LIBC_VERSION") is None:
            return None
        return ctypes.CDLL(None)
    except (ValueError, OSError):
        return None


def tune_malloc(environ: Mapping[str, str] = os.environ) -> bool:
    """Set glibc's mmap and trim thresholds for this process (see the module's docstring).
    True if they were set; False off glibc, if the environment sets them, or if glibc refused."""
    libc = _libc()
    if libc is None or _set_by_operator(environ):
        return False
    mallopt = libc.mallopt
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    done = bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
        mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    )
    log.debug("malloc: mmap threshold %d, trim threshold %d, set: %s", MMAP_THRESHOLD, TRIM_THRESHOLD, done)
    return done


def keep_protobuf_from_trimming(environ: Mapping[str, str] = os.environ) -> bool:
    """Stop protobuf's upb module from calling malloc_trim (see the module's docstring). True if
    its calls were redirected; False off glibc, if the environment sets the thresholds, if
    protobuf does not run on upb, or if the module is not as expected (logged)."""
    libc = _libc()
    if libc is None or _set_by_operator(environ):
        return False
    from google.protobuf.internal import api_implementation

    if api_implementation.Type() != "upb":
        return False
    from google._upb import _message

    trim = ctypes.cast(libc.malloc_trim, ctypes.c_void_p).value or 0
    nothing = ctypes.cast(libc.abs, ctypes.c_void_p).value or 0  # int abs(int): abs(0) == 0
    try:
        redirect(_message.__file__, "malloc_trim", trim, nothing)
    except (ProcessTuningError, OSError) as error:
        log.info("protobuf's heap trims stay: %s", error)
        return False
    log.debug("protobuf's heap trims redirected to a no-op")
    return True


def _malloc_trim() -> None:
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(ctypes.c_size_t(0))


def _resident_bytes() -> int:
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return 0


async def release_when_idle(
    period: float,
    *,
    cpu_time: Callable[[], float] = time.process_time,
    trim: Callable[[], None] = _malloc_trim,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> None:
    """Run until cancelled: after each period in which the process used less than IDLE_CPU_SHARE
    of a core, following one in which it was busier, give free memory back to the kernel (trim,
    in a thread: it walks the heap). An idle server is trimmed once, not every period."""
    last, trimmed = cpu_time(), True
    while True:
        await sleep(period)
        now = cpu_time()
        idle = now - last < IDLE_CPU_SHARE * period
        if not idle:
            trimmed = False
        elif not trimmed:
            before = _resident_bytes()
            await asyncio.to_thread(trim)
            log.info(
                "idle for %g s: freed memory given back (resident %.0f MiB -> %.0f MiB)",
                period,
                before / 2**20,
                _resident_bytes() / 2**20,
            )
            trimmed = True
            now = cpu_time()  # the trim's own CPU time is not activity
        last = now


#: prctl(2): have the kernel send this process a signal when its parent ends.
_PR_SET_PDEATHSIG = 1


def end_with_supervisor(supervisor: int) -> bool:
    """A worker of `outrig serve --workers N`: have the kernel send this process SIGTERM (a
    graceful stop) when its supervisor ends, even by SIGKILL, so that no worker outlives it.
    Raises ConfigError if the supervisor is already gone; False where prctl is not available
    (off Linux), where only the supervisor's own stop ends the workers."""
    libc = _libc()
    done = False
    if libc is not None:
        prctl = libc.prctl
        prctl.argtypes = (ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong)
        prctl.restype = ctypes.c_int
        done = prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) == 0
    # The supervisor may have ended before the request was made: then nobody would send it.
    if os.getppid() != supervisor:
        raise ConfigError(f"the supervisor (pid {supervisor}) of this worker is gone")
    return done


def tune_collector() -> None:
    """Raise the collector's first threshold to YOUNG_COLLECTION_THRESHOLD; the others stay."""
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_COLLECTION_THRESHOLD, older, oldest)


# ---------------------------------------------------------------- one imported function, redirected
#
# Redirect a function that a loaded shared object imports from another library (ELF, 64-bit
# little-endian: x86-64 and AArch64 Linux).
#
# A shared object calls an imported function, such as libc's `malloc_trim`, through a slot of its
# global offset table that the dynamic linker fills with the function's address when the object is
# loaded (CPython loads extension modules with RTLD_NOW, so every slot is filled by then).
# `redirect` finds the slot from the object's relocations on disk and its load address, checks that
# the slot holds the address it expects, and writes another function's address there. It touches
# that one slot of that one object: every other caller of the function is unaffected.
#
# It changes nothing, and says why, when anything is not as expected: another file format, no
# relocation for the name, a slot holding something else (another library interposed, a lazy
# binding not yet resolved).

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
