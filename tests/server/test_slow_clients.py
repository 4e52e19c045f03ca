"""Slow or half-sent requests do not hold the server: headers past --idle-timeout close the
connection, a body not received in time gets a 408."""

from __future__ import annotations

import asyncio
import socket
import time

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from aioengine.server import create_app
from aioengine.server.body import read_body
from tests.server.server_process import ServerProcess

pytestmark = pytest.mark.anyio


def _closed_within(sock: socket.socket, seconds: float) -> float:
    """Seconds until the server closed ``sock`` (reads return b'')."""
    sock.settimeout(seconds)
    t0 = time.monotonic()
    while sock.recv(4096):
        pass
    return time.monotonic() - t0


def test_half_sent_headers_are_closed_after_the_idle_timeout():
    with ServerProcess("--idle-timeout", "1") as srv:
        host, port = srv.url.rsplit("/", 1)[-1].split(":")
        socks = [socket.create_connection((host, int(port))) for _ in range(20)]
        try:
            for sock in socks:
                sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
            assert all(_closed_within(sock, 30) < 10 for sock in socks)
        finally:
            for sock in socks:
                sock.close()
        import urllib.request

        with urllib.request.urlopen(srv.url + "/health", timeout=30) as resp:
            assert resp.status == 200
        assert srv.terminate() == 0


async def test_a_trickled_body_gets_408(engine):
    from aiohttp import web

    async def echo(request: web.Request) -> web.Response:
        return web.Response(body=await read_body(request, 1 << 20, timeout=0.5))

    app = create_app(engine)
    app.router.add_post("/echo", echo)
    srv = TestServer(app, host="127.0.0.1")
    await srv.start_server()
    try:
        async def trickle():
            yield b'{"prompt": '
            await asyncio.sleep(3)
            yield b'"x"}'

        async with aiohttp.ClientSession() as s, \
                s.post(srv.make_url("/echo"), data=trickle(),
                       headers={"Content-Type": "application/json"}) as r:
            assert r.status == 408
            err = (await r.json())["error"]
            assert err["code"] == "request_timeout" and "within 0.5 s" in err["message"]
    finally:
        await srv.close()


def test_accept_failures_log_once_per_burst_without_traceback():
    import logging

    from aioengine.server.accept_log import AcceptFailureFilter

    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    asyncio_logger = logging.getLogger("asyncio")
    keep, flt = Keep(), AcceptFailureFilter(interval=3600)
    asyncio_logger.addHandler(keep)
    asyncio_logger.addFilter(flt)
    loop = asyncio.new_event_loop()
    try:
        for _ in range(500):  # what asyncio's accept loop reports, as it reports it
            loop.call_exception_handler({
                "message": "socket.accept() out of system resource",
                "exception": OSError(24, "Too many open files")})
        loop.call_exception_handler({"message": "something else"})
    finally:
        loop.close()
        asyncio_logger.removeFilter(flt)
        asyncio_logger.removeHandler(keep)
    accepts = [r for r in records if "socket.accept()" in r.getMessage()]
    assert len(accepts) == 1 and accepts[0].exc_info is None
    assert "Too many open files" in accepts[0].getMessage()
    assert any("something else" in r.getMessage() for r in records)
    assert flt._dropped == 499
