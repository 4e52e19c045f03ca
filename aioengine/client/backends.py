"""Choosing the client's event-loop objects, once per client in ``start()``: asyncio's own
(``asyncio_backend``: today's objects on the hot path, unchanged), or trio's (``trio_backend``,
imported only under trio). What a backend provides: ``backend_types``.

``current_backend()`` asks sniffio which library runs the calling task (uvloop reports
"asyncio"). ``check_transport()`` refuses, by name, a transport whose async endpoints have no
driver for that library (``has_driver``).
"""

from __future__ import annotations

import asyncio

import sniffio

from aioengine.client.asyncio_backend import AsyncioBackend
from aioengine.client.backend_types import Backend
from transports import async_backends

BACKENDS = ("asyncio", "trio")


def has_driver(transport: str, backend: str) -> bool:
    """True when ``transport``'s async endpoints run on ``backend`` (the transport package says:
    ``transports.async_backends``; today every transport runs on asyncio and trio)."""
    return backend in async_backends(transport)


def check_transport(transport: str, backend: str) -> None:
    """``ValueError`` naming the transport when its async endpoints cannot run on ``backend``
    (a transport without a trio driver, under trio)."""
    if not has_driver(transport, backend):
        raise ValueError(
            f"transport {transport!r} has no {backend} driver yet: under {backend} the client "
            f"needs a transport that has one (transport='shm', the default), or run it under "
            f"asyncio")


def current_backend() -> Backend:
    """The backend of the calling task's event loop: ``RuntimeError`` outside one, or on a
    library the client does not support."""
    try:
        library = sniffio.current_async_library()
    except sniffio.AsyncLibraryNotFoundError:
        raise RuntimeError("the client must be started from a running event loop "
                           f"(one of {', '.join(BACKENDS)})") from None
    if library == "asyncio":
        return AsyncioBackend(asyncio.get_running_loop())
    if library == "trio":
        from aioengine.client.trio_backend import TrioBackend
        return TrioBackend()
    raise RuntimeError(f"the client runs under asyncio (or uvloop) or trio, not under "
                       f"{library!r}")
