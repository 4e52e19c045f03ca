"""Pick an implementation by URL scheme and open endpoints.

Every implementation module (``transports.zmq``, ``transports.shm``, ``transports.uds``) exposes
the same eight functions with these signatures; ``address`` is the URL without the scheme
prefix (for zmq the part after ``zmq+``), or ``None`` to pick a private default:

    open_writer(address, *, bind, capacity, connect_timeout) -> SyncWriter
    open_reader(address, *, bind, capacity, connect_timeout) -> SyncReader
    open_broadcast_writer(address, num_readers, *, capacity, connect_timeout) -> SyncWriter
    open_broadcast_reader(address, rank, *, connect_timeout) -> SyncReader
    async open_async_writer(...same as open_writer...) -> AsyncWriter
    async open_async_reader(...same as open_reader...) -> AsyncReader
    async open_async_broadcast_writer(...) -> AsyncWriter
    async open_async_broadcast_reader(...) -> AsyncReader

``capacity`` bounds buffered bytes (or messages, where the wire counts messages) before a writer
blocks. ``connect_timeout`` bounds how long a connecting side waits for the binder, and how long
a binder's first operation waits for its peer(s).
"""

from __future__ import annotations

import importlib
from types import ModuleType

from transports.base import AsyncReader, AsyncWriter, SyncReader, SyncWriter
from transports.errors import AddressError

DEFAULT_CAPACITY = 64 * 1024 * 1024
"""Bytes buffered before a writer blocks (zmq turns it into a message count)."""
DEFAULT_CONNECT_TIMEOUT = 30.0
"""Seconds a connecting side waits for the binder, and a binder's first operation for its
peers."""

_MODULES = {"zmq": "transports.zmq", "shm": "transports.shm", "uds": "transports.uds"}


def transport_names() -> list[str]:
    """The short names accepted as URLs or URL schemes: ``["zmq", "shm", "uds"]``."""
    return list(_MODULES)


def _resolve(url: str) -> tuple[ModuleType, str | None]:
    """Split ``url`` into (implementation module, implementation-specific address or None)."""
    if url in _MODULES:
        return importlib.import_module(_MODULES[url]), None
    scheme, sep, rest = url.partition("://")
    if not sep:
        raise AddressError(f"not a transport URL: {url!r} (expected one of {transport_names()} or "
                           "a URL like zmq+ipc://PATH, zmq+tcp://HOST:PORT, shm://NAME, uds://PATH)")
    kind, _, sub = scheme.partition("+")
    if kind not in _MODULES:
        raise AddressError(f"unknown transport {kind!r} in {url!r}; known: {transport_names()}")
    address = f"{sub}://{rest}" if sub else rest
    if kind == "zmq" and not sub:
        raise AddressError(
            f"zmq URLs need a wire: zmq+ipc://PATH or zmq+tcp://HOST:PORT, got {url!r}")
    return importlib.import_module(_MODULES[kind]), address


def open_writer(url: str, *, bind: bool = True, capacity: int = DEFAULT_CAPACITY,
                connect_timeout: float = DEFAULT_CONNECT_TIMEOUT) -> SyncWriter:
    """A blocking point-to-point writer. ``bind=True`` (default) creates the address (read it
    back from ``.address``); ``bind=False`` connects to a reader that bound ``url``. Raises
    ``AddressError`` for a bad URL, ``TimeoutError`` if a connect does not succeed within
    ``connect_timeout`` seconds."""
    mod, address = _resolve(url)
    return mod.open_writer(address, bind=bind, capacity=capacity, connect_timeout=connect_timeout)


def open_reader(url: str, *, bind: bool = False, capacity: int = DEFAULT_CAPACITY,
                connect_timeout: float = DEFAULT_CONNECT_TIMEOUT) -> SyncReader:
    """A blocking point-to-point reader. ``bind=False`` (default) connects to the writer's
    ``url``; ``bind=True`` creates the address for a writer to connect to."""
    mod, address = _resolve(url)
    return mod.open_reader(address, bind=bind, capacity=capacity, connect_timeout=connect_timeout)


def open_broadcast_writer(url: str, num_readers: int, *, capacity: int = DEFAULT_CAPACITY,
                          connect_timeout: float = DEFAULT_CONNECT_TIMEOUT) -> SyncWriter:
    """A blocking writer whose every message reaches all ``num_readers`` readers (it always
    binds). The first ``send`` waits until every rank has connected; afterwards the writer
    runs at the pace of the slowest reader."""
    mod, address = _resolve(url)
    return mod.open_broadcast_writer(address, num_readers, capacity=capacity,
                                     connect_timeout=connect_timeout)


def open_broadcast_reader(url: str, rank: int, *,
                          connect_timeout: float = DEFAULT_CONNECT_TIMEOUT) -> SyncReader:
    """A blocking reader of a broadcast, connecting to the writer's ``url`` as ``rank``
    (0 to ``num_readers - 1``; a rank out of range or taken twice raises ``AddressError``)."""
    mod, address = _resolve(url)
    return mod.open_broadcast_reader(address, rank, connect_timeout=connect_timeout)


async def open_async_writer(url: str, *, bind: bool = True, capacity: int = DEFAULT_CAPACITY,
                            connect_timeout: float = DEFAULT_CONNECT_TIMEOUT) -> AsyncWriter:
    """The asyncio twin of :func:`open_writer`."""
    mod, address = _resolve(url)
    return await mod.open_async_writer(address, bind=bind, capacity=capacity,
                                       connect_timeout=connect_timeout)


async def open_async_reader(url: str, *, bind: bool = False, capacity: int = DEFAULT_CAPACITY,
                            connect_timeout: float = DEFAULT_CONNECT_TIMEOUT) -> AsyncReader:
    """The asyncio twin of :func:`open_reader`."""
    mod, address = _resolve(url)
    return await mod.open_async_reader(address, bind=bind, capacity=capacity,
                                       connect_timeout=connect_timeout)


async def open_async_broadcast_writer(url: str, num_readers: int, *,
                                      capacity: int = DEFAULT_CAPACITY,
                                      connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
                                      ) -> AsyncWriter:
    """The asyncio twin of :func:`open_broadcast_writer`."""
    mod, address = _resolve(url)
    return await mod.open_async_broadcast_writer(address, num_readers, capacity=capacity,
                                                 connect_timeout=connect_timeout)


async def open_async_broadcast_reader(url: str, rank: int, *,
                                      connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
                                      ) -> AsyncReader:
    """The asyncio twin of :func:`open_broadcast_reader`."""
    mod, address = _resolve(url)
    return await mod.open_async_broadcast_reader(address, rank, connect_timeout=connect_timeout)
