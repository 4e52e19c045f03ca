"""The API app on a loopback ``TestServer`` over a started client, and an ``AsyncOpenAI``
pointed at it: shared by the server tests and the real-model tests."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestServer

from aioengine.server import ServerSettings, create_app


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
