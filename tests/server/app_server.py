"""The API app on a loopback ``TestServer`` over a started client, and an ``AsyncOpenAI``
pointed at it: shared by the server tests and the real-model tests."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
from aiohttp import web
from aiohttp.test_utils import TestServer

from aioengine.server import ServerSettings, create_app
from aioengine.server.errors import RefusalLog, error_middleware


@asynccontextmanager
async def serve_app(app: web.Application) -> AsyncIterator[TestServer]:
    """``app`` on a loopback ``TestServer``."""
    srv = TestServer(app, host="127.0.0.1")
    await srv.start_server()
    try:
        yield srv
    finally:
        await srv.close()


@asynccontextmanager
async def app_server(client: Any, settings: ServerSettings | None = None
                     ) -> AsyncIterator[TestServer]:
    async with serve_app(create_app(client, settings)) as srv:
        yield srv


@asynccontextmanager
async def openai_client(server: TestServer) -> AsyncIterator[Any]:
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=str(server.make_url("/v1")), api_key="unused", max_retries=0,
                         timeout=120)
    try:
        yield client
    finally:
        await client.close()


async def post_once(path: str, handler: Any, gate: asyncio.Event, marker: str = "",
                    count: int = 0) -> tuple[int, str]:
    """POST ``{}`` to ``handler`` served at ``path`` (behind the error middleware); read the
    response's lines until ``count`` of them are ``marker``, then set ``gate`` (the handler's
    start waits on it) and read the rest. Returns the status and the whole text."""
    app = web.Application(middlewares=[error_middleware(RefusalLog())])
    app.router.add_post(path, handler)
    async with serve_app(app) as srv, aiohttp.ClientSession() as s, \
            s.post(srv.make_url(path), json={}) as resp:
        lines: list[str] = []
        while count and lines.count(marker) < count:
            lines.append((await resp.content.readline()).decode().rstrip("\n"))
        gate.set()
        return resp.status, "".join(line + "\n" for line in lines) + await resp.text()
