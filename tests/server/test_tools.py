"""Tool calling with the official ``openai`` SDK against the app over the random-weight tiny
model: ``required`` and named ``tool_choice`` are enforced by a grammar, so every call must
name a given function and carry arguments that validate against its schema, whole or streamed
(reassembled by the SDK); tool-call histories round-trip; malformed ones are 400s."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import jsonschema
import pytest

from aioengine import AsyncMPClient, EngineConfig
from tests.server.app_server import app_server, openai_client

pytestmark = pytest.mark.anyio

# Bounded schemas: the random model fills every string to its limit, never ends a free one.
WEATHER = {"type": "object", "additionalProperties": False, "required": ["city", "days"],
           "properties": {"city": {"type": "string", "maxLength": 12},
                          "days": {"type": "integer", "minimum": 1, "maximum": 7},
                          "unit": {"enum": ["celsius", "fahrenheit"]}}}
ORDER = {"type": "object", "additionalProperties": False, "required": ["items", "express"],
         "properties": {"express": {"type": "boolean"},
                        "items": {"type": "array", "minItems": 1, "maxItems": 3, "items": {
                            "type": "object", "additionalProperties": False,
                            "required": ["sku", "qty"],
                            "properties": {"sku": {"type": "string", "pattern": "^[A-Z]{3}$"},
                                           "qty": {"type": "integer", "minimum": 1,
                                                   "maximum": 99}}}}}}
# Nested models as pydantic writes them: "$ref" pointers into the schema's own "$defs".
ROUTE = {"type": "object", "required": ["stops"], "$defs": {
    "Stop": {"type": "object", "required": ["city"],
             "properties": {"city": {"type": "string", "maxLength": 8},
                            "next": {"anyOf": [{"$ref": "#/$defs/Leg"}, {"type": "null"}]}}},
    "Leg": {"type": "object", "required": ["km"],
            "properties": {"km": {"type": "integer", "minimum": 0, "maximum": 999}}}},
    "properties": {"stops": {"type": "array", "minItems": 1, "maxItems": 2,
                             "items": {"$ref": "#/$defs/Stop"}}}}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather forecast",
                                      "parameters": WEATHER}},
    {"type": "function", "function": {"name": "place_order", "parameters": ORDER}},
    {"type": "function", "function": {"name": "ping"}},  # no parameters: {} only
    {"type": "function", "function": {"name": "plan_route", "parameters": ROUTE}},
]
SCHEMAS = {"get_weather": WEATHER, "place_order": ORDER,
           "ping": {"type": "object", "maxProperties": 0}, "plan_route": ROUTE}
MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
async def engine(anyio_backend: str) -> AsyncIterator[AsyncMPClient]:
    # The tools prompt (the Hermes format: tiny's template knows no tools) is ~500 tokens.
    async with AsyncMPClient(EngineConfig(model="tiny", device="cpu", max_model_len=2048,
                                          num_kv_blocks=1024, max_num_seqs=64)) as client:
        yield client


@pytest.fixture(scope="module")
async def server(engine: AsyncMPClient) -> AsyncIterator[Any]:
    async with app_server(engine) as srv:
        yield srv


def check_calls(calls: Any, allowed: set[str] | None = None) -> list[tuple[str, Any]]:
    """Every call is well formed, names an allowed function, and its arguments validate."""
    assert calls, "no tool calls"
    ids = [c.id for c in calls]
    assert len(set(ids)) == len(ids) and all(i.startswith("call_") for i in ids)
    out = []
    for c in calls:
        assert c.type == "function"
        assert c.function.name in (allowed or SCHEMAS)
        args = json.loads(c.function.arguments)
        jsonschema.validate(args, SCHEMAS[c.function.name])
        out.append((c.function.name, args))
    return out


@pytest.mark.parametrize("seed", range(4))
async def test_required_returns_valid_calls(oai: Any, seed: int) -> None:
    r = await oai.chat.completions.create(model="tiny", messages=MESSAGES, tools=TOOLS,
                                          tool_choice="required", seed=seed, n=2,
                                          max_tokens=400)
    for choice in r.choices:
        assert choice.finish_reason == "tool_calls"
        assert choice.message.content is None
        check_calls(choice.message.tool_calls)


async def test_parallel_tool_calls_false_gives_one_call(oai: Any) -> None:
    for seed in range(3):
        r = await oai.chat.completions.create(model="tiny", messages=MESSAGES, tools=TOOLS,
                                              tool_choice="required", seed=seed,
                                              parallel_tool_calls=False, max_tokens=400)
        assert len(r.choices[0].message.tool_calls) == 1
        check_calls(r.choices[0].message.tool_calls)


@pytest.mark.parametrize("name", ["get_weather", "place_order", "ping", "plan_route"])
async def test_named_tool_choice_calls_that_function(oai: Any, name: str) -> None:
    r = await oai.chat.completions.create(
        model="tiny", messages=MESSAGES, tools=TOOLS, seed=7, max_tokens=400,
        tool_choice={"type": "function", "function": {"name": name}})
    (choice,) = r.choices
    assert choice.finish_reason == "tool_calls"
    assert check_calls(choice.message.tool_calls, {name})[0][0] == name


async def test_streamed_calls_are_reassembled_by_the_sdk(oai: Any) -> None:
    """``.stream()`` (the SDK's accumulator) gives the same calls as the whole reply with the
    same seed, and the raw chunks have OpenAI's shape: a call's first delta carries its id,
    type and name, the later ones only argument text."""
    kwargs: dict[str, Any] = dict(model="tiny", messages=MESSAGES, tools=TOOLS, seed=3,
                                  max_tokens=400, tool_choice="required")
    whole = await oai.chat.completions.create(**kwargs)
    async with oai.chat.completions.stream(**kwargs) as stream:
        async for _ in stream:
            pass
        final = await stream.get_final_completion()
    streamed = final.choices[0]
    assert streamed.finish_reason == "tool_calls"
    assert check_calls(streamed.message.tool_calls) \
        == check_calls(whole.choices[0].message.tool_calls)

    chunks = [c async for c in await oai.chat.completions.create(**kwargs, stream=True)]
    seen: set[int] = set()
    arguments: dict[int, str] = {}
    for chunk in chunks:
        for tc in chunk.choices[0].delta.tool_calls or []:
            if tc.index not in seen:
                seen.add(tc.index)
                assert tc.id.startswith("call_") and tc.type == "function" and tc.function.name
                arguments[tc.index] = tc.function.arguments or ""
            else:
                assert tc.id is None and tc.function.name is None
                arguments[tc.index] += tc.function.arguments
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    assert [json.loads(arguments[i]) for i in sorted(arguments)] \
        == [args for _, args in check_calls(whole.choices[0].message.tool_calls)]


async def test_streamed_choices_keep_their_own_calls(oai: Any) -> None:
    """n=2 streamed: each choice's deltas reassemble into its own valid calls, the same as
    the whole reply's choices (same seed), with logprobs for every token."""
    kwargs: dict[str, Any] = dict(model="tiny", messages=MESSAGES, tools=TOOLS, seed=9, n=2,
                                  max_tokens=400, tool_choice="required", logprobs=True)
    whole = await oai.chat.completions.create(**kwargs)
    for choice in whole.choices:
        assert len(choice.logprobs.content) > 10
    calls: dict[int, dict[int, list[str]]] = {0: {}, 1: {}}
    logprobs = {0: 0, 1: 0}
    async for chunk in await oai.chat.completions.create(**kwargs, stream=True):
        (c,) = chunk.choices
        if c.logprobs is not None:
            logprobs[c.index] += len(c.logprobs.content)
        for tc in c.delta.tool_calls or []:
            if tc.function.name:
                calls[c.index][tc.index] = [tc.function.name, tc.function.arguments]
            else:
                calls[c.index][tc.index][1] += tc.function.arguments
    for i, choice in enumerate(whole.choices):
        assert [(n, json.loads(a)) for n, a in calls[i].values()] \
            == check_calls(choice.message.tool_calls)
        assert logprobs[i] == len(choice.logprobs.content)


async def test_streamed_named_call_sends_argument_fragments(oai: Any) -> None:
    kwargs: dict[str, Any] = dict(
        model="tiny", messages=MESSAGES, tools=TOOLS, seed=5, max_tokens=400,
        tool_choice={"type": "function", "function": {"name": "place_order"}})
    chunks = [c async for c in await oai.chat.completions.create(**kwargs, stream=True)]
    deltas = [tc for c in chunks for tc in (c.choices[0].delta.tool_calls or [])]
    assert deltas[0].function.name == "place_order" and deltas[0].function.arguments == ""
    assert len(deltas) > 3  # the arguments arrive as they are generated
    text = "".join(d.function.arguments for d in deltas)
    jsonschema.validate(json.loads(text), ORDER)
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    async with oai.chat.completions.stream(**kwargs) as stream:
        final = await stream.get_final_completion()
    assert final.choices[0].message.tool_calls[0].function.arguments == text


async def test_tool_history_round_trip(oai: Any, server: Any) -> None:
    """The SDK's own reply message goes back in the history with the tool results; the next
    request is served, and the prompt holds the calls and the results."""
    first = await oai.chat.completions.create(model="tiny", messages=MESSAGES, tools=TOOLS,
                                              tool_choice="required", seed=1, max_tokens=400)
    message = first.choices[0].message
    results = [{"role": "tool", "tool_call_id": c.id, "content": f"result {i}"}
               for i, c in enumerate(message.tool_calls)]
    history = [*MESSAGES, message, *results]
    second = await oai.chat.completions.create(model="tiny", messages=history, tools=TOOLS,
                                               tool_choice="none", max_tokens=8, seed=1)
    assert second.choices[0].message.tool_calls is None
    assert second.choices[0].finish_reason in ("stop", "length")

    as_dicts = [*MESSAGES, message.model_dump(exclude_none=True), *results]
    async with aiohttp.ClientSession() as http:
        async with http.post(server.make_url("/tokenize"),
                             json={"messages": as_dicts}) as resp:  # as "none" renders
            assert resp.status == 200, await resp.text()
            body = await resp.json()
        async with http.post(server.make_url("/detokenize"),
                             json={"tokens": body["tokens"]}) as resp:
            prompt = (await resp.json())["prompt"]
    assert body["count"] == second.usage.prompt_tokens
    for i, call in enumerate(message.tool_calls):
        assert f"<tool_response>\nresult {i}\n</tool_response>" in prompt
        assert json.dumps({"name": call.function.name,
                           "arguments": json.loads(call.function.arguments)},
                          ensure_ascii=False) in prompt


async def test_auto_and_none_leave_plain_text_alone(oai: Any) -> None:
    """The tiny model writes no <tool_call>: ``auto`` returns its text. ``none`` is not told
    how to call the tools (tiny's template does not render them): its prompt is the plain
    conversation's, so its reply is the one without tools."""
    replies = []
    for choice in ("auto", "none", None):
        tools = {"tools": TOOLS, "tool_choice": choice} if choice else {}
        r = await oai.chat.completions.create(model="tiny", messages=MESSAGES, seed=2,
                                              max_tokens=24, **tools)
        assert r.choices[0].message.tool_calls is None
        assert r.choices[0].finish_reason in ("stop", "length")
        replies.append((r.choices[0].message.content, r.usage.prompt_tokens))
    (auto, auto_prompt), none, plain = replies
    assert auto and none == plain and auto_prompt > plain[1] + 300


async def test_llama3_json_parser_calls_are_valid_too(engine: AsyncMPClient) -> None:
    """With ``--tool-call-parser llama3_json`` the grammar writes that format's calls."""
    from aioengine.server import ServerSettings

    async with app_server(engine, ServerSettings(tool_call_parser="llama3_json")) as srv, \
            openai_client(srv) as client:
        for seed in range(3):
            r = await client.chat.completions.create(
                model="tiny", messages=MESSAGES, tools=TOOLS, tool_choice="required",
                seed=seed, max_tokens=400)
            assert r.choices[0].finish_reason == "tool_calls"
            check_calls(r.choices[0].message.tool_calls)
        async with client.chat.completions.stream(
                model="tiny", messages=MESSAGES, tools=TOOLS, seed=1, max_tokens=400,
                tool_choice={"type": "function", "function": {"name": "get_weather"}}) as st:
            final = await st.get_final_completion()
        assert check_calls(final.choices[0].message.tool_calls, {"get_weather"})


CALL = {"id": "call_a", "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Oslo", "days": 1}'}}
ASSISTANT = {"role": "assistant", "content": None, "tool_calls": [CALL]}


def _tool(name: str, params: Any = None) -> dict[str, Any]:
    fn: dict[str, Any] = {"name": name}
    if params is not None:
        fn["parameters"] = params
    return {"type": "function", "function": fn}


BAD = [
    # (extra body, messages, status, message part, param)
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     MESSAGES, "tool_choice names function 'nope', which is not in tools",
     "tool_choice.function.name"),
    ({"tool_choice": "required"}, MESSAGES, "tool_choice needs tools", "tool_choice"),
    ({"tools": [], "tool_choice": "required"}, MESSAGES, "tools is empty; send at least one",
     "tools"),
    ({"tools": [_tool("get weather")]}, MESSAGES,
     "tools[0].function.name must be 1 to 64 letters", "tools[0].function.name"),
    ({"tools": [_tool("a"), _tool("a")]}, MESSAGES, "a second function named 'a'",
     "tools[1].function.name"),
    ({"tools": [_tool("a", {"type": "object", "properties": {"x": {"type": "nonsense"}}})]},
     MESSAGES, "tools[0].function.parameters is not a usable JSON schema",
     "tools[0].function.parameters"),
    ({"tools": TOOLS, "tool_choice": "sometimes"}, MESSAGES, "tool_choice", None),
    ({}, [*MESSAGES, ASSISTANT, {"role": "tool", "content": "x"}],
     "a 'tool' message needs tool_call_id", "messages[2].tool_call_id"),
    ({}, [*MESSAGES, ASSISTANT, {"role": "tool", "content": "x", "tool_call_id": "call_b"}],
     "tool_call_id 'call_b' answers no tool call", "messages[2].tool_call_id"),
    ({}, [*MESSAGES, {"role": "tool", "content": "x", "tool_call_id": "call_a"}, ASSISTANT],
     "tool_call_id 'call_a' answers no tool call", "messages[1].tool_call_id"),
    ({}, [*MESSAGES, ASSISTANT, {"role": "tool", "tool_call_id": "call_a"}],
     "a 'tool' message must have content", "messages[2].content"),
    ({}, [*MESSAGES, {**ASSISTANT, "tool_calls": [
        {**CALL, "function": {"name": "get_weather", "arguments": "{city: Oslo}"}}]}],
     "messages[1].tool_calls[0].function.arguments must be a JSON object's text",
     "messages[1].tool_calls[0].function.arguments"),
    ({}, [*MESSAGES, {**ASSISTANT, "tool_calls": [
        {**CALL, "function": {"name": "get_weather", "arguments": "[1]"}}]}],
     "must be a JSON object's text, got a JSON list",
     "messages[1].tool_calls[0].function.arguments"),
    ({}, [*MESSAGES, {**ASSISTANT, "tool_calls": [{**CALL, "id": ""}]}],
     "messages[1].tool_calls[0].id must be a non-empty string", "messages[1].tool_calls[0].id"),
    ({}, [{"role": "user", "content": "hi", "tool_call_id": "call_a"}],
     "unsupported parameter `tool_call_id` in messages[0]", "messages[0].tool_call_id"),
    ({}, [{"role": "user", "content": "hi", "tool_calls": [CALL]}],
     "unsupported parameter `tool_calls` in messages[0]", "messages[0].tool_calls"),
    ({}, [*MESSAGES, {"role": "assistant", "content": None}],
     "only an assistant message with tool_calls may leave it out", "messages[1].content"),
    ({}, [*MESSAGES, {**ASSISTANT, "tool_calls": [{**CALL, "type": "code"}]}],
     "messages[1].tool_calls[0].type", None),
]


@pytest.mark.parametrize(("extra", "messages", "text", "param"), BAD)
async def test_malformed_tool_requests_are_400(oai: Any, extra: dict, messages: list,
                                               text: str, param: str | None) -> None:
    import openai

    with pytest.raises(openai.BadRequestError) as err:
        await oai.chat.completions.create(model="tiny", messages=messages, max_tokens=4,
                                          extra_body=extra)
    body = err.value.body
    assert text in body["message"], body
    if param is not None:
        assert body["param"] == param


@pytest.fixture
async def oai(server: Any) -> AsyncIterator[Any]:
    async with openai_client(server) as client:
        yield client


# A valid schema with a keyword the grammar lacks (Claude Code's tools send propertyNames).
KEYED = {"type": "object", "properties": {"env": {
    "type": "object", "propertyNames": {"pattern": "^[A-Z_]+$"},
    "additionalProperties": {"type": "string", "maxLength": 4}}}}


async def test_a_schema_the_grammar_lacks_a_keyword_of_is_refused_only_in_a_grammar(
        oai: Any) -> None:
    """Such a tool only shown to the model (``auto``, or beside the named one) is fine; one a
    call grammar is built from is a 400 naming it, as any schema that does not compile."""
    import openai

    tools = [_tool("run", KEYED), TOOLS[0]]
    for choice in ("auto", {"type": "function", "function": {"name": "get_weather"}}):
        r = await oai.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=4,
                                              tools=tools, tool_choice=choice)
        assert r.choices[0].finish_reason is not None
    for choice in ("required", {"type": "function", "function": {"name": "run"}}):
        with pytest.raises(openai.BadRequestError) as err:
            await oai.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=4,
                                              tools=tools, tool_choice=choice)
        assert "propertyNames" in err.value.body["message"], err.value.body
        assert err.value.body["param"] == "tools[0].function.parameters"
