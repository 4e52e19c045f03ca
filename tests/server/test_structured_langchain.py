"""langchain-openai's ``with_structured_output`` (json_schema and json_mode) and the openai SDK's
``.parse()`` against the server on the real model (SmolLM2-135M-Instruct, the session's shared
``python -m aioengine.serve``, tests/smollm2.py): the answers are the right ones, not just
well-formed."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from pydantic import BaseModel

from tests.smollm2 import SMOLLM2

pytestmark = pytest.mark.anyio

QUESTION = "What is the capital of France?"


class City(BaseModel):
    city: str
    country: str


@pytest.fixture
async def chat_model(smollm2_server: str) -> AsyncIterator[Any]:
    """``ChatOpenAI`` at the shared server, with an HTTP client of this test's own: langchain
    keeps one per base URL, bound to the event loop of the first test that used it."""
    from langchain_openai import ChatOpenAI
    from openai import DefaultAsyncHttpxClient

    async with DefaultAsyncHttpxClient() as http:
        yield ChatOpenAI(base_url=smollm2_server + "/v1", api_key="unused", model=SMOLLM2,
                         temperature=0, max_tokens=100, max_retries=0, http_async_client=http)


async def test_langchain_json_schema_gives_the_model(chat_model) -> None:
    structured = chat_model.with_structured_output(City, method="json_schema")
    answer = await structured.ainvoke(QUESTION)
    assert isinstance(answer, City)
    assert answer.city == "Paris" and answer.country.lower() == "france"


async def test_langchain_json_mode_gives_json(chat_model) -> None:
    prompt = f"{QUESTION} Answer in JSON with keys city and country."
    raw = await chat_model.with_structured_output(
        None, method="json_mode", include_raw=True).ainvoke(prompt)
    assert raw["parsing_error"] is None, raw
    assert raw["parsed"]["city"] == "Paris", raw
    typed = await chat_model.with_structured_output(City, method="json_mode").ainvoke(prompt)
    assert typed.city == "Paris"


async def test_openai_parse_on_the_real_model(smollm2_oai) -> None:
    completion = await smollm2_oai.chat.completions.parse(
        model=SMOLLM2, messages=[{"role": "user", "content": QUESTION}], response_format=City,
        temperature=0, max_completion_tokens=100)
    parsed = completion.choices[0].message.parsed
    assert isinstance(parsed, City) and parsed.city == "Paris", completion
