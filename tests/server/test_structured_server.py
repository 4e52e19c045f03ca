"""Structured outputs, logit_bias, unknown fields, continuous usage stats and prompt batches on
the real server over the tiny model (random weights: only the grammar makes its output valid),
with raw HTTP and the real openai SDK."""

from __future__ import annotations

import json
import re
from typing import Literal

import aiohttp
import jsonschema
import pytest
from pydantic import BaseModel, Field

from aioengine import SamplingParams
from aioengine.server import ServerSettings
from aioengine.server.unknown_fields import IGNORED_HEADER
from tests.server.app_server import app_server
from tests.server.test_errors import _check_error

pytestmark = pytest.mark.anyio

USER = [{"role": "user", "content": "Describe a person as JSON."}]
SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 8},
    "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "pets": {"type": "array", "items": {"enum": ["cat", "dog"]}, "maxItems": 3}},
    "required": ["name", "age", "pets"], "additionalProperties": False}


async def post(server, path: str, body: dict) -> tuple[int, dict, dict]:
    async with aiohttp.ClientSession() as s, s.post(server.make_url(path), json=body) as resp:
        return resp.status, await resp.json(), dict(resp.headers)


async def test_json_schema_on_chat_and_completions_validates(server):
    rf = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA,
                                                 "strict": True}}
    status, body, _ = await post(server, "/v1/chat/completions", {
        "messages": USER, "response_format": rf, "n": 4, "seed": 3, "temperature": 1.0,
        "max_tokens": 120})
    assert status == 200, body
    status2, body2, _ = await post(server, "/v1/completions", {
        "prompt": "person:", "response_format": rf, "n": 4, "seed": 5, "max_tokens": 120})
    assert status2 == 200, body2
    texts = [c["message"]["content"] for c in body["choices"]]
    texts += [c["text"] for c in body2["choices"]]
    for c in body["choices"] + body2["choices"]:
        assert c["finish_reason"] == "stop", c
    for text in texts:
        jsonschema.validate(json.loads(text), SCHEMA)


async def test_json_object_text_and_vllm_fields(server):
    status, body, _ = await post(server, "/v1/chat/completions", {
        "messages": USER, "response_format": {"type": "json_object"}, "temperature": 0.0,
        "max_tokens": 60})
    assert status == 200, body
    text = body["choices"][0]["message"]["content"]
    assert text.startswith("{")
    if body["choices"][0]["finish_reason"] == "stop":
        assert isinstance(json.loads(text), dict)
    cases = [({"structured_outputs": {"choice": ["yes", "no"]}}, lambda t: t in ("yes", "no")),
             ({"structured_outputs": {"regex": "[a-c]{2}-[0-9]{3}"}},
              lambda t: re.fullmatch("[a-c]{2}-[0-9]{3}", t)),
             ({"structured_outputs": {"grammar": 'root ::= "up" | "down"'}},
              lambda t: t in ("up", "down")),
             ({"structured_outputs": {"json": SCHEMA, "disable_fallback": True}},
              lambda t: jsonschema.validate(json.loads(t), SCHEMA) is None),
             ({"guided_choice": ["left", "right"]}, lambda t: t in ("left", "right")),
             ({"guided_regex": "[0-9]{4}"}, lambda t: re.fullmatch("[0-9]{4}", t)),
             ({"guided_json": json.dumps(SCHEMA)},
              lambda t: jsonschema.validate(json.loads(t), SCHEMA) is None)]
    for extra, ok in cases:
        status, body, _ = await post(server, "/v1/completions", {
            "prompt": "answer:", "max_tokens": 100, "n": 3, "seed": 1, **extra})
        assert status == 200, (extra, body)
        for c in body["choices"]:
            assert c["finish_reason"] == "stop" and ok(c["text"]), (extra, c)
    # "text" is no constraint: the same greedy answer as without response_format.
    plain = {"prompt": "answer:", "max_tokens": 8, "temperature": 0.0}
    _, a, _ = await post(server, "/v1/completions", plain)
    _, b, _ = await post(server, "/v1/completions", {**plain, "response_format": {"type": "text"}})
    assert a["choices"][0]["text"] == b["choices"][0]["text"]


BAD = [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "what"}}}}, "response_format.json_schema.schema", "invalid JSON schema"),
    ({"response_format": {"type": "json_schema"}}, "response_format.json_schema",
     "needs a json_schema"),
    ({"response_format": {"type": "yaml"}}, "response_format.type", "Invalid enum value"),
    ({"response_format": {"type": "json_object", "json_schema": {"schema": {}}}},
     "response_format.json_schema", "only allowed with type 'json_schema'"),
    ({"structured_outputs": {"regex": "(ab"}}, "structured_outputs", "unclosed group"),
    ({"structured_outputs": {"grammar": "root ::= foo"}}, "structured_outputs", "grammar"),
    ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, "structured_outputs",
     "exactly one"),
    ({"structured_outputs": {}}, "structured_outputs", "exactly one"),
    ({"structured_outputs": {"choice": []}}, "structured_outputs", "non-empty list"),
    ({"structured_outputs": {"regex": "a", "colour": 1}}, "structured_outputs.colour",
     "unknown field `colour`"),
    ({"structured_outputs": {"regex": "a", "structural_tag": {}}},
     "structured_outputs.structural_tag", "not supported"),
    ({"structured_outputs": {"json": SCHEMA, "whitespace_pattern": " "}},
     "structured_outputs.whitespace_pattern", "not supported"),
    ({"response_format": {"type": "json_object"}, "guided_regex": "a"}, "guided_regex",
     "more than one output constraint"),
    ({"guided_json": "{not json"}, "guided_json", "not valid JSON"),
    ({"logit_bias": {"abc": 1}}, "logit_bias", "'abc' is not a token id"),
    ({"logit_bias": {"99999999": 1}}, "logit_bias", "is not a token id"),
    ({"logit_bias": {"5": 101}}, "logit_bias", "must be in [-100, 100]"),
    ({"audio": {"voice": "alloy", "format": "wav"}}, "audio", "audio output is not supported"),
    ({"modalities": ["text", "audio"]}, "modalities", "text only"),
    ({"web_search_options": {}}, "web_search_options", "web search is not supported"),
    ({"functions": [{"name": "f"}]}, "functions", "served on /v1/chat/completions"),
    ({"best_of": 3}, "best_of", "best_of is not supported"),
]


async def test_bad_constraints_and_refused_fields_are_400_and_reach_no_engine(server, engine):
    before = await engine.get_stats()
    for extra, param, fragment in BAD:
        for path, base in (("/v1/chat/completions", {"messages": USER}),
                           ("/v1/completions", {"prompt": "x"})):
            status, body, _ = await post(server, path, {**base, **extra})
            assert status == 400, (path, extra, body)
            _check_error(body, 400, param, fragment)
    after = await engine.get_stats()
    assert after.num_requests_finished_total == before.num_requests_finished_total
    assert after.prompt_tokens_total == before.prompt_tokens_total


async def test_logit_bias_bans_and_forces_tokens(server, engine):
    base = {"prompt": "The", "max_tokens": 4, "temperature": 0.0}
    _, plain, _ = await post(server, "/v1/completions", {**base, "logprobs": 0})
    first = plain["choices"][0]["logprobs"]["tokens"][0]
    async for out in engine.generate("The", SamplingParams(max_tokens=1, temperature=0.0)):
        first_id = out.token_ids[0]
    assert engine.tokenizer.decode([first_id]) == first
    _, banned, _ = await post(server, "/v1/completions", {
        **base, "logprobs": 0, "logit_bias": {str(first_id): -100}})
    assert banned["choices"][0]["logprobs"]["tokens"][0] != first
    forced_id = 77
    _, forced, _ = await post(server, "/v1/completions", {
        **base, "ignore_eos": True, "logit_bias": {str(forced_id): 100}})
    assert forced["choices"][0]["text"] == engine.tokenizer.decode([forced_id] * 4)


async def test_unknown_fields_are_ignored_logged_once_and_listed(server, caplog):
    extra = {"store": False, "metadata": {"k": "v"}, "service_tier": "auto",
             "prediction": {"type": "content", "content": "x"}, "modalities": ["text"],
             "tools": [], "tool_choice": "none", "guided_decoding_backend": "xgrammar",
             "stream_options": {"include_usage": True, "include_obfuscation": False},
             "stream": True}
    async with aiohttp.ClientSession() as s:
        for _ in range(2):
            async with s.post(server.make_url("/v1/chat/completions"), json={
                    "messages": USER, "max_tokens": 3, **extra}) as resp:
                assert resp.status == 200, await resp.text()
                listed = resp.headers[IGNORED_HEADER].split(", ")
                await resp.read()
    assert set(listed) == {"store", "metadata", "service_tier", "prediction", "modalities",
                           "guided_decoding_backend",
                           "stream_options.include_obfuscation"}
    warned = [r for r in caplog.records if r.levelname == "WARNING" and "'store'" in r.message]
    assert len(warned) <= 1  # once per name per process (an earlier test may have logged it)
    # No unknown field: no header.
    status, _, headers = await post(server, "/v1/completions", {"prompt": "x", "max_tokens": 1})
    assert status == 200 and IGNORED_HEADER not in headers


async def test_strict_request_fields_restores_the_400(engine):
    async with app_server(engine, ServerSettings(strict_request_fields=True)) as srv:
        status, body, _ = await post(srv, "/v1/chat/completions", {
            "messages": USER, "store": False, "metadata": {}})
        assert status == 400
        _check_error(body, 400, "store", "unsupported parameter `store`")
        assert "also metadata" in body["error"]["message"]
        status, body, _ = await post(srv, "/v1/chat/completions", {
            "messages": USER, "max_tokens": 2, "response_format": {"type": "json_object"}})
        assert status == 200, body


async def test_continuous_usage_stats_puts_usage_in_every_chunk(server):
    async with aiohttp.ClientSession() as s, s.post(
            server.make_url("/v1/completions"),
            json={"prompt": "count", "max_tokens": 6, "ignore_eos": True, "stream": True,
                  "stream_options": {"include_usage": True,
                                     "continuous_usage_stats": True}}) as resp:
        assert resp.status == 200
        events = [json.loads(line[6:]) for line in (await resp.text()).splitlines()
                  if line.startswith("data: {")]
    counts = [e["usage"]["completion_tokens"] for e in events]
    assert all(e["usage"]["prompt_tokens"] > 0 for e in events)
    assert counts == sorted(counts) and counts[-1] == 6 and counts[0] >= 1
    assert events[-1]["choices"] == []  # the final usage chunk, as with include_usage


async def test_a_batch_of_prompts_gets_one_choice_per_prompt_in_order(server):
    prompts = ["alpha", [5, 6, 7], "gamma delta"]
    common = {"max_tokens": 5, "seed": 11, "temperature": 1.0}
    status, batch, _ = await post(server, "/v1/completions",
                                  {"prompt": prompts, "n": 2, **common})
    assert status == 200, batch
    assert [c["index"] for c in batch["choices"]] == list(range(6))
    prompt_tokens = completion_tokens = 0
    for i, p in enumerate(prompts):
        _, alone, _ = await post(server, "/v1/completions", {"prompt": p, "n": 2, **common})
        prompt_tokens += alone["usage"]["prompt_tokens"]
        completion_tokens += alone["usage"]["completion_tokens"]
        assert [c["text"] for c in batch["choices"][2 * i:2 * i + 2]] == \
            [c["text"] for c in alone["choices"]], p
    assert batch["usage"]["prompt_tokens"] == prompt_tokens
    assert batch["usage"]["completion_tokens"] == completion_tokens


class Pet(BaseModel):
    kind: Literal["cat", "dog", "fish"]
    age: int = Field(ge=0, le=30)


class Person(BaseModel):
    name: str = Field(max_length=10)
    adult: bool
    pets: list[Pet] = Field(max_length=2)


async def test_openai_sdk_parse_with_a_pydantic_model(oai):
    """``client.chat.completions.parse(response_format=Model)``: the SDK sends a strict
    json_schema; every choice parses into the model."""
    completion = await oai.chat.completions.parse(
        model="tiny", messages=USER, response_format=Person, n=4, seed=7, temperature=1.0,
        max_completion_tokens=150)
    assert len(completion.choices) == 4
    for choice in completion.choices:
        assert choice.finish_reason == "stop", choice
        assert isinstance(choice.message.parsed, Person), choice
        Person.model_validate_json(choice.message.content)
