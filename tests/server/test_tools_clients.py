"""Tool calling from the clients apps use, against a real ``python -m aioengine.serve`` on the
tiny model: langchain-openai's ``bind_tools`` (whole and streamed) and
``with_structured_output(method="function_calling")``, and litellm's ``completion``. The tiny
model's weights are random, so only the grammar makes these calls valid."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import jsonschema
import pytest
from pydantic import BaseModel, Field

from tests.server.server_process import ServerProcess
from tests.server.test_tools import MESSAGES, TOOLS, WEATHER

# litellm reads its model price list from the network at import unless told not to.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    srv = ServerProcess("--max-model-len", "2048", "--num-kv-blocks", "1024")
    try:
        yield srv
    finally:
        assert srv.terminate() == 0


def chat_model(server: ServerProcess, **kwargs: Any) -> Any:
    from langchain_openai import ChatOpenAI

    return ChatOpenAI(model="tiny", base_url=server.url + "/v1", api_key="unused",
                      max_retries=0, timeout=120, max_tokens=400, **kwargs)


class Weather(BaseModel):
    """Weather forecast for a city."""

    city: str = Field(max_length=12, description="the city")
    days: int = Field(ge=1, le=7)


def test_langchain_bind_tools_required_and_named(server: ServerProcess) -> None:
    llm = chat_model(server, seed=1)
    for choice in ("any", "get_weather"):  # "any": langchain's name for "required"
        msg = llm.bind_tools(TOOLS, tool_choice=choice).invoke(MESSAGES)
        assert msg.tool_calls, msg
        assert msg.response_metadata["finish_reason"] == "tool_calls"
        for call in msg.tool_calls:
            assert call["id"].startswith("call_")
            if choice != "any":
                assert call["name"] == "get_weather"
            if call["name"] == "get_weather":
                jsonschema.validate(call["args"], WEATHER)


def test_langchain_bind_tools_streamed(server: ServerProcess) -> None:
    """langchain merges the streamed tool-call chunks (by index) into whole calls."""
    llm = chat_model(server, seed=4).bind_tools([Weather], tool_choice="Weather")
    merged = None
    for chunk in llm.stream(MESSAGES):
        merged = chunk if merged is None else merged + chunk
    assert merged is not None and len(merged.tool_calls) == 1, merged
    # langchain repairs a cut-off call's JSON: only a finished one counts.
    assert merged.response_metadata["finish_reason"] == "tool_calls"
    call = merged.tool_calls[0]
    assert call["name"] == "Weather"
    Weather.model_validate(call["args"])
    whole = chat_model(server, seed=4).bind_tools([Weather], tool_choice="Weather") \
        .invoke(MESSAGES)
    assert whole.tool_calls[0]["args"] == call["args"]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_langchain_with_structured_output_function_calling(server: ServerProcess,
                                                           seed: int) -> None:
    structured = chat_model(server, seed=seed).with_structured_output(
        Weather, method="function_calling")
    out = structured.invoke(MESSAGES)
    assert isinstance(out, Weather)
    assert 1 <= out.days <= 7 and len(out.city) <= 12


def test_langchain_tool_history_round_trip(server: ServerProcess) -> None:
    from langchain_core.messages import HumanMessage, ToolMessage

    llm = chat_model(server, seed=2).bind_tools(TOOLS, tool_choice="any")
    first = llm.invoke(MESSAGES)
    history = [HumanMessage(MESSAGES[0]["content"]), first,
               *[ToolMessage(content="sunny", tool_call_id=c["id"]) for c in first.tool_calls]]
    second = chat_model(server, seed=2, model_kwargs={"tool_choice": "none"}) \
        .bind_tools(TOOLS).invoke(history)
    assert not second.tool_calls
    assert second.response_metadata["finish_reason"] in ("stop", "length")


def test_litellm_completion_with_tools(server: ServerProcess) -> None:
    import litellm

    common = dict(model="openai/tiny", api_base=server.url + "/v1", api_key="unused",
                  messages=MESSAGES, tools=TOOLS, max_tokens=400, seed=3)
    r = litellm.completion(**common, tool_choice="required")
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.tool_calls
    for call in choice.message.tool_calls:
        if call.function.name == "get_weather":
            jsonschema.validate(json.loads(call.function.arguments), WEATHER)
    r = litellm.completion(**common,
                           tool_choice={"type": "function", "function": {"name": "get_weather"}})
    (call,) = r.choices[0].message.tool_calls
    assert call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), WEATHER)

    chunks = list(litellm.completion(**common, tool_choice="required", stream=True))
    rebuilt = litellm.stream_chunk_builder(chunks, messages=MESSAGES)
    assert [(c.function.name, json.loads(c.function.arguments))
            for c in rebuilt.choices[0].message.tool_calls] \
        == [(c.function.name, json.loads(c.function.arguments)) for c in choice.message.tool_calls]
