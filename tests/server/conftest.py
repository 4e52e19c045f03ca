"""Fixtures for the server tests: one real engine (tiny model) shared by the in-process tests,
the app on a loopback ``TestServer`` over it, and an ``AsyncOpenAI`` client pointed at it."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from aiohttp.test_utils import TestServer

from aioengine import AsyncMPClient
from aioengine.server import ServerSettings
from tests.server.app_server import app_server, openai_client
from tests.server.engine_setup import engine_config, long_engine_config


# Package scope: one engine for the ~17 modules that use it (a start costs ~3 s on the 2-core
# box, ~8 s when loaded). The leak check counts a package fixture's processes as long-lived
# (tests/conftest.py), and the tests read the engine's counters as deltas, so modules do not
# see each other. A module with an engine of its own settings defines ``engine`` itself.
@pytest.fixture(scope="package")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="package")
async def engine(anyio_backend: str) -> AsyncIterator[AsyncMPClient]:
    async with AsyncMPClient(engine_config()) as client:
        yield client


@pytest.fixture(scope="package")
async def long_engine(anyio_backend: str) -> AsyncIterator[AsyncMPClient]:
    """An engine with tiny's whole context, for the tests that must abort a request while it
    certainly still decodes (engine_setup.LONG_TOKENS). Started once, on first use; its tests
    read its counters as deltas and wait for it to be idle, as with ``engine``."""
    async with AsyncMPClient(long_engine_config()) as client:
        yield client


@pytest.fixture(scope="module")
async def server(engine: AsyncMPClient) -> AsyncIterator[TestServer]:
    async with app_server(engine, ServerSettings(max_request_bytes=64 * 1024)) as srv:
        yield srv


@pytest.fixture
async def oai(server: TestServer) -> AsyncIterator[object]:
    async with openai_client(server) as client:
        yield client
