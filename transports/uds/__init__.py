"""The ``uds`` transport: Unix domain stream sockets carrying length-prefixed frames.

Point-to-point is one connection; broadcast is one connection per reader (each sends its rank
on connect) and the writer waits for all of them. Backpressure is the kernel socket buffer
(``SO_SNDBUF`` from ``capacity``) plus at most one half-written message kept in user space.
"""

from transports.uds.aio import (
    open_async_broadcast_reader,
    open_async_broadcast_writer,
    open_async_reader,
    open_async_writer,
)
from transports.uds.sync import (
    open_broadcast_reader,
    open_broadcast_writer,
    open_reader,
    open_writer,
)

__all__ = [
    "open_async_broadcast_reader",
    "open_async_broadcast_writer",
    "open_async_reader",
    "open_async_writer",
    "open_broadcast_reader",
    "open_broadcast_writer",
    "open_reader",
    "open_writer",
]
