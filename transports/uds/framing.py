"""The uds wire format and a sans-IO frame reader.

A frame is a fixed 8-byte prefix ``<II`` (header length, buffer count), then one ``<Q`` length
per buffer, then the header bytes, then each buffer's bytes. The reader fills a reusable chunk
for small frames (many per recv) and gives a large frame its own allocation that the socket
reads straight into, so a big payload is copied once: kernel to its final place.
"""

from __future__ import annotations

import struct

from transports._buffers import MAX_BUFFERS
from transports.base import Message
from transports.errors import TransportError

PREFIX = struct.Struct("<II")
MAX_BUFFER_BYTES = 1 << 40  # sanity bound: a larger length means a corrupt stream
CHUNK = 256 * 1024


def frame_parts(header: memoryview, buffers: list[memoryview]) -> list[memoryview]:
    """The pieces to pass to sendmsg for one frame (the prefix is the only new bytes)."""
    prefix = PREFIX.pack(len(header), len(buffers))
    if buffers:
        prefix += struct.pack(f"<{len(buffers)}Q", *(len(b) for b in buffers))
    parts = [memoryview(prefix)]
    if len(header):
        parts.append(header)
    parts.extend(b for b in buffers if len(b))
    return parts


class MalformedStreamError(TransportError):
    """The byte stream does not follow the frame format; the connection cannot be resynced."""


class FrameReader:
    """Sans-IO: call ``read_target()`` for where to ``recv_into``, ``commit(n)`` after it, and
    ``next_message()`` until it returns None. Views in a returned message are valid until the
    next call of ``next_message()``."""

    def __init__(self, chunk: int = CHUNK) -> None:
        self._buf = bytearray(chunk)
        self._view = memoryview(self._buf)
        self._start = 0
        self._end = 0
        self._big: bytearray | None = None  # a frame larger than the chunk, being filled
        self._big_filled = 0
        self._big_layout: tuple[int, list[int]] | None = None

    def has_partial(self) -> bool:
        return self._big is not None or self._end > self._start

    def read_target(self) -> memoryview:
        if self._big is not None:
            return memoryview(self._big)[self._big_filled:]
        if self._start == self._end:
            self._start = self._end = 0
        elif self._end == len(self._buf) or self._start > len(self._buf) // 2:
            size = self._end - self._start
            self._buf[:size] = self._buf[self._start:self._end]  # same-size move: views stay valid
            self._start, self._end = 0, size
        return self._view[self._end:]

    def commit(self, n: int) -> None:
        if self._big is not None:
            self._big_filled += n
        else:
            self._end += n

    def next_message(self) -> Message | None:
        if self._big is not None:
            if self._big_filled < len(self._big):
                return None
            big, layout = self._big, self._big_layout
            self._big, self._big_layout = None, None
            assert layout is not None
            return _slice(memoryview(big), 0, *layout)
        avail = self._end - self._start
        if avail < PREFIX.size:
            return None
        header_len, nbufs = PREFIX.unpack_from(self._buf, self._start)
        if nbufs > MAX_BUFFERS:
            raise MalformedStreamError(f"malformed frame: {nbufs} buffers (at most {MAX_BUFFERS})")
        lens_end = PREFIX.size + 8 * nbufs
        if avail < lens_end:
            if lens_end > len(self._buf):
                raise MalformedStreamError(f"malformed frame: prefix of {lens_end} bytes")
            return None
        lengths = list(struct.unpack_from(f"<{nbufs}Q", self._buf, self._start + PREFIX.size))
        for n in lengths:
            if n > MAX_BUFFER_BYTES:
                raise MalformedStreamError(f"malformed frame: buffer length {n} is implausible")
        total = lens_end + header_len + sum(lengths)
        if avail >= total:
            msg = _slice(self._view, self._start + lens_end, header_len, lengths)
            self._start += total
            return msg
        if total > len(self._buf):
            # Too big for the chunk: give it its own buffer and read the rest straight into it.
            body = total - lens_end
            have = avail - lens_end
            self._big = bytearray(body)
            self._big[:have] = self._view[self._start + lens_end:self._end]
            self._big_filled = have
            self._big_layout = (header_len, lengths)
            self._start = self._end = 0
        return None


def _slice(view: memoryview, offset: int, header_len: int, lengths: list[int]) -> Message:
    header = view[offset:offset + header_len]
    offset += header_len
    buffers = []
    for n in lengths:
        buffers.append(view[offset:offset + n])
        offset += n
    return Message(header, buffers)
