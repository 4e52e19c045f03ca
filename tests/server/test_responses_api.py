"""OpenAI's Responses API (``POST /v1/responses``, ``GET``/``DELETE /v1/responses/{id}``) on a
real ``python -m aioengine.serve`` over the random-weight tiny model, in raw HTTP: the response
and event shapes and order, tools forced by the call grammar (plain and in a ``namespace``),
hosted tools skipped, ``text.format`` through the structured-outputs path, tool results in the
history, ``previous_response_id`` over the bounded store, the context limit, and malformed
requests answered with OpenAI-shaped 400s naming the field while the server keeps serving."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import jsonschema
import pytest
import requests

from tests.server.responses_sse import check_order, read_events
from tests.server.server_process import ServerProcess
from tests.server.test_tools import WEATHER

KEY = "sk-resp-test-0123"
HEADERS = {"Authorization": f"Bearer {KEY}"}
STORE_MAX = 3
WEATHER_TOOL = {"type": "function", "name": "get_weather", "description": "Weather forecast",
                "parameters": WEATHER, "strict": True}
GREEDY = {"temperature": 0.0}


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    srv = ServerProcess("--max-model-len", "2048", "--num-kv-blocks", "1024", "--api-key", KEY,
                        "--response-store-max-count", str(STORE_MAX))
    try:
        yield srv
    finally:
        assert srv.terminate() == 0


def post(server: ServerProcess, body: dict[str, Any], **kw: Any) -> requests.Response:
    return requests.post(server.url + "/v1/responses", json=body, headers=HEADERS,
                         timeout=120, **kw)


def create(server: ServerProcess, **fields: Any) -> dict[str, Any]:
    resp = post(server, {"model": "tiny", "max_output_tokens": 16, **fields})
    assert resp.status_code == 200, resp.text
    return resp.json()


def assert_error(resp: requests.Response, status: int, param: str | None, code: str | None = None
                 ) -> dict[str, Any]:
    assert resp.status_code == status, resp.text
    body = resp.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["param"] == param, body
    if code is not None:
        assert body["error"]["code"] == code, body
    return body["error"]


def text_of(response: dict[str, Any]) -> str:
    (item,) = [i for i in response["output"] if i["type"] == "message"]
    (part,) = item["content"]
    assert part["type"] == "output_text" and item["role"] == "assistant"
    return part["text"]


def test_text_reply_has_the_response_shape(server):
    resp = post(server, {"model": "tiny", "input": "Say hi", "instructions": "Be brief.",
                         "max_output_tokens": 16, "reasoning": {"effort": "low",
                                                                 "summary": "auto"},
                         "include": ["reasoning.encrypted_content"],
                         "prompt_cache_key": "k1", **GREEDY})
    assert resp.status_code == 200, resp.text
    ignored = resp.headers["x-aioengine-ignored-fields"].split(", ")
    assert {"reasoning", "include", "prompt_cache_key"} <= set(ignored)
    r = resp.json()
    assert r["id"].startswith("resp_") and r["object"] == "response" and r["model"] == "tiny"
    assert text_of(r) and r["instructions"] == "Be brief." and r["error"] is None
    assert r["reasoning"]["effort"] == "low"  # recorded: no reasoning parser yet
    usage = r["usage"]
    assert usage["input_tokens"] > 0 and 1 <= usage["output_tokens"] <= 16
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
    # Random weights: the reply runs to max_output_tokens unless the model happens to end it.
    if usage["output_tokens"] == 16:
        assert r["status"] == "incomplete"
        assert r["incomplete_details"] == {"reason": "max_output_tokens"}
    else:
        assert r["status"] == "completed" and r["incomplete_details"] is None


def test_stream_follows_the_event_order_and_matches_the_whole_reply(server):
    body = {"model": "tiny", "input": "Say hi", "max_output_tokens": 12, **GREEDY}
    whole = create(server, **body)
    resp = post(server, {**body, "stream": True}, stream=True)
    events = read_events(resp)
    (item,) = check_order(events)
    assert item["content"][0]["text"] == text_of(whole)  # greedy: the same text
    final = events[-1]
    assert final["type"] == {"completed": "response.completed",
                             "incomplete": "response.incomplete"}[whole["status"]]
    assert final["response"]["usage"]["output_tokens"] == whole["usage"]["output_tokens"]


@pytest.mark.parametrize("stream", [False, True])
def test_a_forced_function_call_is_valid_for_its_schema(server, stream):
    body = {"model": "tiny", "input": "Weather in Paris?", "max_output_tokens": 300,
            "tools": [WEATHER_TOOL, {"type": "function", "name": "ping"}],
            "tool_choice": {"type": "function", "name": "get_weather"}, "stream": stream}
    resp = post(server, body, stream=stream)
    if stream:
        events = read_events(resp)
        (call,) = check_order(events)
        assert events[-1]["type"] == "response.completed"
    else:
        assert resp.status_code == 200, resp.text
        (call,) = resp.json()["output"]
        assert resp.json()["status"] == "completed"
    assert call["type"] == "function_call" and call["name"] == "get_weather"
    assert call["call_id"].startswith("call_") and call["status"] == "completed"
    jsonschema.validate(json.loads(call["arguments"]), WEATHER)


def test_a_namespace_tool_is_called_by_its_namespace_and_name(server):
    tools = [{"type": "namespace", "name": "weather", "description": "Forecasts",
              "tools": [{"type": "function", "name": "forecast", "parameters": WEATHER}]}]
    r = create(server, input="Weather?", max_output_tokens=300, tools=tools,
               tool_choice="required", parallel_tool_calls=False)
    (call,) = r["output"]
    assert (call["type"], call["namespace"], call["name"]) == ("function_call", "weather",
                                                              "forecast")
    jsonschema.validate(json.loads(call["arguments"]), WEATHER)


def test_hosted_tools_are_skipped_and_named_in_a_header(server):
    resp = post(server, {"model": "tiny", "input": "hi", "max_output_tokens": 4,
                         "tools": [{"type": "web_search", "external_web_access": False},
                                   {"type": "file_search", "vector_store_ids": ["v"]},
                                   WEATHER_TOOL]})
    assert resp.status_code == 200, resp.text
    assert resp.headers["x-aioengine-skipped-tools"] == "web_search, file_search"
    # Forcing a call with only hosted tools left is refused: nothing could answer it.
    resp = post(server, {"model": "tiny", "input": "hi", "tool_choice": "required",
                         "tools": [{"type": "web_search"}]})
    assert "web_search" in assert_error(resp, 400, "tool_choice")["message"]


def test_text_format_json_schema_is_followed(server):
    schema = {"type": "object", "additionalProperties": False, "required": ["ok", "n"],
              "properties": {"ok": {"type": "boolean"},
                             "n": {"type": "integer", "minimum": 0, "maximum": 9}}}
    r = create(server, input="Answer in JSON", max_output_tokens=100,
               text={"format": {"type": "json_schema", "name": "answer", "schema": schema,
                                "strict": True}})
    assert r["status"] == "completed" and r["text"]["format"]["name"] == "answer"
    jsonschema.validate(json.loads(text_of(r)), schema)


def test_a_history_with_calls_outputs_and_reasoning_is_served(server):
    history = [
        {"type": "message", "role": "developer", "content": [{"type": "input_text",
                                                              "text": "Use tools."}]},
        {"role": "user", "content": "Weather in Paris?"},
        {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text",
                                                         "text": "Call it."}],
         "encrypted_content": "opaque"},
        {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
         "content": [{"type": "output_text", "text": "Checking.", "annotations": []}]},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather",
         "arguments": "{\"city\": \"Paris\", \"days\": 1}"},
        {"type": "function_call_output", "call_id": "call_1", "output": "Sunny, 21 C"},
    ]
    bare = create(server, input=history[1:2])
    r = create(server, input=history, tools=[WEATHER_TOOL])
    # The whole history (and the tools' prompt) reached the template.
    assert r["usage"]["input_tokens"] > bare["usage"]["input_tokens"] + 20


def test_previous_response_id_continues_a_stored_conversation(server):
    first = create(server, input="My name is Ada.")
    again = create(server, input="What is my name?", previous_response_id=first["id"])
    alone = create(server, input="What is my name?")
    assert again["previous_response_id"] == first["id"]
    # The earlier turn (its input and its output) is in the prompt. (Its output's text is
    # tokenized again: random tokens may merge, so fewer than output_tokens is possible.)
    grown = again["usage"]["input_tokens"] - alone["usage"]["input_tokens"]
    assert grown >= first["usage"]["output_tokens"] // 2 + 6
    got = requests.get(f"{server.url}/v1/responses/{first['id']}", headers=HEADERS, timeout=30)
    assert got.status_code == 200 and got.json() == first
    gone = requests.delete(f"{server.url}/v1/responses/{first['id']}", headers=HEADERS,
                           timeout=30)
    assert gone.json() == {"id": first["id"], "object": "response", "deleted": True}
    for method in (requests.get, requests.delete):
        assert_error(method(f"{server.url}/v1/responses/{first['id']}", headers=HEADERS,
                            timeout=30), 404, "response_id", "not_found")
    assert_error(post(server, {"model": "tiny", "input": "hi",
                               "previous_response_id": first["id"]}),
                 400, "previous_response_id", "previous_response_not_found")


def test_a_tool_result_answers_a_call_of_the_previous_response(server):
    called = create(server, input="Weather in Paris?", max_output_tokens=300,
                    tools=[WEATHER_TOOL], tool_choice="required", parallel_tool_calls=False)
    (call,) = called["output"]
    result = {"type": "function_call_output", "call_id": call["call_id"], "output": "Sunny"}
    answer = create(server, input=[result], previous_response_id=called["id"],
                    tools=[WEATHER_TOOL])
    # The same tools' prompt, and now the call and its result too.
    assert answer["usage"]["input_tokens"] > called["usage"]["input_tokens"] + 5
    # Without the earlier response the same result answers no call.
    assert_error(post(server, {"model": "tiny", "input": [result], "tools": [WEATHER_TOOL]}),
                 400, "input[0].call_id")


def test_store_false_keeps_nothing_and_the_store_is_bounded(server):
    unstored = create(server, input="hi", store=False, max_output_tokens=2)
    assert unstored["store"] is False
    assert requests.get(f"{server.url}/v1/responses/{unstored['id']}", headers=HEADERS,
                        timeout=30).status_code == 404
    ids = [create(server, input="hi", max_output_tokens=2)["id"] for _ in range(STORE_MAX + 1)]
    evicted, *kept = ids  # --response-store-max-count 3: the oldest went
    assert_error(post(server, {"model": "tiny", "input": "hi", "previous_response_id": evicted}),
                 400, "previous_response_id", "previous_response_not_found")
    for rid in kept[1:]:
        assert requests.get(f"{server.url}/v1/responses/{rid}", headers=HEADERS,
                            timeout=30).status_code == 200


@pytest.mark.parametrize("stream", [False, True])
def test_a_prompt_past_the_context_is_a_clear_400(server, stream):
    resp = post(server, {"model": "tiny", "input": "word " * 4000, "stream": stream})
    err = assert_error(resp, 400, "input")
    assert "max_model_len=2048" in err["message"], err
    assert create(server, input="hi", max_output_tokens=2)["usage"]["output_tokens"] >= 1


def test_max_output_tokens_past_the_context_is_capped(server):
    r = create(server, input="hi", max_output_tokens=10**6, store=False,
               text={"format": {"type": "json_schema", "name": "b",
                                "schema": {"type": "boolean"}}})
    assert r["max_output_tokens"] == 10**6 and text_of(r) in ("true", "false")


def test_without_max_output_tokens_the_reply_fits_the_context(server):
    r = create(server, input="word " * 700, max_output_tokens=None, store=False)
    used = r["usage"]["input_tokens"] + r["usage"]["output_tokens"]
    assert r["usage"]["input_tokens"] > 700 and used <= 2048, r["usage"]
    # Random weights: the reply ends by chance, or at the context's end.
    assert r["status"] == ("incomplete" if used == 2048 else "completed"), r["usage"]


def test_text_format_json_object_is_a_json_object(server):
    r = create(server, input="JSON please", max_output_tokens=2000, store=False,
               text={"format": {"type": "json_object"}})
    if r["status"] == "completed":  # random weights may fill the context inside the object
        assert isinstance(json.loads(text_of(r)), dict)
    else:
        assert text_of(r).lstrip().startswith("{")


CALL = {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{}"}
MALFORMED = [
    ({"input": [{"type": "function_call_output", "call_id": "nope", "output": "x"}]},
     "input[0].call_id"),
    ({"input": [CALL, {"type": "function_call_output", "call_id": "call_2", "output": "x"}]},
     "input[1].call_id"),
    ({"input": [{"type": "computer_call", "action": {}}]}, "input[0].type"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
     "input[0].content[0].type"),
    ({"input": [{"role": "assistant", "content": [{"type": "input_text", "text": "x"}]}]},
     "input[0].content[0].type"),
    ({"input": [{"role": "user", "content": 5}]}, "input[0].content"),
    ({"input": [{"role": "robot", "content": "hi"}]}, "input[0].role"),
    ({"input": [{"type": "function_call", "call_id": "c", "name": "f"}]}, "input[0].arguments"),
    ({"input": [{"type": "function_call_output", "call_id": "c", "output": "x",
                 "extra": 1}]}, "input[0].extra"),
    ({"input": [{"type": 7}]}, "input[0].type"),
    ({"input": ["hi"]}, "input[0]"),
    ({"input": 5}, "input"),
    ({"input": []}, "input"),
    ({"input": "hi", "tools": [{"type": "function"}]}, "tools[0].name"),
    ({"input": "hi", "tools": [{"type": "function", "name": "f", "parameters": "x"}]},
     "tools[0].parameters"),
    ({"input": "hi", "tools": [{"type": "namespace", "name": "n",
                                "tools": [{"type": "function", "name": 5}]}]},
     "tools[0].tools[0].name"),
    ({"input": "hi", "tools": [{"type": "function", "name": "f", "parameters": {
        "type": "object", "properties": {"a": {"type": "nonsense"}}}}],
      "tool_choice": "required"}, "tools[0].parameters"),
    ({"input": "hi", "tools": [WEATHER_TOOL], "tool_choice": {"type": "function",
                                                             "name": "nope"}},
     "tool_choice.name"),
    ({"input": "hi", "tool_choice": "required"}, "tool_choice"),
    ({"input": "hi", "max_output_tokens": 0}, "max_output_tokens"),
    ({"input": "hi", "temperature": "hot"}, "temperature"),
    ({"input": "hi", "text": {"format": {"type": "json_schema", "name": "x"}}},
     "text.format.schema"),
    ({"input": "hi", "text": {"format": {"type": "xml"}}}, "text.format.type"),
    ({"input": "hi", "reasoning": {"effort": "extreme"}}, "reasoning.effort"),
    ({"input": "hi", "background": True}, "background"),
    ({"input": "hi", "previous_response_id": "resp_unknown"}, "previous_response_id"),
    ({"input": "hi", "model": "gpt-5"}, "model"),
]


@pytest.mark.parametrize(("fields", "param"), MALFORMED, ids=[p for _, p in MALFORMED])
def test_malformed_requests_are_400s_naming_the_field(server, fields, param):
    resp = post(server, {"model": "tiny", **fields})
    assert_error(resp, 404 if param == "model" else 400, param)


def test_the_server_still_serves_after_malformed_requests(server):
    for fields, _ in MALFORMED:
        assert post(server, {"model": "tiny", **fields}).status_code in (400, 404)
    assert create(server, input="hi", max_output_tokens=2)["usage"]["output_tokens"] >= 1
