"""The shared segment: a sealed memfd (no name in /dev/shm or anywhere on disk) holding a header
of 8-byte slots followed by the ring's data bytes.

Header slots (u64). Every field that one side writes often sits on its own 64-byte cache line,
so a writer publishing ``HEAD`` does not bounce the line a reader is storing its tail into::

    line 0   magic, version, capacity, num_readers          (written once by the creator)
    line 1   HEAD              bytes ever published by the writer
    line 2   WRITER_SLEEPING   while the writer sleeps: the free bytes it waits for
    line 3   WRITER_CLOSED     1 once the writer closed
    per reader r, two lines:
             tail(r), reader_closed(r)   bytes reader r consumed; 1 once it closed
             reader_sleeping(r)          1 while reader r sleeps for data
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import mmap
import os

from transports.errors import TransportError

log = logging.getLogger(__name__)

PAGE = mmap.PAGESIZE
MAGIC = int.from_bytes(b"AIOSHMr1", "little")
VERSION = 1
MIN_CAPACITY = 4096
MAX_CAPACITY = 1 << 40
MAX_READERS = 1024

HEAD = 8
WRITER_SLEEPING = 16
WRITER_CLOSED = 24
_READERS = 32
_STRIDE = 16  # slots per reader: two cache lines
_SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW
_POPULATE = getattr(mmap, "MAP_POPULATE", 0)  # Linux


def tail_slot(rank: int) -> int:
    return _READERS + _STRIDE * rank


def reader_closed_slot(rank: int) -> int:
    return _READERS + _STRIDE * rank + 1


def reader_sleeping_slot(rank: int) -> int:
    return _READERS + _STRIDE * rank + 8


def header_size(num_readers: int) -> int:
    used = 8 * (_READERS + _STRIDE * num_readers)
    return -(-used // PAGE) * PAGE


def check_capacity(capacity: int) -> int:
    """Validate ``capacity`` (ring bytes) and round it up to whole pages."""
    if isinstance(capacity, bool) or not isinstance(capacity, int):
        raise TypeError(f"capacity must be an int number of bytes, got {capacity!r}")
    if not MIN_CAPACITY <= capacity <= MAX_CAPACITY:
        raise ValueError(f"shm capacity must be between {MIN_CAPACITY} and {MAX_CAPACITY} "
                         f"bytes, got {capacity}")
    return -(-capacity // PAGE) * PAGE


def check_num_readers(num_readers: int) -> int:
    if isinstance(num_readers, bool) or not isinstance(num_readers, int):
        raise TypeError(f"num_readers must be an int, got {num_readers!r}")
    if not 1 <= num_readers <= MAX_READERS:
        raise ValueError(f"num_readers must be between 1 and {MAX_READERS}, got {num_readers}")
    return num_readers


class Segment:
    """A mapping of the segment: ``slots`` (the header as u64s) and ``data`` (the ring bytes)."""

    def __init__(self, fd: int, capacity: int, num_readers: int) -> None:
        hsize = header_size(num_readers)
        self.capacity = capacity
        self.num_readers = num_readers
        # MAP_POPULATE: fault every page in now, not on the hot path. A lazily committed ring
        # pays a page fault (allocate, zero, map: several us on a VM) on each page's first
        # write and again on each mapping's first read, which made the first lap through a
        # large ring crawl (0.4 GB/s for 1 MiB messages) and put fault jitter in busy loops.
        self._mm = mmap.mmap(fd, hsize + capacity, flags=mmap.MAP_SHARED | _POPULATE)
        view = memoryview(self._mm)
        self.slots = view[:hsize].cast("Q")
        self.data = view[hsize:]
        self.words = self.data.cast("Q")  # the data bytes as u64s, for record headers
        view.release()

    @classmethod
    def create(cls, name: str, capacity: int, num_readers: int) -> tuple[Segment, int]:
        """A new zero-filled segment and its memfd (close-on-exec, sealed against resizing so
        no peer can truncate it under our mapping and turn our next access into SIGBUS)."""
        fd = os.memfd_create(f"aioengine-shm-{name}", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(fd, header_size(num_readers) + capacity)
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _SEALS | fcntl.F_SEAL_SEAL)
            seg = cls(fd, capacity, num_readers)
        except BaseException:
            os.close(fd)
            raise
        s = seg.slots
        s[1], s[2], s[3] = VERSION, capacity, num_readers
        s[0] = MAGIC
        return seg, fd

    @classmethod
    def attach(cls, fd: int, capacity: int, num_readers: int) -> Segment:
        """Map a segment received from the writer, after checking it is what it claims."""
        if not (MIN_CAPACITY <= capacity <= MAX_CAPACITY and 1 <= num_readers <= MAX_READERS):
            raise TransportError(f"shm peer offered a bad ring: capacity {capacity}, "
                                 f"{num_readers} readers")
        size = header_size(num_readers) + capacity
        if os.fstat(fd).st_size != size:
            raise TransportError(f"shm segment is {os.fstat(fd).st_size} bytes, expected {size}")
        if fcntl.fcntl(fd, fcntl.F_GET_SEALS) & _SEALS != _SEALS:
            raise TransportError("shm segment is not sealed against resizing; refusing to map it")
        seg = cls(fd, capacity, num_readers)
        s = seg.slots
        if (s[0], s[1], s[2], s[3]) != (MAGIC, VERSION, capacity, num_readers):
            seg.close()
            raise TransportError(
                f"shm segment header mismatch (magic {s[0]:#x} version {s[1]}, capacity "
                f"{s[2]}, readers {s[3]}); is the peer an incompatible aioengine?")
        return seg

    def close(self) -> None:
        """Unmap. If the caller still holds views from ``recv`` the mapping stays alive until
        they are dropped (the mmap is then freed by the garbage collector): never a dangling
        pointer."""
        for view in (self.words, self.slots, self.data):
            view.release()
        try:
            self._mm.close()
        except BufferError:
            log.debug("shm mapping still referenced by received views; freed when they are")
        with contextlib.suppress(AttributeError):
            del self._mm
