"""Fixtures for the server tests: one real engine (tiny model) shared by the in-process tests,
the app on a loopback ``TestServer`` over it, and an ``AsyncOpenAI`` client pointed at it."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from aiohttp.test_utils import TestServer

from aioengine import AsyncMPClient
from aioengine.server import ServerSettings, create_app
from tests.server.engine_setup import engine_config


# Module scope (not package): the project's leak check runs per module, and an engine started
# in one module and stopped in another would count as that module's leak.
@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
async def engine(anyio_backend: str) -> AsyncIterator[AsyncMPClient]:
    async with AsyncMPClient(engine_config()) as client:
        yield client


@pytest.fixture(scope="module")
async def server(engine: AsyncMPClient) -> AsyncIterator[TestServer]:
    srv = TestServer(create_app(engine, ServerSettings(max_request_bytes=64 * 1024)),
                     host="127.0.0.1")
    await srv.start_server()
    try:
        yield srv
    finally:
        await srv.close()


@pytest.fixture
async def oai(server: TestServer) -> AsyncIterator[object]:
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=str(server.make_url("/v1")), api_key="unused", max_retries=0,
                         timeout=120)
    try:
        yield client
    finally:
        await client.close()
