"""The ``uds`` transport: Unix domain stream sockets carrying length-prefixed frames.

Point-to-point is one connection; broadcast is one connection per reader (each sends its rank
on connect) and the writer waits for all of them. Backpressure is the kernel socket buffer
(``SO_SNDBUF`` from ``capacity``) plus at most one half-written message kept in user space.
"""

# The eight openers every implementation exposes (see transports.factory), re-exported.
from transports.uds.open_async import open_async_broadcast_reader as open_async_broadcast_reader
from transports.uds.open_async import open_async_broadcast_writer as open_async_broadcast_writer
from transports.uds.open_async import open_async_reader as open_async_reader
from transports.uds.open_async import open_async_writer as open_async_writer
from transports.uds.sync import open_broadcast_reader as open_broadcast_reader
from transports.uds.sync import open_broadcast_writer as open_broadcast_writer
from transports.uds.sync import open_reader as open_reader
from transports.uds.sync import open_writer as open_writer
