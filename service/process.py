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

**protobuf's own trims, and the allocator.** protobuf's upb module calls malloc_trim(0) itself
after every 10,000 frees of its arenas' blocks (write+take pairs at about 500 a second set one off
within 1.6 s). On glibc that gives back all free memory, whatever the thresholds say, including the
free pages inside the heap, so the next 3.6 MB entry stored faults its pages in again. Nothing here
changes protobuf: the server runs on tcmalloc instead where it can (below; the container image
preloads it too), which serves every malloc and keeps freed pages for reuse; upb's malloc_trim then
trims glibc's heap, which holds next to nothing.
`tune_malloc` sees that (`malloc_library`, from dladdr(3)) and leaves a preloaded allocator's
settings alone, and so does `outrig serve`'s idle release. On plain glibc the trims stay, and
what they cost HD array writes is in docs/performance.md ("Allocators").

**Which allocator.** `outrig serve --allocator auto` (the default) runs the server on Debian's
tcmalloc (libtcmalloc_minimal.so.4, the container image's) when that library is installed and
nothing else is preloaded: `run_on_allocator` re-executes the process once, at start, before it
starts a thread or opens a port, with the library added to LD_PRELOAD (the same process id,
command line and file descriptors; the imports and the configuration are done again). tcmalloc
keeps freed pages for reuse, so upb's trims above cost HD array writes nothing
(docs/performance.md, "Allocators"). LD_PRELOAD stays in the environment of what the server
starts (its `--workers`, which then find tcmalloc in place). `--allocator glibc` (or
OUTRIG_ALLOCATOR=glibc) keeps the allocator the process was started with; `tcmalloc` insists
(ConfigError if the library is missing). An allocator preloaded by the operator is kept either way.

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
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence

from outrig.service.exceptions import ConfigError

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


class _DlInfo(ctypes.Structure):
    """dladdr(3)'s Dl_info."""

    _fields_ = (
        ("dli_fname", ctypes.c_char_p),
        ("dli_fbase", ctypes.c_void_p),
        ("dli_sname", ctypes.c_char_p),
        ("dli_saddr", ctypes.c_void_p),
    )


def malloc_library() -> str:
    """The file of the shared object whose `malloc` this process calls: libc's, or an allocator
    preloaded in its place (LD_PRELOAD=libjemalloc.so.2, as the container image does); "" off
    glibc or if the dynamic linker cannot say."""
    libc = _libc()
    if libc is None:
        return ""
    info = _DlInfo()
    address = ctypes.cast(libc.malloc, ctypes.c_void_p)
    if not libc.dladdr(address, ctypes.byref(info)) or info.dli_fname is None:
        return ""
    return os.fsdecode(info.dli_fname)


def glibc_allocates() -> bool:
    """Whether glibc's own malloc serves this process (no other allocator preloaded)."""
    return os.path.basename(malloc_library()).startswith("libc.")


def tune_malloc(environ: Mapping[str, str] = os.environ) -> bool:
    """Set glibc's mmap and trim thresholds for this process (see the module's docstring).
    True if they were set; False off glibc, if another allocator is preloaded (it keeps its own
    settings), if the environment sets them, or if glibc refused."""
    libc = _libc()
    if libc is None or _set_by_operator(environ):
        return False
    if not glibc_allocates():
        log.debug("malloc: %s preloaded, its own settings kept", malloc_library())
        return False
    mallopt = libc.mallopt
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    done = bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
        mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    )
    log.debug("malloc: mmap threshold %d, trim threshold %d, set: %s", MMAP_THRESHOLD, TRIM_THRESHOLD, done)
    return done


def _malloc_trim() -> None:
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(ctypes.c_size_t(0))


def tune_allocator(environ: Mapping[str, str] = os.environ) -> Callable[[], None] | None:
    """What `outrig serve` does to its allocator: glibc's thresholds (`tune_malloc`), and how
    `release_when_idle` gives free memory back: glibc's malloc_trim (only where tune_malloc set
    the thresholds: the operator's own settings are left alone), or a preloaded tcmalloc's
    MallocExtension_ReleaseFreeMemory (its documented way to return its free pages at once). None
    for any other allocator: jemalloc returns its pages on its own decay schedule."""
    if tune_malloc(environ):
        return _malloc_trim
    library = malloc_library()
    if not library or glibc_allocates():
        return None
    release = getattr(ctypes.CDLL(library), "MallocExtension_ReleaseFreeMemory", None)
    if release is None:
        return None
    release.argtypes = ()
    release.restype = None
    log.debug("malloc: %s gives free memory back once the server is idle", os.path.basename(library))
    return release  # type: ignore[no-any-return]


#: `outrig serve --allocator`: the choices.
ALLOCATORS = ("auto", "tcmalloc", "glibc")
#: Debian's libtcmalloc-minimal4 (the container image preloads it by this name).
TCMALLOC = "libtcmalloc_minimal.so.4"


def _library_directories() -> tuple[str, ...]:
    multiarch = getattr(sys.implementation, "_multiarch", f"{os.uname().machine}-linux-gnu")
    return (f"/usr/lib/{multiarch}", f"/lib/{multiarch}", "/usr/lib64", "/usr/lib", "/usr/local/lib")


def tcmalloc_library(directories: Sequence[str] | None = None) -> str:
    """The path of the installed libtcmalloc_minimal.so.4 in the system's library directories
    (or `directories`); "" if there is none."""
    for directory in _library_directories() if directories is None else directories:
        path = os.path.join(directory, TCMALLOC)
        if os.path.isfile(path):
            return path
    return ""


def allocator_exec(
    choice: str, environ: Mapping[str, str], library: str, preloaded: str
) -> dict[str, str] | None:
    """The environment to re-execute `outrig serve` in to run on tcmalloc, or None to go on as
    it is (see the module's docstring). `library`: tcmalloc's path ("" if not installed);
    `preloaded`: the library whose malloc the process calls now (`malloc_library`; "" off glibc).
    Raises ConfigError for `tcmalloc` where it cannot be had."""
    if choice not in ALLOCATORS:
        raise ConfigError(f"allocator: invalid value {choice!r} (expected one of {', '.join(ALLOCATORS)})")
    if choice == "glibc":
        return None
    serving = os.path.basename(preloaded)
    if serving.startswith("libtcmalloc"):
        return None  # already
    if serving and not serving.startswith("libc."):
        if choice == "tcmalloc":
            raise ConfigError(f"allocator: tcmalloc asked for, but {preloaded} is preloaded")
        return None  # the operator's own choice
    if not serving:
        missing = "only glibc's malloc can be replaced by a preload"
    elif not library:
        missing = f"{TCMALLOC} is not installed (Debian: apt-get install libtcmalloc-minimal4)"
    elif library in environ.get("LD_PRELOAD", "").split():
        missing = f"{library} is in LD_PRELOAD, yet glibc's malloc serves the process"  # no loop
    else:
        missing = ""
    if missing:
        if choice == "tcmalloc":
            raise ConfigError(f"allocator: {missing}")
        log.debug("allocator: glibc (%s)", missing)
        return None
    others = environ.get("LD_PRELOAD", "")
    return {**environ, "LD_PRELOAD": f"{library} {others}".strip()}


def run_on_allocator(choice: str) -> None:
    """`outrig serve`'s allocator (`--allocator`): re-execute this process with tcmalloc
    preloaded if `allocator_exec` says so (the call then does not return), else nothing. The CLI
    calls it only when it runs the process's own command line (`sys.orig_argv`, which the exec
    runs again), before anything has started."""
    environment = allocator_exec(choice, os.environ, tcmalloc_library(), malloc_library())
    if environment is None:
        return
    log.info("allocator: starting again on tcmalloc (%s preloaded; --allocator glibc: not)", TCMALLOC)
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execve(sys.executable, sys.orig_argv, environment)
    except OSError as err:
        if choice == "tcmalloc":
            raise ConfigError(f"allocator: cannot start again with tcmalloc: {err}") from err
        log.warning("allocator: cannot start again with tcmalloc (%s): glibc's malloc serves", err)


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
