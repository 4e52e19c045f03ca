"""The reading half of the ring (one per reader; broadcast readers each own a tail cursor).

A ``MSG`` record is returned as views straight into the ring and stays there until the next
``recv``, which publishes the tail past it: cancelling or timing out a wait never loses a
message (nothing is consumed until it is handed out). A streamed message is copied chunk by
chunk into an assembly buffer (reused across messages), each chunk freed as soon as copied.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

from transports.base import Message
from transports.errors import TransportError
from transports.shm import segment as S
from transports.shm.ordering import FENCE_EVERY_CURSOR
from transports.shm.records import BEGIN, CHUNK, FIXED, MSG, WRAP, pad8, stream_layout

log = logging.getLogger(__name__)

_MSG1 = MSG | 1 << 32  # word0 of a header-only MSG record


class _Assembly:
    __slots__ = ("got", "lens", "offsets", "total", "view")

    def __init__(self, lens: list[int], view: memoryview) -> None:
        self.lens = lens
        self.offsets, self.total = stream_layout(lens)
        self.view = view
        self.got = 0


class RingReader:
    def __init__(self, seg: S.Segment, rank: int, space_efd: int,
                 fence: Callable[[], None]) -> None:
        self._slots, self._data, self._words = seg.slots, seg.data, seg.words
        self._cap = seg.capacity
        self._tail_slot = S.tail_slot(rank)
        self._sleep_slot = S.reader_sleeping_slot(rank)
        self._closed_slot = S.reader_closed_slot(rank)
        self._space_efd = space_efd
        self._fence = fence
        self._tail = 0  # published consumption (mirror of our tail slot)
        self._next = 0  # read up to here (may include the held message)
        self._pos = 0  # self._next % cap
        self._seen = 0  # last head we loaded
        self._asm: _Assembly | None = None
        self._buf: bytearray | None = None  # assembly storage, reused

    def release(self) -> None:
        """The caller is done with the held message: give its space back to the writer."""
        if self._next != self._tail:
            self._publish_tail()

    def _publish_tail(self) -> None:
        if FENCE_EVERY_CURSOR:
            self._fence()  # our loads of the record before the store that frees it
        self._tail = self._next
        slots = self._slots
        slots[self._tail_slot] = self._tail
        self._fence()  # Dekker with the writer's sleeping flag, as in RingWriter._commit
        want = slots[S.WRITER_SLEEPING]  # 0, or the free bytes the sleeping writer waits for
        if want and self._cap - (slots[S.HEAD] - self._tail) >= want:
            # Every published tail re-checks this, and a reader that runs dry publishes
            # everything before it sleeps (free == capacity >= want): no wake-up is lost.
            slots[S.WRITER_SLEEPING] = 0
            os.eventfd_write(self._space_efd, 1)

    def has_data(self) -> bool:
        """Cheap check for spinning: something new, or the writer closed."""
        slots = self._slots
        return slots[S.HEAD] != self._next or slots[S.WRITER_CLOSED] != 0

    def writer_closed(self) -> bool:
        return self._slots[S.WRITER_CLOSED] != 0

    def next_message(self) -> Message | None:
        """``release()`` then ``poll()``, with the common header-only record inlined."""
        nxt = self._next
        if nxt != self._tail:
            self._publish_tail()
        if nxt == self._seen:
            self._seen = self._slots[S.HEAD]
            if FENCE_EVERY_CURSOR:
                self._fence()
            if nxt == self._seen:
                return None
        pos = self._pos
        w = pos >> 3
        words = self._words
        word = words[w]
        if word != _MSG1:
            if word & 0xFFFFFFFF != MSG or self._asm is not None:
                return self.poll()
            size, nparts = words[w + 1], word >> 32
            if nparts == 0 or not FIXED + 8 * nparts <= size <= min(self._cap - pos,
                                                                     self._seen - nxt):
                raise self._corrupt(f"MSG of {size} bytes with {nparts} parts")
            msg = self._message(pos, nparts, size)
            self._advance(size)
            return msg
        size, n = words[w + 1], words[w + 2]
        if not 24 + n <= size <= min(self._cap - pos, self._seen - nxt):
            raise self._corrupt(f"MSG of {size} bytes with a {n}-byte header")
        self._next = nxt + size
        p = pos + size
        self._pos = 0 if p == self._cap else p
        return Message(self._data[pos + 24:pos + 24 + n], [])

    def poll(self) -> Message | None:
        """The next message, or None if the writer has not published one (yet)."""
        words, cap = self._words, self._cap
        while True:
            nxt = self._next
            if nxt == self._seen:
                self._seen = self._slots[S.HEAD]
                if FENCE_EVERY_CURSOR:
                    self._fence()  # the head load before the record loads
                if nxt == self._seen:
                    return None
            pos = self._pos
            w = pos >> 3
            word = words[w]
            kind = word & 0xFFFFFFFF
            if kind == MSG:
                size = words[w + 1]
                nparts = word >> 32
                if nparts == 0 or not FIXED + 8 * nparts <= size <= min(cap - pos,
                                                                         self._seen - nxt):
                    raise self._corrupt(f"MSG of {size} bytes with {nparts} parts")
                if self._asm is not None:
                    self._drop_partial()
                msg = self._message(pos, nparts, size)
                self._advance(size)
                return msg
            if kind == CHUNK:
                whole = self._chunk(pos)
                if whole is not None:
                    return whole
            elif kind == WRAP:
                self._advance(cap - pos)
            elif kind == BEGIN:
                self._begin(pos, word >> 32)
            else:
                raise self._corrupt(f"unknown record kind {kind}")

    def _message(self, pos: int, nparts: int, size: int) -> Message:
        data = self._data
        first = (pos >> 3) + 2
        lens = self._words[first:first + nparts].tolist()
        p = pos + FIXED + 8 * nparts
        end = pos + size
        views = []
        for n in lens:
            if p + n > end:
                raise self._corrupt(f"parts {lens} overflow a {size}-byte record")
            views.append(data[p:p + n])
            p += (n + 7) & ~7
        return Message(views[0], views[1:])

    def _begin(self, pos: int, nparts: int) -> None:
        w = pos >> 3
        size = self._words[w + 1]
        if not FIXED + 8 * nparts <= size <= self._cap - pos or nparts == 0:
            raise self._corrupt(f"BEGIN of {size} bytes with {nparts} parts")
        if self._asm is not None:
            self._drop_partial()
        lens = self._words[w + 2:w + 2 + nparts].tolist()
        total = stream_layout(lens)[1]
        if self._buf is None or len(self._buf) < total:
            self._buf = None  # let the old one go before allocating the new one
            self._buf = bytearray(total)
        self._asm = _Assembly(lens, memoryview(self._buf))
        self._advance(size)

    def _chunk(self, pos: int) -> Message | None:
        asm = self._asm
        n = self._words[(pos >> 3) + 1]
        size = FIXED + pad8(n)
        if asm is None or n > asm.total - asm.got or size > self._cap - pos:
            raise self._corrupt(f"CHUNK of {n} bytes outside a streamed message")
        src = pos + FIXED
        asm.view[asm.got:asm.got + n] = self._data[src:src + n]
        asm.got += n
        self._advance(size)
        self._publish_tail()  # free the chunk now: the writer may be waiting to stream more
        if asm.got < asm.total:
            return None
        self._asm = None
        views = [asm.view[o:o + n] for o, n in zip(asm.offsets, asm.lens, strict=True)]
        asm.view.release()
        return Message(views[0], views[1:])

    def _advance(self, n: int) -> None:
        self._next += n
        p = self._pos + n
        self._pos = 0 if p == self._cap else p

    def _drop_partial(self) -> None:
        asm = self._asm
        assert asm is not None
        log.debug("shm writer abandoned a streamed message after %d of %d bytes",
                  asm.got, asm.total)
        asm.view.release()
        self._asm = None

    def drop_partial(self) -> None:
        """The writer is gone: a message it left half-streamed will never complete."""
        if self._asm is not None:
            self._drop_partial()

    def _corrupt(self, what: str) -> TransportError:
        return TransportError(f"corrupt shm ring at byte {self._next}: {what}")

    # ---- sleeping ----------------------------------------------------------------------------
    def arm(self) -> bool:
        """Announce we sleep for data; False (flag withdrawn) if data or the writer's close
        turned up meanwhile, in which case the caller must not sleep."""
        if self._next != self._tail:
            self._publish_tail()  # e.g. a WRAP we skipped: the writer may be waiting on it
        slots = self._slots
        slots[self._sleep_slot] = 1
        self._fence()  # Dekker: flag store before re-reading the head
        if slots[S.HEAD] != self._next or slots[S.WRITER_CLOSED]:
            slots[self._sleep_slot] = 0
            return False
        return True

    def disarm(self) -> None:
        self._slots[self._sleep_slot] = 0

    def mark_closed(self) -> None:
        """Tell the writer we are gone and wake it if it waits for our space."""
        self._slots[self._closed_slot] = 1
        self._fence()
        os.eventfd_write(self._space_efd, 1)
