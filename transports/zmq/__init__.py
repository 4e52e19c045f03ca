"""The ``zmq`` transport: pyzmq PUSH/PULL for point-to-point, XPUB/SUB for broadcast.

Each endpoint owns a zmq context and a monitor socket (peer connected, peer gone). High-water
marks are explicit (``capacity`` / 64 KiB messages per side, 1..1000); large frames travel
zero-copy; a broadcast's first send waits until every rank has subscribed.
"""

from transports.zmq.aio import (
    open_async_broadcast_reader,
    open_async_broadcast_writer,
    open_async_reader,
    open_async_writer,
)
from transports.zmq.sync import (
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
