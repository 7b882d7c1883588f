"""The server process's runtime settings: glibc's thresholds set unless the operator set them,
memory given back once when a busy period is followed by an idle one, the collector's threshold."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

import outrig
from outrig.service import process as tuning
from outrig.service.exceptions import ConfigError
from tests.conftest import missing_tool, start_server

GLIBC = os.confstr("CS_GNU_LIBC_VERSION") is not None if hasattr(os, "confstr") else False


def _tune_in_a_fresh_process(**environment: str) -> str:
    """tune_malloc's result in a new interpreter, so the tests' own allocator is left alone."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    code = "from outrig.service import process as tuning; print(tuning.tune_malloc())"
    result = subprocess.run(
        [sys.executable, "-c", code], env={**env, **environment}, capture_output=True, text=True, check=True
    )
    return result.stdout.strip()


@pytest.mark.skipif(not GLIBC, reason="mallopt is glibc's")
def test_thresholds_are_set_on_glibc() -> None:
    assert _tune_in_a_fresh_process() == "True"


@pytest.mark.skipif(not GLIBC, reason="mallopt is glibc's")
@pytest.mark.parametrize(
    "environment",
    [
        {"MALLOC_TRIM_THRESHOLD_": "131072"},
        {"MALLOC_MMAP_THRESHOLD_": "131072"},
        {"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=131072"},
    ],
)
def test_the_operators_settings_are_left_alone(environment: dict[str, str]) -> None:
    assert _tune_in_a_fresh_process(**environment) == "False"


def test_unrelated_tunables_do_not_count_as_the_operators() -> None:
    assert not tuning._set_by_operator({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"})
    assert tuning._set_by_operator({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1:glibc.malloc.top_pad=0"})


#: Debian's libtcmalloc-minimal4, which the container image preloads (deploy/Dockerfile).
TCMALLOC = f"/usr/lib/{os.uname().machine}-linux-gnu/libtcmalloc_minimal.so.4"


def _tcmalloc() -> str:
    if not os.path.exists(TCMALLOC):
        missing_tool(TCMALLOC, "libtcmalloc-minimal4")
    return TCMALLOC


def _clean_environment(**environment: str) -> dict[str, str]:
    """This environment without the allocator's settings, and with `environment`."""
    names = ("GLIBC_TUNABLES", "LD_PRELOAD", "MALLOC_CONF")
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k not in names}
    return {**env, **environment}


_FREED_THEN_UPB = """
from outrig.service import process as tuning
from outrig.v1 import space_pb2 as pb

def resident_mib():
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * 4096 / 2**20

tuning.tune_malloc()
blocks = [b"x" * (1 << 20) for _ in range(200)]  # 200 MiB touched, in the heap
del blocks
before = resident_mib()
encoded = pb.Entry(type_name="t").SerializeToString()
for _ in range(30_000):  # each parse makes and frees an arena; upb trims every 10,000 frees
    pb.Entry.FromString(encoded)
print(before - resident_mib())
"""


def _python(code: str, **environment: str) -> str:
    """What `code` prints in a new interpreter with `environment` (and no allocator settings of
    this one's), so that the tests' own allocator is left alone."""
    result = subprocess.run(
        [sys.executable, "-c", code],
        env=_clean_environment(**environment),
        capture_output=True,
        text=True,
        check=True,
    )
    return result.stdout


def _freed_by_upb(**environment: str) -> float:
    """MiB given back while upb made and freed 30,000 arenas after 200 MiB were freed."""
    return float(_python(_FREED_THEN_UPB, **environment))


@pytest.mark.skipif(not GLIBC, reason="malloc_trim is glibc's")
def test_protobuf_trims_glibcs_heap_but_not_a_preloaded_tcmalloc() -> None:
    # upb's malloc_trim(0) gives glibc's freed 200 MiB back, whatever its thresholds say (so the
    # next large entry faults its pages in again); tcmalloc keeps them for reuse, which is why
    # the container image preloads it (docs/performance.md, "Allocators").
    assert _freed_by_upb() > 150
    assert _freed_by_upb(LD_PRELOAD=_tcmalloc()) < 20


@pytest.mark.skipif(not GLIBC, reason="dladdr is glibc's")
def test_the_allocator_in_use_is_named() -> None:
    code = (
        "from outrig.service import process as t; "
        "print(t.malloc_library(), t.glibc_allocates(), t.tune_malloc())"
    )

    library, glibc, tuned = _python(code).split()
    assert os.path.basename(library).startswith("libc.") and glibc == "True" and tuned == "True"
    # A preloaded allocator serves malloc; glibc's thresholds are not its business.
    assert _python(code, LD_PRELOAD=_tcmalloc()).split() == [TCMALLOC, "False", "False"]


_FREED_THEN_RELEASED = """
from outrig.service import process as tuning

def resident_mib():
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * 4096 / 2**20

release = tuning.tune_allocator()
blocks = [b"x" * (1 << 20) for _ in range(200)]  # 200 MiB touched
del blocks
before = resident_mib()
release()
print(before - resident_mib())
"""


@pytest.mark.skipif(not GLIBC, reason="malloc_trim is glibc's")
@pytest.mark.parametrize("allocator", ["glibc", "tcmalloc"])
def test_the_idle_release_gives_free_memory_back(allocator: str) -> None:
    # What release_when_idle calls with each allocator (glibc's malloc_trim, tcmalloc's
    # MallocExtension_ReleaseFreeMemory): the freed 200 MiB leave the process.
    environment = {"LD_PRELOAD": _tcmalloc()} if allocator == "tcmalloc" else {}
    assert float(_python(_FREED_THEN_RELEASED, **environment)) > 150


def test_no_idle_release_where_the_operator_set_glibcs_thresholds() -> None:
    assert tuning.tune_allocator({"MALLOC_TRIM_THRESHOLD_": "131072"}) is None


class _OutOfPeriodsError(Exception):
    pass


class _Process:
    """A fake process: each period (a call of `sleep`) uses the CPU seconds its load says."""

    def __init__(self, loads: list[float]) -> None:
        self.loads = loads
        self.cpu = 0.0
        self.trims = 0

    def cpu_time(self) -> float:
        return self.cpu

    def trim(self) -> None:
        self.trims += 1

    async def sleep(self, seconds: float) -> None:
        if not self.loads:
            raise _OutOfPeriodsError
        self.cpu += self.loads.pop(0) * seconds


async def _trims(loads: list[float]) -> int:
    """How often release_when_idle trims through periods with these loads (share of a core)."""
    process = _Process(loads)
    with pytest.raises(_OutOfPeriodsError):
        await tuning.release_when_idle(
            10.0, cpu_time=process.cpu_time, trim=process.trim, sleep=process.sleep
        )
    return process.trims


async def test_an_idle_server_is_not_trimmed_again_and_again() -> None:
    assert await _trims([0.0, 0.001, 0.0, 0.0]) == 0


async def test_memory_is_given_back_once_after_a_busy_period() -> None:
    assert await _trims([0.5, 1.0, 0.0, 0.002, 0.0, 0.3, 0.0]) == 2


async def test_a_busy_server_is_not_trimmed() -> None:
    assert await _trims([0.5, 0.02, 1.0, 0.5]) == 0


def test_the_collector_waits_longer_before_a_young_collection() -> None:
    saved = gc.get_threshold()
    try:
        gc.set_threshold(700, 11, 12)
        tuning.tune_collector()
        assert gc.get_threshold() == (tuning.YOUNG_COLLECTION_THRESHOLD, 11, 12)
    finally:
        gc.set_threshold(*saved)


@pytest.mark.skipif(not GLIBC, reason="mallopt and malloc_trim are glibc's")
def test_outrig_serve_sets_glibcs_thresholds() -> None:
    running = start_server("--in-memory", "--log-level", "DEBUG", "--allocator", "glibc")
    try:
        running.stop()
        log = running.log.read_text()
    finally:
        running.log.unlink()
    assert "malloc: mmap threshold 33554432, trim threshold -1, set: True" in log


def test_outrig_serve_keeps_a_preloaded_allocators_settings() -> None:
    running = start_server("--in-memory", "--log-level", "DEBUG", env={"LD_PRELOAD": _tcmalloc()})
    try:
        running.stop()
        log = running.log.read_text()
    finally:
        running.log.unlink()
    assert f"malloc: {TCMALLOC} preloaded, its own settings kept" in log
    assert "malloc: libtcmalloc_minimal.so.4 gives free memory back once the server is idle" in log
    assert "mmap threshold" not in log


# ---------------------------------------------------------------- outrig serve --allocator

_GLIBC_MALLOC = "/usr/lib/x86_64-linux-gnu/libc.so.6"  # what malloc_library names, on glibc
_LIBRARY = "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4"


@dataclass
class Blob(outrig.Entry, type_name="tests.process.Blob"):
    data: bytes | None = None


def test_auto_and_tcmalloc_start_again_with_tcmalloc_preloaded() -> None:
    for choice in ("auto", "tcmalloc"):
        environment = tuning.allocator_exec(
            choice, {"LD_PRELOAD": "libshim.so", "A": "1"}, _LIBRARY, _GLIBC_MALLOC
        )
        assert environment == {"LD_PRELOAD": f"{_LIBRARY} libshim.so", "A": "1"}  # the others kept


def test_glibc_keeps_the_process_as_it_is() -> None:
    assert tuning.allocator_exec("glibc", {}, _LIBRARY, _GLIBC_MALLOC) is None


def test_a_preloaded_allocator_is_kept() -> None:
    for choice in ("auto", "tcmalloc", "glibc"):
        assert tuning.allocator_exec(choice, {}, _LIBRARY, _LIBRARY) is None  # tcmalloc already
    jemalloc = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"
    assert tuning.allocator_exec("auto", {}, _LIBRARY, jemalloc) is None
    with pytest.raises(ConfigError, match=r"libjemalloc\.so\.2 is preloaded"):
        tuning.allocator_exec("tcmalloc", {}, _LIBRARY, jemalloc)


def test_without_tcmalloc_auto_keeps_glibc_and_tcmalloc_fails() -> None:
    assert tuning.allocator_exec("auto", {}, "", _GLIBC_MALLOC) is None
    with pytest.raises(ConfigError, match="apt-get install libtcmalloc-minimal4"):
        tuning.allocator_exec("tcmalloc", {}, "", _GLIBC_MALLOC)
    assert tuning.allocator_exec("auto", {}, _LIBRARY, "") is None  # off glibc: nothing to preload over
    with pytest.raises(ConfigError, match="invalid value 'jemalloc'"):
        tuning.allocator_exec("jemalloc", {}, _LIBRARY, _GLIBC_MALLOC)


def test_a_preload_that_did_not_take_is_not_tried_again() -> None:
    # LD_PRELOAD names tcmalloc, yet glibc serves malloc (the loader ignored it): no second exec.
    assert tuning.allocator_exec("auto", {"LD_PRELOAD": _LIBRARY}, _LIBRARY, _GLIBC_MALLOC) is None
    with pytest.raises(ConfigError, match="yet glibc's malloc serves the process"):
        tuning.allocator_exec("tcmalloc", {"LD_PRELOAD": _LIBRARY}, _LIBRARY, _GLIBC_MALLOC)


def test_tcmalloc_is_found_in_the_library_directories(tmp_path: Path) -> None:
    assert tuning.tcmalloc_library([str(tmp_path)]) == ""
    (tmp_path / "libtcmalloc_minimal.so.4").write_bytes(b"")
    assert tuning.tcmalloc_library([str(tmp_path / "none"), str(tmp_path)]) == str(
        tmp_path / "libtcmalloc_minimal.so.4"
    )


def _serving_with(*args: str, env: dict[str, str] | None = None) -> tuple[bool, str]:
    """Whether a real `outrig serve ARGS` maps tcmalloc once it listens, and its log."""
    running = start_server(
        "--in-memory", "--log-level", "DEBUG", *args, env=_clean_environment(**(env or {})), allocator=None
    )
    try:
        with open(f"/proc/{running.process.pid}/maps") as maps:
            mapped = "libtcmalloc_minimal" in maps.read()
        with outrig.connect(running.address, retry_deadline=0) as space:  # it serves
            space.write(Blob(data=b"x" * 1024))
            assert space.count(Blob()) == 1
        assert running.stop() == 0
        return mapped, running.log.read_text()
    finally:
        running.log.unlink()


@pytest.mark.skipif(not GLIBC, reason="preloading is glibc's dynamic linker's")
def test_outrig_serve_runs_on_tcmalloc_when_it_is_installed() -> None:
    _tcmalloc()
    mapped, log = _serving_with()  # --allocator auto, the default
    assert mapped
    assert "allocator: starting again on tcmalloc" in log
    assert f"malloc: {TCMALLOC} preloaded, its own settings kept" in log


@pytest.mark.skipif(not GLIBC, reason="preloading is glibc's dynamic linker's")
@pytest.mark.parametrize("how", ["flag", "environment"])
def test_outrig_serve_on_glibc_when_asked(how: str) -> None:
    _tcmalloc()
    if how == "flag":
        mapped, log = _serving_with("--allocator", "glibc")
    else:
        mapped, log = _serving_with(env={"OUTRIG_ALLOCATOR": "glibc"})
    assert not mapped
    assert "starting again" not in log
    assert "malloc: mmap threshold 33554432, trim threshold -1, set: True" in log


def test_outrig_serve_refuses_an_unknown_allocator() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "outrig.service", "serve", "--in-memory", "--listen", "127.0.0.1:0"],
        env={**_clean_environment(), "OUTRIG_ALLOCATOR": "jemalloc"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "allocator: invalid value 'jemalloc'" in result.stderr
