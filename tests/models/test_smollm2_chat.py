"""The OpenAI-compatible server on the real model: chat answers the capital of France, the
model is named by its short name."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from aiohttp.test_utils import TestServer

from aioengine import AsyncMPClient, EngineConfig
from tests.models.conftest import SMOLLM2
from tests.server.app_server import app_server, openai_client

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
async def server(anyio_backend: str) -> AsyncIterator[TestServer]:
    async with AsyncMPClient(EngineConfig(model=SMOLLM2, max_model_len=1024)) as client, \
            app_server(client) as srv:
        yield srv


@pytest.fixture
async def oai(server: TestServer) -> AsyncIterator[object]:
    async with openai_client(server) as client:
        yield client


@pytest.mark.anyio
async def test_chat_answers_paris(oai) -> None:
    reply = await oai.chat.completions.create(model=SMOLLM2, messages=QUESTION, max_tokens=32,
                                              temperature=0)
    assert "Paris" in reply.choices[0].message.content
    assert reply.choices[0].finish_reason == "stop" and reply.model == SMOLLM2


@pytest.mark.anyio
async def test_streamed_chat_answers_paris(oai) -> None:
    stream = await oai.chat.completions.create(model=SMOLLM2, messages=QUESTION, max_tokens=32,
                                               temperature=0, stream=True)
    text = "".join([chunk.choices[0].delta.content or "" async for chunk in stream
                    if chunk.choices])
    assert text.strip() == "The capital of France is Paris."


@pytest.mark.anyio
async def test_models_shows_the_short_name(oai) -> None:
    models = await oai.models.list()
    assert [m.id for m in models.data] == [SMOLLM2]
    assert "/" not in models.data[0].model_dump().get("root", "")
