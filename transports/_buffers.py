"""Turning caller buffers into flat byte views without copying them."""

from __future__ import annotations

from collections.abc import Sequence

from transports.base import Buffer

# sendmsg(2) takes at most IOV_MAX (1024) pieces; keep room for the frame prefix and header.
MAX_BUFFERS = 1000


def byte_view(buf: Buffer, what: str) -> memoryview:
    """A 1-D unsigned-byte view of ``buf`` (no copy). Tensors and arrays of any item size work
    as long as they are C-contiguous."""
    try:
        view = memoryview(buf)
    except TypeError:
        raise TypeError(f"{what} must be bytes, bytearray or memoryview (a buffer), "
                        f"got {type(buf).__name__}") from None
    if view.format == "B" and view.ndim == 1:
        return view
    if not view.c_contiguous:
        raise ValueError(f"{what} must be C-contiguous to travel without a copy "
                         f"(shape {view.shape}, strides {view.strides})")
    return view.cast("B")


def message_views(header: Buffer, buffers: Sequence[Buffer]) -> tuple[memoryview, list[memoryview]]:
    """Validate one outgoing message and return flat byte views of its parts."""
    if isinstance(buffers, (bytes, bytearray, memoryview)):
        raise TypeError("buffers must be a sequence of buffers, got a single "
                        f"{type(buffers).__name__} (wrap it in a list)")
    if len(buffers) > MAX_BUFFERS:
        raise ValueError(f"a message carries at most {MAX_BUFFERS} buffers, got {len(buffers)}")
    head = byte_view(header, "header")
    return head, [byte_view(b, f"buffers[{i}]") for i, b in enumerate(buffers)]
