"""The Anthropic Messages API (``POST /v1/messages``, ``/v1/messages/count_tokens``) on a real
``python -m aioengine.serve`` over the random-weight tiny model: reply and event shapes, tools
forced by the call grammar, tool results in the history, token counts, the API key as
``x-api-key``, the context limits, and malformed requests answered with Anthropic-shaped 400s
naming the field while the server keeps serving."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import jsonschema
import pytest
import requests

from tests.server.anthropic_sse import check_order, read_events
from tests.server.server_process import ServerProcess
from tests.server.test_tools import WEATHER

KEY = "sk-ant-test-0123"
CONTEXT = 2048  # the tools prompt (Hermes format: tiny's template knows no tools) is ~500
HEADERS = {"x-api-key": KEY, "anthropic-version": "2023-06-01"}
TOOLS = [{"name": "get_weather", "description": "Weather forecast", "input_schema": WEATHER},
         {"name": "ping", "input_schema": {"type": "object", "properties": {}}}]
USER = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    srv = ServerProcess("--max-model-len", str(CONTEXT), "--num-kv-blocks", "1024",
                        "--api-key", KEY)
    try:
        yield srv
    finally:
        assert srv.terminate() == 0


def post(server: ServerProcess, body: dict[str, Any], path: str = "/v1/messages?beta=true",
         headers: dict[str, str] | None = None) -> requests.Response:
    return requests.post(server.url + path, json=body, headers=headers or HEADERS, timeout=120)


def message(server: ServerProcess, **fields: Any) -> dict[str, Any]:
    resp = post(server, {"model": "tiny", "max_tokens": 16, "messages": USER, **fields})
    assert resp.status_code == 200, resp.text
    return resp.json()


def count_tokens(server: ServerProcess, **fields: Any) -> int:
    resp = post(server, {"model": "tiny", "messages": USER, **fields},
                "/v1/messages/count_tokens?beta=true")
    assert resp.status_code == 200, resp.text
    assert set(resp.json()) == {"input_tokens"}
    return resp.json()["input_tokens"]


def assert_error(resp: requests.Response, status: int, kind: str, *fragments: str) -> None:
    assert resp.status_code == status, resp.text
    body = resp.json()
    assert body["type"] == "error" and set(body) == {"type", "error"}, body
    assert body["error"]["type"] == kind, body
    for fragment in fragments:
        assert fragment in body["error"]["message"], (fragment, body)


def test_text_reply_has_anthropics_shape(server):
    reply = message(server, system="You are terse.", temperature=0.0)
    assert reply["id"].startswith("msg_") and reply["type"] == "message"
    assert reply["role"] == "assistant" and reply["model"] == "tiny"
    assert [b["type"] for b in reply["content"]] == ["text"] and reply["content"][0]["text"]
    usage = reply["usage"]
    assert usage["input_tokens"] == count_tokens(server, system="You are terse.")
    assert 1 <= usage["output_tokens"] <= 16
    # Random weights: the reply runs to max_tokens unless the model happens to end it.
    want = "max_tokens" if usage["output_tokens"] == 16 else "end_turn"
    assert reply["stop_reason"] == want and reply["stop_sequence"] is None


def test_stream_follows_anthropics_event_order_and_matches_the_whole_reply(server):
    body = {"model": "tiny", "max_tokens": 12, "messages": USER, "temperature": 0.0,
            "system": [{"type": "text", "text": "Be brief.", "cache_control":
                        {"type": "ephemeral"}}], "stream": True}
    events = read_events(post(server, body))
    blocks = check_order(events)
    start, end = events[0]["message"], events[-2]
    assert start["id"].startswith("msg_") and start["content"] == []
    assert start["stop_reason"] is None and start["usage"]["input_tokens"] > 0
    whole = message(server, **{k: v for k, v in body.items() if k != "stream"})
    assert blocks == whole["content"]
    assert end["delta"] == {"stop_reason": whole["stop_reason"], "stop_sequence": None}
    assert end["usage"]["output_tokens"] == whole["usage"]["output_tokens"]
    assert any(e["type"] == "ping" for e in events)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_named_tool_choice_gives_a_tool_use_whose_input_validates(server, stream):
    body = {"model": "tiny", "max_tokens": 300, "messages": USER, "tools": TOOLS,
            "tool_choice": {"type": "tool", "name": "get_weather"}}
    if stream:
        events = read_events(post(server, {**body, "stream": True}))
        blocks = check_order(events)
        stop = events[-2]["delta"]["stop_reason"]
        assert any(e["type"] == "content_block_delta"
                   and e["delta"]["type"] == "input_json_delta" for e in events)
    else:
        reply = message(server, **body)
        blocks, stop = reply["content"], reply["stop_reason"]
    assert stop == "tool_use"
    assert [b["type"] for b in blocks] == ["tool_use"], blocks
    call = blocks[0]
    assert call["name"] == "get_weather" and call["id"].startswith("toolu_")
    jsonschema.validate(call["input"], WEATHER)


def test_any_tool_choice_calls_a_tool_and_a_follow_up_with_its_result_is_answered(server):
    reply = message(server, max_tokens=300, tools=TOOLS, tool_choice={
        "type": "any", "disable_parallel_tool_use": True})
    assert reply["stop_reason"] == "tool_use"
    assert [b["type"] for b in reply["content"]] == ["tool_use"]
    call = reply["content"][0]
    history = [*USER, {"role": "assistant", "content": [
        {"type": "text", "text": "Let me check."}, call]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": call["id"], "content": "Sunny, 21 C"},
            {"type": "text", "text": "And tomorrow?"}]},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "call it again", "signature": "x"},
            {**call, "id": "toolu_second"}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_second",
                                      "is_error": True,
                                      "content": [{"type": "text", "text": "timeout"}]}]}]
    follow = message(server, messages=history, tools=TOOLS, max_tokens=8)
    assert follow["usage"]["input_tokens"] == count_tokens(server, messages=history, tools=TOOLS)
    assert follow["usage"]["input_tokens"] > reply["usage"]["input_tokens"]


def test_count_tokens_counts_system_tools_and_system_messages(server):
    plain = count_tokens(server)
    with_system = count_tokens(server, system="You are a weather bot.")
    # Claude Code sends a role "system" message inside messages: it joins the system prompt.
    inline = count_tokens(server, messages=[{"role": "system",
                                             "content": "You are a weather bot."}, *USER])
    assert plain < with_system == inline
    assert count_tokens(server, tools=TOOLS) > plain + 100  # the tools prompt


def test_the_api_key_is_accepted_as_x_api_key_or_bearer(server):
    body = {"model": "tiny", "max_tokens": 2, "messages": USER}
    assert_error(post(server, body, headers={"anthropic-version": "2023-06-01"}), 401,
                 "authentication_error", "missing API key", "x-api-key")
    assert_error(post(server, body, headers={"x-api-key": "sk-wrong"}), 401,
                 "authentication_error", "incorrect API key")
    assert post(server, body, headers={"Authorization": f"Bearer {KEY}"}).status_code == 200
    assert post(server, body, headers={"x-api-key": KEY}).status_code == 200


def test_max_tokens_above_the_context_is_capped_not_refused(server):
    reply = message(server, max_tokens=1_000_000, stop_sequences=["\n"], temperature=0.0)
    total = reply["usage"]["input_tokens"] + reply["usage"]["output_tokens"]
    assert total <= CONTEXT
    assert reply["stop_reason"] in ("end_turn", "max_tokens", "stop_sequence")
    if reply["stop_reason"] == "stop_sequence":
        assert reply["stop_sequence"] == "\n"


def test_ignored_fields_and_betas_are_named_in_headers(server):
    body = {"model": "tiny", "max_tokens": 2, "messages": USER, "metadata": {"user_id": "u1"},
            "thinking": {"type": "enabled", "budget_tokens": 1024},
            "context_management": {"edits": []}, "output_config": {"effort": "low"},
            "some_future_field": 1}
    resp = post(server, body, headers={**HEADERS, "anthropic-beta": "interleaved-thinking-"
                                       "2025-05-14,fancy-beta"})
    assert resp.status_code == 200, resp.text
    ignored = resp.headers["x-aioengine-ignored-fields"].split(", ")
    assert set(ignored) == {"some_future_field", "metadata", "thinking", "context_management",
                            "output_config"}
    assert "fancy-beta" in resp.headers["x-aioengine-ignored-betas"]
    hinted = [{"role": "user", "content": [{"type": "text", "text": "hi", "cache_control": {
        "type": "ephemeral", "ttl": "1h"}}]}]
    hint = post(server, {"model": "tiny", "max_tokens": 2, "messages": hinted})
    assert hint.headers["x-aioengine-ignored-fields"] == "cache_control"
    plain = post(server, {"model": "tiny", "max_tokens": 2, "messages": USER})
    assert "x-aioengine-ignored-fields" not in plain.headers
    for thinking in ({"type": "adaptive"}, {"type": "disabled"}):
        assert post(server, {**body, "thinking": thinking}).status_code == 200


def test_a_prompt_longer_than_the_context_is_an_anthropic_400(server):
    long = " ".join(["weather"] * (CONTEXT + 100))
    for stream in (False, True):
        resp = post(server, {"model": "tiny", "max_tokens": 4, "stream": stream,
                             "messages": [{"role": "user", "content": long}]})
        assert_error(resp, 400, "invalid_request_error", "max_model_len")
    message(server, max_tokens=2)  # and it still serves


_CALL = {"type": "tool_use", "id": "toolu_1", "name": "ping", "input": {}}
MALFORMED = {
    "unknown block type": ({"messages": [{"role": "user", "content": [
        {"type": "image", "source": {}}]}]}, "messages[0].content[0].type"),
    "tool_result without tool_use": ({"messages": [{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_nope", "content": "x"}]}]},
        "messages[0].content[0].tool_use_id"),
    "tool_use in a user message": ({"messages": [{"role": "user", "content": [_CALL]}]},
                                   "messages[0].content[0].type"),
    "tool_result in an assistant message": ({"messages": [
        *USER, {"role": "assistant", "content": [_CALL, {
            "type": "tool_result", "tool_use_id": "toolu_1"}]}, *USER]},
        "messages[1].content[1].type"),
    "max_tokens a string": ({"max_tokens": "many"}, "max_tokens"),
    "missing max_tokens": ({"max_tokens": None}, "max_tokens"),
    "max_tokens zero": ({"max_tokens": 0}, "max_tokens"),
    "empty messages": ({"messages": []}, "messages"),
    "content a number": ({"messages": [{"role": "user", "content": 7}]},
                         "messages[0].content"),
    "unknown role": ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].role"),
    "temperature above 1": ({"temperature": 1.5}, "temperature"),
    "stop_sequences a string": ({"stop_sequences": "END"}, "stop_sequences"),
    "input_schema not an object": ({"tools": [{"name": "f", "input_schema": "x"}]},
                                   "tools[0].input_schema"),
    "unusable input_schema": ({"tools": [{"name": "f", "input_schema": {"type": "nope"}}],
                               "tool_choice": {"type": "any"}}, "tools[0].input_schema"),
    "bad tool name": ({"tools": [{"name": "has space", "input_schema": {}}]}, "tools[0].name"),
    "tool_choice names no tool": ({"tools": TOOLS, "tool_choice": {"type": "tool",
                                                                   "name": "nope"}},
                                  "tool_choice.name"),
    "unknown tool_choice type": ({"tools": TOOLS, "tool_choice": {"type": "some"}},
                                 "tool_choice.type"),
    "server tool": ({"tools": [{"type": "web_search_20250305", "name": "web_search",
                                "input_schema": {}}]}, "tools[0].type"),
    "thinking without budget": ({"thinking": {"type": "enabled"}}, "budget_tokens"),
    "system a number": ({"system": 3}, "system"),
    "final assistant prefill": ({"messages": [*USER, {"role": "assistant",
                                                      "content": "Sure"}]},
                                "messages[1].role"),
}


@pytest.mark.parametrize("case", list(MALFORMED), ids=list(MALFORMED))
def test_malformed_requests_get_an_anthropic_400_naming_the_field(server, case):
    fields, where = MALFORMED[case]
    body = {"model": "tiny", "max_tokens": 4, "messages": USER, **fields}
    body = {k: v for k, v in body.items() if v is not None}
    for stream in (False, True):
        assert_error(post(server, {**body, "stream": stream}), 400, "invalid_request_error",
                     where)
    assert message(server, max_tokens=2)["type"] == "message"  # the engine keeps serving


def test_other_refusals_keep_anthropics_shape(server):
    assert_error(post(server, {"model": "claude-sonnet-4-5", "max_tokens": 2,
                               "messages": USER}), 404, "not_found_error", "claude-sonnet-4-5")
    resp = requests.post(server.url + "/v1/messages", data=b"{not json", headers={
        **HEADERS, "Content-Type": "application/json"}, timeout=30)
    assert_error(resp, 400, "invalid_request_error", "malformed JSON")
    resp = requests.get(server.url + "/v1/messages", headers=HEADERS, timeout=30)
    assert_error(resp, 405, "invalid_request_error", "GET")
    # The OpenAI routes keep OpenAI's shape.
    resp = requests.post(server.url + "/v1/chat/completions", json={"messages": []},
                         headers=HEADERS, timeout=30)
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "messages"


def test_the_openapi_document_describes_the_messages_routes(server):
    doc = requests.get(server.url + "/openapi.json", headers=HEADERS, timeout=30).json()
    for path in ("/v1/messages", "/v1/messages/count_tokens"):
        ref = doc["paths"][path]["post"]["requestBody"]["content"]["application/json"]
        name = ref["schema"]["$ref"].rsplit("/", 1)[-1]
        assert "messages" in doc["components"]["schemas"][name]["required"]
    assert json.dumps(doc).count("input_schema") >= 1
