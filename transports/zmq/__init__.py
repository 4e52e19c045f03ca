"""The ``zmq`` transport: pyzmq PUSH/PULL for point-to-point, XPUB/SUB for broadcast.

Each endpoint owns a zmq context and a monitor socket (peer connected, peer gone). High-water
marks are explicit (``capacity`` / 64 KiB messages per side, 1..1000); large frames travel
zero-copy; a broadcast's first send waits until every rank has subscribed.
"""

# The eight openers every implementation exposes (see transports.factory), re-exported.
from transports.zmq.open_async import open_async_broadcast_reader as open_async_broadcast_reader
from transports.zmq.open_async import open_async_broadcast_writer as open_async_broadcast_writer
from transports.zmq.open_async import open_async_reader as open_async_reader
from transports.zmq.open_async import open_async_writer as open_async_writer
from transports.zmq.sync import open_broadcast_reader as open_broadcast_reader
from transports.zmq.sync import open_broadcast_writer as open_broadcast_writer
from transports.zmq.sync import open_reader as open_reader
from transports.zmq.sync import open_writer as open_writer
