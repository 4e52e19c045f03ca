"""Record format inside the ring. Everything is 8-byte aligned; cursors count bytes ever
written, so ``cursor % capacity`` is a position and a full ring is ``head - tail == capacity``.

Every record starts with one u64 word ``kind | count << 32``:

``MSG``    a whole message, read in place (zero copy)::
               word0 = MSG | nparts << 32, size (whole record, padded), len[0..nparts)
               then part i (part 0 is the header) at the next 8-byte boundary after part i-1.
``BEGIN``  the start of a message too large for one record; its parts then stream through
           ``CHUNK`` records into the reader's assembly buffer::
               word0 = BEGIN | nparts << 32, size, len[0..nparts)
``CHUNK``  ``word0 = CHUNK, nbytes``, then ``nbytes`` of the message's stream layout (the same
           aligned layout as a ``MSG`` record's parts, so chunks copy straight into place).
``WRAP``   ``word0 = WRAP``: nothing fits before the end of the ring; continue at position 0.

A message that stopped half-way (the writer's send timed out or was cancelled after some
chunks) is simply followed by a non-``CHUNK`` record; the reader drops the partial message.
"""

from __future__ import annotations

MSG, BEGIN, CHUNK, WRAP = 1, 2, 3, 4
FIXED = 16  # word0 + size/nbytes


def pad8(n: int) -> int:
    return (n + 7) & ~7


def stream_layout(lens: list[int]) -> tuple[list[int], int]:
    """Offsets of each part in the aligned stream layout, and the stream's total length."""
    offsets = []
    off = 0
    for n in lens:
        offsets.append(off)
        off = pad8(off + n)
    total = offsets[-1] + lens[-1]
    return offsets, total


def msg_record_size(lens: list[int]) -> int:
    """Bytes of a ``MSG`` record holding parts of these lengths."""
    return FIXED + 8 * len(lens) + pad8(stream_layout(lens)[1])
