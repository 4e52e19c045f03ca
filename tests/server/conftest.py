"""Fixtures for the server tests: one real engine (tiny model) shared by the in-process tests,
the app on a loopback ``TestServer`` over it, and an ``AsyncOpenAI`` client pointed at it."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from aiohttp.test_utils import TestServer

from aioengine import AsyncMPClient
from aioengine.server import ServerSettings
from tests.server.app_server import app_server, openai_client
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
    async with app_server(engine, ServerSettings(max_request_bytes=64 * 1024)) as srv:
        yield srv


@pytest.fixture
async def oai(server: TestServer) -> AsyncIterator[object]:
    async with openai_client(server) as client:
        yield client
