"""The writing half of the ring: places records, publishes the head cursor, wakes sleepers.

Non-blocking: ``pump()`` moves the pending message as far as free space allows and says whether
it is done; the endpoint decides how to wait (spin, poll, event loop) in between. There is one
writer per ring, so no atomics beyond single 8-byte stores are needed (see ``ordering``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

from transports._buffers import MAX_BUFFERS, message_views
from transports.base import Buffer
from transports.shm import segment as S
from transports.shm.ordering import BIG_RECORD, FENCE_EVERY_CURSOR
from transports.shm.records import BEGIN, CHUNK, FIXED, MSG, WRAP, pad8, stream_layout

_MSG1 = MSG | 1 << 32  # word0 of a header-only MSG record


class _Out:
    """The message being sent. ``sent`` counts stream bytes already in ``CHUNK`` records."""

    __slots__ = ("begun", "lens", "offsets", "part", "parts", "sent", "size", "total")

    def __init__(self, parts: list[memoryview], lens: list[int], size: int) -> None:
        self.parts, self.lens, self.size = parts, lens, size
        self.offsets: list[int] = []
        self.total = self.sent = self.part = 0
        self.begun = False


class RingWriter:
    def __init__(self, seg: S.Segment, wake: Sequence[tuple[int, int]],
                 fence: Callable[[], None]) -> None:
        self._slots, self._data, self._words = seg.slots, seg.data, seg.words
        self._cap = cap = seg.capacity
        # Messages up to half the ring are one record, read in place; larger ones stream.
        self._max_record = cap // 2
        self._chunk = (cap // 4) & ~7
        self._tails = [S.tail_slot(r) for r in range(seg.num_readers)]
        self._closed = [S.reader_closed_slot(r) for r in range(seg.num_readers)]
        self._wake = list(wake)  # (reader_sleeping slot, that reader's eventfd)
        self._fence = fence
        self._head = 0  # bytes published (mirror of slots[HEAD])
        self._pos = 0  # self._head % cap
        self._limit = cap  # cached slowest tail + cap: head may grow up to here
        self._need = 0  # bytes the pending step waits for
        self._out: _Out | None = None

    # ---- the hot path ------------------------------------------------------------------------
    def put_now(self, header: object, buffers: Sequence[object]) -> bool:
        """Publish a message of plain byte parts (bytes, bytearray, flat byte memoryviews) in
        one record if it fits right now. False means nothing was written: anything unusual
        (other buffer types, bad input, a streamed size, a full ring, the ring's end) is left
        to ``start``/``pump``, which validate properly."""
        if not buffers:
            kind = type(header)
            # bytes, or a flat byte view such as a received header being forwarded
            if kind is bytes or (kind is memoryview and header.format == "B"  # type: ignore
                                 and header.ndim == 1 and header.c_contiguous):  # type: ignore
                return self._put_header(header)  # type: ignore[arg-type]
        if buffers:
            if (type(buffers) is not list and type(buffers) is not tuple) \
                    or len(buffers) > MAX_BUFFERS:
                return False
            parts = [header, *buffers]
        else:
            parts = [header]
        body = 0
        lens = []
        for part in parts:
            kind = type(part)
            if kind is not bytes and kind is not bytearray and not (
                    kind is memoryview and part.format == "B" and part.ndim == 1
                    and part.c_contiguous):
                return False
            n = len(part)
            lens.append(n)
            body += (n + 7) & ~7
        nparts = len(parts)
        size = FIXED + 8 * nparts + body
        pos = self._pos
        if size > self._max_record or pos + size > self._cap:
            return False
        if self._head + size > self._limit:
            self._refresh()
            if self._head + size > self._limit:
                return False
        words, data, w = self._words, self._data, pos >> 3
        words[w] = MSG | nparts << 32
        words[w + 1] = size
        p = pos + FIXED + 8 * nparts
        for k in range(nparts):
            n = lens[k]
            words[w + 2 + k] = n
            data[p:p + n] = parts[k]
            p += (n + 7) & ~7
        self._commit(pos, size, size >= BIG_RECORD)
        return True

    def _put_header(self, header: bytes | memoryview) -> bool:
        """``put_now`` for the commonest message: one header, nothing else."""
        n = len(header)
        size = 24 + ((n + 7) & ~7)
        pos = self._pos
        if size > self._max_record or pos + size > self._cap:
            return False
        head = self._head
        if head + size > self._limit:
            self._refresh()
            if head + size > self._limit:
                return False
        words, w = self._words, pos >> 3
        words[w] = _MSG1
        words[w + 1] = size
        words[w + 2] = n
        self._data[pos + 24:pos + 24 + n] = header
        self._commit(pos, size, size >= BIG_RECORD)
        return True

    # ---- the pending message -----------------------------------------------------------------
    def start(self, header: Buffer, buffers: Sequence[Buffer]) -> None:
        """Validate and stage one message (raises TypeError/ValueError on bad input)."""
        head, bufs = message_views(header, buffers)
        if bufs:
            parts = [head, *bufs]
            lens = [len(p) for p in parts]
            offsets, total = stream_layout(lens)
            size = FIXED + 8 * len(lens) + pad8(total)
        else:
            parts, lens = [head], [len(head)]
            offsets, total = [0], lens[0]
            size = FIXED + 8 + pad8(total)
        out = _Out(parts, lens, size)
        if size > self._max_record:
            begin = FIXED + 8 * len(lens)
            if begin > self._max_record:
                raise ValueError(f"a message with {len(lens)} parts needs a {begin}-byte "
                                 f"descriptor, more than half the {self._cap}-byte shm ring; "
                                 "use fewer buffers or a larger capacity")
            out.offsets, out.total, out.size = offsets, total, begin
        self._out = out

    def abandon(self) -> None:
        """Drop the pending message (timeout, cancellation). If some chunks are already out,
        the reader discards them when the next record is not a ``CHUNK``."""
        self._out = None

    def pump(self) -> bool:
        """Publish as much of the pending message as fits; True once all of it is out."""
        out = self._out
        assert out is not None
        if not out.offsets:
            if not self._put_msg(out):
                return False
        else:
            if not out.begun:
                if not self._put_descriptor(out, BEGIN):
                    return False
                out.begun = True
            while out.sent < out.total:
                if not self._put_chunk(out):
                    return False
        self._out = None
        return True

    # ---- space -------------------------------------------------------------------------------
    def _refresh(self) -> None:
        slots = self._slots
        self._limit = min(slots[t] for t in self._tails) + self._cap
        if FENCE_EVERY_CURSOR:
            self._fence()  # see tails before reusing the space they free

    def _fits(self, n: int) -> bool:
        if self._head + n <= self._limit:
            return True
        self._refresh()
        if self._head + n <= self._limit:
            return True
        self._need = n
        return False

    def has_space(self) -> bool:
        """Whether the step ``pump`` last waited for can proceed now (re-reads the tails)."""
        self._refresh()
        return self._head + self._need <= self._limit

    def free_bytes(self) -> int:
        self._refresh()
        return self._limit - self._head

    @property
    def need(self) -> int:
        return self._need

    def _reserve(self, size: int) -> int:
        """Position for a ``size``-byte record, or -1 if the readers must free space first."""
        pos = self._pos
        if pos + size > self._cap:
            # Too little room before the end: a WRAP record covers it, published on its own
            # so that any record up to the whole ring fits at 0 once the readers catch up.
            waste = self._cap - pos
            if not self._fits(waste):
                return -1
            self._words[pos >> 3] = WRAP
            self._commit(pos, waste, False)
            pos = 0
        return pos if self._fits(size) else -1

    # ---- records -----------------------------------------------------------------------------
    def _put_msg(self, out: _Out) -> bool:
        size = out.size
        pos = self._reserve(size)
        if pos < 0:
            return False
        words, data, parts, lens = self._words, self._data, out.parts, out.lens
        w = pos >> 3
        words[w] = MSG | len(parts) << 32
        words[w + 1] = size
        if len(parts) == 1:
            n = lens[0]
            words[w + 2] = n
            data[pos + 24:pos + 24 + n] = parts[0]
        else:
            for k, n in enumerate(lens):
                words[w + 2 + k] = n
            p = pos + FIXED + 8 * len(lens)
            for part, n in zip(parts, lens, strict=True):
                data[p:p + n] = part
                p += pad8(n)
        self._commit(pos, size, size >= BIG_RECORD)
        return True

    def _put_descriptor(self, out: _Out, kind: int) -> bool:
        pos = self._reserve(out.size)
        if pos < 0:
            return False
        words, w = self._words, pos >> 3
        words[w] = kind | len(out.lens) << 32
        words[w + 1] = out.size
        for k, n in enumerate(out.lens):
            words[w + 2 + k] = n
        self._commit(pos, out.size, False)
        return True

    def _put_chunk(self, out: _Out) -> bool:
        n = min(self._chunk, out.total - out.sent)
        size = FIXED + pad8(n)
        pos = self._reserve(size)
        if pos < 0:
            return False
        self._words[pos >> 3] = CHUNK
        self._words[(pos >> 3) + 1] = n
        self._copy_stream(out, out.sent, n, pos + FIXED)
        out.sent += n
        self._commit(pos, size, size >= BIG_RECORD)
        return True

    def _copy_stream(self, out: _Out, start: int, n: int, dst: int) -> None:
        """Copy stream bytes [start, start+n) of ``out`` to ring position ``dst`` (padding
        between parts is skipped; the reader never looks at it)."""
        end, data = start + n, self._data
        i = out.part
        while i < len(out.parts):
            off, ln = out.offsets[i], out.lens[i]
            if off >= end:
                break
            a, b = max(start, off), min(end, off + ln)
            if a < b:
                data[dst + a - start:dst + b - start] = out.parts[i][a - off:b - off]
            if off + ln > end:
                break
            i += 1
        out.part = i

    def _commit(self, pos: int, size: int, big: bool) -> None:
        """Publish a record written at ``pos``: one 8-byte store of the head, then wake any
        reader that announced it is going to sleep."""
        if big or FENCE_EVERY_CURSOR:
            self._fence()  # payload stores (maybe weakly ordered) before the cursor store
        self._head += size
        p = pos + size
        self._pos = 0 if p == self._cap else p
        slots = self._slots
        slots[S.HEAD] = self._head
        # Dekker: our head store must be visible before we read the sleeping flags; the
        # reader stores its flag, fences, then re-reads the head. One of us sees the other.
        self._fence()
        for slot, fd in self._wake:
            if slots[slot]:
                # Any clear of a flag is followed by a wake, so a reader sleeping with its
                # flag cleared by us always has a wake-up pending.
                slots[slot] = 0
                os.eventfd_write(fd, 1)

    # ---- liveness ----------------------------------------------------------------------------
    def closed_reader(self) -> int | None:
        """The rank of a reader that closed its end, if any."""
        slots = self._slots
        for rank, slot in enumerate(self._closed):
            if slots[slot]:
                return rank
        return None

    def arm(self) -> bool:
        """Announce we sleep for space; False (announcement withdrawn) if space or a closed
        reader turned up meanwhile, in which case the caller must not sleep."""
        slots = self._slots
        # Ask to be woken only once a quarter of the ring (or what we need) is free, so a
        # writer outpacing its reader refills in batches instead of a wake-up per message.
        slots[S.WRITER_SLEEPING] = max(self._need, self._cap // 4)
        self._fence()  # Dekker: flag store before re-reading the tails
        if self.has_space() or self.closed_reader() is not None:
            slots[S.WRITER_SLEEPING] = 0
            return False
        return True

    def disarm(self) -> None:
        self._slots[S.WRITER_SLEEPING] = 0

    def mark_closed(self) -> None:
        """Tell every reader we are gone (they drain what is left first), and wake them."""
        self._slots[S.WRITER_CLOSED] = 1
        self._fence()
        for _, fd in self._wake:
            os.eventfd_write(fd, 1)
