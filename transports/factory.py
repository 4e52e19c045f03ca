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
blocks; the factory's ``capacity=None`` passes the transport's default (``DEFAULT_CAPACITIES``).
``connect_timeout`` bounds how long a connecting side waits for the binder, and how long a
binder's first operation waits for its peer(s).
"""

from __future__ import annotations

import importlib
from typing import Protocol, cast

from transports.base import AsyncReader, AsyncWriter, SyncReader, SyncWriter
from transports.errors import AddressError

DEFAULT_CAPACITY = 64 * 1024 * 1024
"""Bytes buffered before a writer blocks, for zmq (which turns it into a message count) and uds
(which caps the kernel's part at 4 MiB)."""
SHM_DEFAULT_CAPACITY = 16 * 1024 * 1024
"""shm's ring size. The ring is committed memory, pre-faulted when created so that no page
fault lands on the hot path; 16 MiB holds any message up to 8 MiB as one zero-copy record
(larger ones stream through it) without pinning 64 MiB per channel."""
DEFAULT_CAPACITIES = {"zmq": DEFAULT_CAPACITY, "shm": SHM_DEFAULT_CAPACITY,
                      "uds": DEFAULT_CAPACITY}
"""What ``capacity=None`` (the default) means for each transport."""
DEFAULT_CONNECT_TIMEOUT = 30.0
"""Seconds a connecting side waits for the binder, and a binder's first operation for its
peers."""

_MODULES = {"zmq": "transports.zmq", "shm": "transports.shm", "uds": "transports.uds"}


class _Implementation(Protocol):
    """What every implementation module provides (the eight functions above)."""

    __name__: str

    def open_writer(self, address: str | None, *, bind: bool, capacity: int,
                    connect_timeout: float) -> SyncWriter: ...
    def open_reader(self, address: str | None, *, bind: bool, capacity: int,
                    connect_timeout: float) -> SyncReader: ...
    def open_broadcast_writer(self, address: str | None, num_readers: int, *, capacity: int,
                              connect_timeout: float) -> SyncWriter: ...
    def open_broadcast_reader(self, address: str | None, rank: int, *,
                              connect_timeout: float) -> SyncReader: ...
    async def open_async_writer(self, address: str | None, *, bind: bool, capacity: int,
                                connect_timeout: float) -> AsyncWriter: ...
    async def open_async_reader(self, address: str | None, *, bind: bool, capacity: int,
                                connect_timeout: float) -> AsyncReader: ...
    async def open_async_broadcast_writer(self, address: str | None, num_readers: int, *,
                                          capacity: int, connect_timeout: float
                                          ) -> AsyncWriter: ...
    async def open_async_broadcast_reader(self, address: str | None, rank: int, *,
                                          connect_timeout: float) -> AsyncReader: ...


def transport_names() -> list[str]:
    """The short names accepted as URLs or URL schemes: ``["zmq", "shm", "uds"]``."""
    return list(_MODULES)


ASYNC_BACKENDS = ("asyncio", "trio")
"""The event loops an implementation's ``open_async_*`` endpoints run on, when it names none
(``ASYNC_BACKENDS`` in its module): asyncio (uvloop included) through its asyncio driver, trio
through its anyio driver."""


def async_backends(url: str) -> tuple[str, ...]:
    """The event loops (``sniffio`` names: ``"asyncio"``, ``"trio"``) on which the async
    endpoints of ``url``'s transport work. Raises ``AddressError`` for a bad URL."""
    mod = _resolve(url)[0]
    backends: tuple[str, ...] = getattr(mod, "ASYNC_BACKENDS", ASYNC_BACKENDS)
    return backends


def default_capacity(url: str) -> int:
    """The capacity a writer opened on ``url`` gets when none is given."""
    return _capacity(_resolve(url)[0], None)


def _capacity(mod: _Implementation, capacity: int | None) -> int:
    """``capacity``, or the transport's default for None (validated by the implementation)."""
    if capacity is None:
        return DEFAULT_CAPACITIES[mod.__name__.rpartition(".")[2]]
    return capacity


def _resolve(url: str) -> tuple[_Implementation, str | None]:
    """Split ``url`` into (implementation module, implementation-specific address or None)."""
    if url in _MODULES:
        return _implementation(url), None
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
    return _implementation(kind), address


def _implementation(kind: str) -> _Implementation:
    return cast(_Implementation, importlib.import_module(_MODULES[kind]))


def open_writer(url: str, *, bind: bool = True, capacity: int | None = None,
                connect_timeout: float = DEFAULT_CONNECT_TIMEOUT) -> SyncWriter:
    """A blocking point-to-point writer. ``bind=True`` (default) creates the address (read it
    back from ``.address``); ``bind=False`` connects to a reader that bound ``url``. Raises
    ``AddressError`` for a bad URL, ``TimeoutError`` if a connect does not succeed within
    ``connect_timeout`` seconds."""
    mod, address = _resolve(url)
    return mod.open_writer(address, bind=bind, capacity=_capacity(mod, capacity),
                           connect_timeout=connect_timeout)


def open_reader(url: str, *, bind: bool = False, capacity: int | None = None,
                connect_timeout: float = DEFAULT_CONNECT_TIMEOUT) -> SyncReader:
    """A blocking point-to-point reader. ``bind=False`` (default) connects to the writer's
    ``url``; ``bind=True`` creates the address for a writer to connect to."""
    mod, address = _resolve(url)
    return mod.open_reader(address, bind=bind, capacity=_capacity(mod, capacity),
                           connect_timeout=connect_timeout)


def open_broadcast_writer(url: str, num_readers: int, *, capacity: int | None = None,
                          connect_timeout: float = DEFAULT_CONNECT_TIMEOUT) -> SyncWriter:
    """A blocking writer whose every message reaches all ``num_readers`` readers (it always
    binds). The first ``send`` waits until every rank has connected; afterwards the writer
    runs at the pace of the slowest reader."""
    mod, address = _resolve(url)
    return mod.open_broadcast_writer(address, num_readers, capacity=_capacity(mod, capacity),
                                     connect_timeout=connect_timeout)


def open_broadcast_reader(url: str, rank: int, *,
                          connect_timeout: float = DEFAULT_CONNECT_TIMEOUT) -> SyncReader:
    """A blocking reader of a broadcast, connecting to the writer's ``url`` as ``rank``
    (0 to ``num_readers - 1``; a rank out of range or taken twice raises ``AddressError``)."""
    mod, address = _resolve(url)
    return mod.open_broadcast_reader(address, rank, connect_timeout=connect_timeout)


async def open_async_writer(url: str, *, bind: bool = True, capacity: int | None = None,
                            connect_timeout: float = DEFAULT_CONNECT_TIMEOUT) -> AsyncWriter:
    """The asyncio twin of :func:`open_writer`."""
    mod, address = _resolve(url)
    return await mod.open_async_writer(address, bind=bind, capacity=_capacity(mod, capacity),
                                       connect_timeout=connect_timeout)


async def open_async_reader(url: str, *, bind: bool = False, capacity: int | None = None,
                            connect_timeout: float = DEFAULT_CONNECT_TIMEOUT) -> AsyncReader:
    """The asyncio twin of :func:`open_reader`."""
    mod, address = _resolve(url)
    return await mod.open_async_reader(address, bind=bind, capacity=_capacity(mod, capacity),
                                       connect_timeout=connect_timeout)


async def open_async_broadcast_writer(url: str, num_readers: int, *,
                                      capacity: int | None = None,
                                      connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
                                      ) -> AsyncWriter:
    """The asyncio twin of :func:`open_broadcast_writer`."""
    mod, address = _resolve(url)
    return await mod.open_async_broadcast_writer(address, num_readers,
                                                 capacity=_capacity(mod, capacity),
                                                 connect_timeout=connect_timeout)


async def open_async_broadcast_reader(url: str, rank: int, *,
                                      connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
                                      ) -> AsyncReader:
    """The asyncio twin of :func:`open_broadcast_reader`."""
    mod, address = _resolve(url)
    return await mod.open_async_broadcast_reader(address, rank, connect_timeout=connect_timeout)
