"""Tool calling on the real model through the server (the session's shared one,
tests/smollm2.py). SmolLM2-135M-Instruct does not write tool calls on its own (with
``tool_choice="auto"`` it answers in prose), but with ``required`` or a named function the
grammar (the Hermes format the server teaches templates without tools) lets it fill the
arguments from the question."""

from __future__ import annotations

import json

import pytest

from tests.smollm2 import SMOLLM2

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "required": ["city"],
                   "properties": {"city": {"type": "string", "description": "The city name"}}}}}
ADD = {"type": "function", "function": {
    "name": "add", "description": "Add two integers",
    "parameters": {"type": "object", "required": ["a", "b"],
                   "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}}}


def ask(question: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": question}]


@pytest.mark.anyio
@pytest.mark.parametrize(("question", "name", "args"), [
    ("What is the weather in Paris?", "get_weather", {"city": "Paris"}),
    ("What's the weather like in Tokyo right now?", "get_weather", {"city": "Tokyo"}),
    ("Add 17 and 25.", "add", {"a": 17, "b": 25}),
])
async def test_required_call_takes_its_arguments_from_the_question(smollm2_oai, question, name,
                                                                   args) -> None:
    r = await smollm2_oai.chat.completions.create(model=SMOLLM2, messages=ask(question),
                                                  tools=[WEATHER, ADD], tool_choice="required",
                                                  parallel_tool_calls=False, max_tokens=60,
                                                  temperature=0)
    (call,) = r.choices[0].message.tool_calls
    assert r.choices[0].finish_reason == "tool_calls"
    assert (call.function.name, json.loads(call.function.arguments)) == (name, args)


@pytest.mark.anyio
async def test_streamed_named_call_equals_the_whole_one(smollm2_oai) -> None:
    kwargs = dict(model=SMOLLM2, messages=ask("What is the weather in Paris?"),
                  tools=[WEATHER, ADD], max_tokens=60, temperature=0,
                  tool_choice={"type": "function", "function": {"name": "get_weather"}})
    whole = await smollm2_oai.chat.completions.create(**kwargs)
    async with smollm2_oai.chat.completions.stream(**kwargs) as stream:
        final = await stream.get_final_completion()
    for r in (whole, final):
        (call,) = r.choices[0].message.tool_calls
        assert json.loads(call.function.arguments) == {"city": "Paris"}
        assert r.choices[0].finish_reason == "tool_calls"
