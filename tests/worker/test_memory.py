"""Handing freed heap memory back (aioengine.worker.memory) with the real glibc allocator."""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

import pytest

from aioengine.worker.memory import HeapTrimmer, release_freed_memory

MiB = 1 << 20


def _rss() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS"))


def _glibc():
    name = ctypes.util.find_library("c")
    libc = ctypes.CDLL(name)
    if not hasattr(libc, "malloc_trim"):
        pytest.skip("not glibc")
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = (ctypes.c_size_t,)
    libc.free.argtypes = (ctypes.c_void_p,)
    return libc


def _strand(libc, mib: int) -> list[int]:
    """``mib`` MB of touched heap chunks, freed but for every 32nd: the kept ones pin the heap
    (it cannot shrink from its top, and the holes between them stay resident), so only a trim
    gives the pages back. Returns the kept chunks (free them after)."""
    chunks = [libc.malloc(64 * 1024) for _ in range(mib * 16)]  # below the mmap threshold
    for c in chunks:
        ctypes.memset(c, 1, 64 * 1024)
    for i, c in enumerate(chunks):
        if i % 32:
            libc.free(c)
    return chunks[::32]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_trim_gives_freed_heap_pages_back():
    libc = _glibc()
    keep = _strand(libc, 64)
    before = _rss()
    assert release_freed_memory()
    assert before - _rss() > 40 * MiB
    for c in keep:
        libc.free(c)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_trimmer_after_prefill_steps_at_most_once_per_interval():
    libc = _glibc()
    now = [100.0]
    trimmer = HeapTrimmer(min_tokens=32, min_interval=1.0, clock=lambda: now[0])
    keep = _strand(libc, 32)
    assert not trimmer.after_step(31)  # decode-sized steps never trim
    before = _rss()
    assert trimmer.after_step(32)
    assert before - _rss() > 20 * MiB
    for c in keep:
        libc.free(c)
    now[0] += 0.5
    assert not trimmer.after_step(500)  # too soon after the last trim
    now[0] += 0.6
    assert trimmer.after_step(500) and trimmer.trims == 2


def test_bad_settings():
    with pytest.raises(ValueError, match="min_tokens must be >= 1 and min_interval >= 0"):
        HeapTrimmer(min_tokens=0)
    with pytest.raises(ValueError, match="got 32 and -1"):
        HeapTrimmer(min_interval=-1)
