"""The ``Host`` header check against DNS rebinding.

A web page on ``attacker.example`` whose DNS name is re-pointed at 127.0.0.1 talks to a
loopback server as "same origin", so neither CORS nor the loopback bind keeps it out; the
``Host`` header it sends still names ``attacker.example``. A server bound only to loopback
therefore accepts only loopback host names by default.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # aiohttp is imported where the middleware is made: ``python -m
    # aioengine.serve`` uses all_loopback before the server's imports (see auth.py)
    from aiohttp import web
    from aiohttp.typedefs import Middleware

    Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")


def all_loopback(socks: Iterable[socket.socket]) -> bool:
    """Whether every listening socket is bound to a loopback address."""
    return all(ipaddress.ip_address(s.getsockname()[0]).is_loopback for s in socks)


def allowed_hosts_middleware(hosts: Iterable[str]) -> Middleware:
    """400 ``invalid_host`` for a request whose ``Host`` names none of ``hosts`` (names
    without port; ``*`` allows any)."""
    allowed = {h.lower().strip("[]") for h in hosts}

    from aiohttp import web

    from aioengine.server.errors import ApiError

    @web.middleware
    async def check_host(request: web.Request, handler: Handler) -> web.StreamResponse:
        if "*" not in allowed:
            name = (request.url.host or "").lower().strip("[]")
            if name not in allowed:
                raise ApiError(400, f"Host {name!r} is not served here (allowed hosts: "
                               f"{sorted(allowed)}; see --allowed-hosts)", code="invalid_host")
        return await handler(request)

    return check_host
