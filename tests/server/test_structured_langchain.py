"""langchain-openai's ``with_structured_output`` (json_schema and json_mode) and the openai SDK's
``.parse()`` against the server on the real model (SmolLM2-135M-Instruct): the answers are
the right ones, not just well-formed."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from aiohttp.test_utils import TestServer
from pydantic import BaseModel

from aioengine import AsyncMPClient, EngineConfig
from tests.models.conftest import SMOLLM2
from tests.server.app_server import app_server, openai_client

pytestmark = pytest.mark.anyio

QUESTION = "What is the capital of France?"


class City(BaseModel):
    city: str
    country: str


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
async def server(anyio_backend: str) -> AsyncIterator[TestServer]:
    async with AsyncMPClient(EngineConfig(model=SMOLLM2, max_model_len=1024)) as client, \
            app_server(client) as srv:
        yield srv


def chat_model(server: TestServer):
    from langchain_openai import ChatOpenAI

    return ChatOpenAI(base_url=str(server.make_url("/v1")), api_key="unused", model=SMOLLM2,
                      temperature=0, max_tokens=100, max_retries=0)


async def test_langchain_json_schema_gives_the_model(server) -> None:
    structured = chat_model(server).with_structured_output(City, method="json_schema")
    answer = await structured.ainvoke(QUESTION)
    assert isinstance(answer, City)
    assert answer.city == "Paris" and answer.country.lower() == "france"


async def test_langchain_json_mode_gives_json(server) -> None:
    prompt = f"{QUESTION} Answer in JSON with keys city and country."
    raw = await chat_model(server).with_structured_output(
        None, method="json_mode", include_raw=True).ainvoke(prompt)
    assert raw["parsing_error"] is None, raw
    assert raw["parsed"]["city"] == "Paris", raw
    typed = await chat_model(server).with_structured_output(City, method="json_mode").ainvoke(
        prompt)
    assert typed.city == "Paris"


async def test_openai_parse_on_the_real_model(server) -> None:
    async with openai_client(server) as oai:
        completion = await oai.chat.completions.parse(
            model=SMOLLM2, messages=[{"role": "user", "content": QUESTION}],
            response_format=City, temperature=0, max_completion_tokens=100)
    parsed = completion.choices[0].message.parsed
    assert isinstance(parsed, City) and parsed.city == "Paris", completion
