"""transports: asyncio-native IPC with one contract and three implementations.

Chosen by URL: ``zmq+ipc:///path``, ``zmq+tcp://127.0.0.1:0``, ``shm://name``, ``uds:///path``
or ``uds://@abstract-name``; the short names ``zmq``, ``shm`` and ``uds`` pick a private
default address. The binding side's ``endpoint.address`` is the URL the peer connects to.

This package stands alone: it never imports torch or aioengine.
"""

from transports.base import (
    AsyncReader,
    AsyncWriter,
    Buffer,
    Endpoint,
    Message,
    SyncReader,
    SyncWriter,
)
from transports.errors import (
    AddressError,
    ChannelClosedError,
    DecodeError,
    PeerClosedError,
    TransportError,
)
from transports.factory import (
    async_backends,
    open_async_broadcast_reader,
    open_async_broadcast_writer,
    open_async_reader,
    open_async_writer,
    open_broadcast_reader,
    open_broadcast_writer,
    open_reader,
    open_writer,
    transport_names,
)

__all__ = [
    "AddressError",
    "AsyncReader",
    "AsyncWriter",
    "Buffer",
    "ChannelClosedError",
    "DecodeError",
    "Endpoint",
    "Message",
    "PeerClosedError",
    "SyncReader",
    "SyncWriter",
    "TransportError",
    "async_backends",
    "open_async_broadcast_reader",
    "open_async_broadcast_writer",
    "open_async_reader",
    "open_async_writer",
    "open_broadcast_reader",
    "open_broadcast_writer",
    "open_reader",
    "open_writer",
    "transport_names",
]
