"""Every bad input gets its status and an OpenAI-style error body, and reaches no engine."""

from __future__ import annotations

import json

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from aioengine.server import ServerSettings, create_app
from tests.server.engine_setup import MAX_MODEL_LEN

pytestmark = pytest.mark.anyio

USER = [{"role": "user", "content": "hi"}]

# (path, body, status, param, fragment of the message)
CASES = [
    ("/v1/chat/completions", b'{"messages": [', 400, None, "malformed JSON"),
    ("/v1/chat/completions", b"", 400, None, "body is empty"),
    ("/v1/chat/completions", b"[1, 2]", 400, None, "Expected `object`"),
    ("/v1/chat/completions", {}, 400, "messages", "missing required field `messages`"),
    ("/v1/chat/completions", {"messages": "hi"}, 400, "messages", "Expected `array`"),
    ("/v1/chat/completions", {"messages": []}, 400, "messages", "length >= 1"),
    ("/v1/chat/completions", {"messages": [{"role": "robot", "content": "x"}]}, 400,
     "messages[0].role", "Invalid enum value 'robot'"),
    ("/v1/chat/completions",
     {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
     400, "messages[0].content[0].type", "image_url"),
    # Each role's content rules, as OpenAI's (an assistant with tool calls may have none).
    ("/v1/chat/completions", {"messages": [{"role": "system", "content": "s"}, {"role": "user"}]},
     400, "messages[1].content", "messages[1]: a 'user' message must have content, a string or "
     "a list of text parts; its content is missing"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": None}]}, 400,
     "messages[0].content", "a 'user' message must have content, a string or a list of text "
     "parts; its content is null"),
    ("/v1/chat/completions", {"messages": [{"role": "system", "content": None}, *USER]}, 400,
     "messages[0].content", "messages[0]: a 'system' message must have content"),
    ("/v1/chat/completions", {"messages": [{"role": "developer"}, *USER]}, 400,
     "messages[0].content", "a 'developer' message must have content"),
    ("/v1/chat/completions", {"messages": [*USER, {"role": "assistant", "content": None}, *USER]},
     400, "messages[1].content", "its content is null (only an assistant message with "
     "tool_calls may leave it out)"),
    ("/v1/chat/completions", {"messages": [*USER, {"role": "assistant", "tool_calls": []}]},
     400, "messages[1].content", "its content is missing (only an assistant message with "
     "tool_calls"),
    ("/v1/chat/completions", {"messages": [*USER, {"role": "tool", "content": "42"}]}, 400,
     "messages[1].tool_call_id", "messages[1]: a 'tool' message needs tool_call_id"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": []}]}, 400,
     "messages[0].content", "length >= 1"),
    ("/v1/chat/completions", {"messages": USER, "temperature": 2.5}, 400, "temperature",
     "<= 2.0"),
    ("/v1/chat/completions", {"messages": USER, "top_p": 0}, 400, "top_p", "> 0.0"),
    ("/v1/chat/completions", {"messages": USER, "max_tokens": 0}, 400, "max_tokens", ">= 1"),
    ("/v1/chat/completions", {"messages": USER, "max_tokens": "ten"}, 400, "max_tokens",
     "Expected `int | null`, got `str`"),
    ("/v1/chat/completions", {"messages": USER, "n": 17}, 400, "n", "<= 16"),
    ("/v1/chat/completions", {"messages": USER, "top_k": 0}, 400, "top_k", "top_k"),
    ("/v1/chat/completions", {"messages": USER, "tools": [], "tool_choice": "required"}, 400,
     "tools", "tools is empty"),
    ("/v1/chat/completions", {"messages": USER, "top_logprobs": 2}, 400, "top_logprobs",
     "requires logprobs"),
    ("/v1/chat/completions", {"messages": USER, "max_tokens": 4, "min_tokens": 9}, 400,
     "min_tokens", "min_tokens must be between 0 and 4"),
    ("/v1/chat/completions", {"messages": USER, "max_tokens": 3, "max_completion_tokens": 4},
     400, "max_completion_tokens", "disagree"),
    ("/v1/chat/completions", {"messages": USER, "stream_options": {"include_usage": "yes"}},
     400, "stream_options.include_usage", "Expected `bool`"),
    ("/v1/chat/completions", {"messages": USER, "stream_options": {"include_usage": True}},
     400, "stream_options", "only allowed when stream is true"),
    ("/v1/completions", {"prompt": "a", "stream": False, "stream_options": {}}, 400,
     "stream_options", "only allowed when stream is true"),
    ("/v1/chat/completions", {"messages": USER, "stop_token_ids": [10**9]}, 400,
     "stop_token_ids", "outside the vocabulary"),
    ("/v1/completions", {"prompt": ["a", ""]}, 400, "prompt[1]", "prompt[1]: prompt is empty"),
    ("/v1/completions", {"prompt": ["a", [1, 10**9]]}, 400, "prompt[1]", "token id at position"),
    ("/v1/completions", {"prompt": ["a"] * 17, "n": 16}, 400, "prompt", "at most 256"),
    ("/v1/completions", {"prompt": [1, "b"]}, 400, "prompt", "mixing"),
    ("/v1/completions", {"prompt": [1, 10**9]}, 400, "prompt", "token id at position 1"),
    ("/v1/completions", {"prompt": ""}, 400, "prompt", "prompt is empty"),
    ("/v1/completions", {"prompt": "a", "echo": True}, 400, "echo", "not supported"),
    ("/v1/completions", {"prompt": "a", "logprobs": 21}, 400, "logprobs", "<= 20"),
    ("/v1/completions", {"prompt": "a", "model": "gpt-4"}, 404, "model", "'gpt-4' does not"),
    ("/v1/chat/completions", {"messages": USER, "model": "gpt-4"}, 404, "model",
     "does not exist"),
    ("/v1/completions", {"prompt": "a", "stream": True, "model": "nope"}, 404, "model",
     "does not exist"),
    ("/v1/completions", {"prompt": list(range(1, MAX_MODEL_LEN + 2))}, 400, "prompt",
     f"max_model_len={MAX_MODEL_LEN}"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "word " * 600}],
                              "stream": True}, 400, "messages", f"max_model_len={MAX_MODEL_LEN}"),
]


def _check_error(body: dict, status: int, param: str | None, fragment: str) -> None:
    assert set(body) == {"error"}
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert fragment in err["message"], err
    assert err["param"] == param, err
    assert err["type"] == ("not_found_error" if status == 404 else "invalid_request_error")


async def test_bad_requests_get_their_status_and_reach_no_engine(server, engine):
    before = await engine.get_stats()
    async with aiohttp.ClientSession() as s:
        for path, body, status, param, fragment in CASES:
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            async with s.post(server.make_url(path), data=data,
                              headers={"Content-Type": "application/json"}) as resp:
                assert resp.status == status, (path, body, await resp.text())
                assert resp.content_type == "application/json"
                _check_error(await resp.json(), status, param, fragment)
    after = await engine.get_stats()
    assert after.prompt_tokens_total == before.prompt_tokens_total
    assert after.num_requests_finished_total == before.num_requests_finished_total


async def test_every_role_with_content_is_accepted(server):
    """Not stricter than OpenAI: empty strings and lists of text parts are content."""
    messages = [{"role": "system", "content": ""},
                {"role": "developer", "content": [{"type": "text", "text": "Be terse."}]},
                {"role": "user", "content": "hi", "name": "ann"},
                {"role": "assistant", "content": ""},
                {"role": "user", "content": [{"type": "text", "text": "a"},
                                             {"type": "text", "text": "b"}]}]
    async with aiohttp.ClientSession() as s, \
            s.post(server.make_url("/v1/chat/completions"),
                   json={"messages": messages, "max_tokens": 2}) as resp:
        assert resp.status == 200, await resp.text()
        assert (await resp.json())["object"] == "chat.completion"


async def test_unknown_route_and_method(server):
    async with aiohttp.ClientSession() as s:
        async with s.get(server.make_url("/v1/engines")) as resp:
            assert resp.status == 404
            assert "no route for GET /v1/engines" in (await resp.json())["error"]["message"]
        async with s.get(server.make_url("/v1/completions")) as resp:
            assert resp.status == 405
            assert "not allowed" in (await resp.json())["error"]["message"]


@pytest.mark.parametrize(("content_type", "fragment"), [
    ("text/plain", "got 'text/plain'"),
    ("application/x-www-form-urlencoded", "curl: add -H 'Content-Type: application/json'"),
    ("application/octet-stream", "got 'application/octet-stream'"),
])
async def test_a_body_declared_as_not_json_is_415(server, content_type, fragment):
    body = json.dumps({"prompt": "hi", "max_tokens": 2}).encode()
    async with aiohttp.ClientSession() as s, \
            s.post(server.make_url("/v1/completions"), data=body,
                   headers={"Content-Type": content_type}) as resp:
        assert resp.status == 415, await resp.text()
        err = (await resp.json())["error"]
        assert err["code"] == "unsupported_media_type" and fragment in err["message"], err
        assert "Content-Type must be application/json" in err["message"]


async def test_a_body_without_content_type_is_415(server):
    """What a web page's no-cors fetch of a Blob sends: refused, so no page can start
    generations on a loopback server without a CORS preflight."""
    body = json.dumps({"prompt": "hi", "max_tokens": 2}).encode()
    async with aiohttp.ClientSession(skip_auto_headers=["Content-Type"]) as s, \
            s.post(server.make_url("/v1/completions"), data=body) as resp:
        assert resp.status == 415, await resp.text()
        err = (await resp.json())["error"]
        assert err["message"].startswith("Content-Type must be application/json, got none")


@pytest.mark.parametrize("body", [b'{"prompt": "\xff\xfe", "max_tokens": 2}',
                                  b'{"messages": [{"role": "user", "content": "a\xc3"}]}'],
                         ids=["completion", "chat-truncated-sequence"])
async def test_invalid_utf8_in_a_string_is_400(server, engine, body):
    path = "/v1/chat/completions" if b"messages" in body else "/v1/completions"
    async with aiohttp.ClientSession() as s, \
            s.post(server.make_url(path), data=body,
                   headers={"Content-Type": "application/json"}) as resp:
        assert resp.status == 400, await resp.text()
        err = (await resp.json())["error"]
        assert err["code"] == "invalid_json" and "not valid UTF-8: byte 0x" in err["message"]
    async with aiohttp.ClientSession() as s, \
            s.post(server.make_url("/v1/completions"), json={"prompt": "hi", "max_tokens": 2}) \
            as resp:
        assert resp.status == 200  # and the server goes on serving


@pytest.mark.parametrize("headers", [{"Content-Type": "application/json"},
                                     {"Content-Type": "application/json; charset=utf-8"},
                                     {"Content-Type": "application/merge-patch+json"}],
                         ids=["plain", "charset", "suffix"])
async def test_json_content_types_are_accepted(server, headers):
    body = json.dumps({"prompt": "hi", "max_tokens": 2}).encode()
    async with aiohttp.ClientSession(skip_auto_headers=["Content-Type"]) as s, \
            s.post(server.make_url("/v1/completions"), data=body, headers=headers) as resp:
        assert resp.status == 200, await resp.text()
        assert (await resp.json())["object"] == "text_completion"


async def test_body_over_the_limit_is_413(engine):
    srv = TestServer(create_app(engine, ServerSettings(max_request_bytes=2048)),
                     host="127.0.0.1")
    await srv.start_server()
    try:
        big = json.dumps({"prompt": "a" * 4000}).encode()
        json_type = {"Content-Type": "application/json"}
        async with aiohttp.ClientSession(headers=json_type) as s:
            async with s.post(srv.make_url("/v1/completions"), data=big) as resp:
                assert resp.status == 413
                err = (await resp.json())["error"]
                assert f"{len(big)} bytes exceeds the server's limit of 2048" in err["message"]

            async def chunked():  # no Content-Length: the limit holds while reading
                for _ in range(4):
                    yield b" " * 1000

            async with s.post(srv.make_url("/v1/completions"), data=chunked()) as resp:
                assert resp.status == 413
                assert "more than 2048 bytes" in (await resp.json())["error"]["message"]
    finally:
        await srv.close()


async def test_refusals_are_logged_at_debug_rate_limited_without_body(engine, caplog,
                                                                      monkeypatch):
    import logging
    import types

    from aioengine.server import errors

    # The limiter's clock, frozen: its window is one second of time.monotonic(), and 100
    # requests through this loop can span several seconds on a loaded box (each new second
    # logs 20 more), so the count would depend on the box's speed. errors.py reads the clock
    # only as time.monotonic() (the loop's own clock is left alone).
    now = [1000.25]
    monkeypatch.setattr(errors, "time", types.SimpleNamespace(monotonic=lambda: now[0]))
    srv = TestServer(create_app(engine, ServerSettings(api_keys=("sk-secret-key",))),
                     host="127.0.0.1")
    await srv.start_server()
    try:
        with caplog.at_level(logging.DEBUG, logger="aioengine.server.errors"):
            async with aiohttp.ClientSession() as s:
                async def refused() -> None:
                    async with s.post(srv.make_url("/v1/completions"),
                                      json={"prompt": "body-text-xyz"},
                                      headers={"Authorization": "Bearer sk-wrong-key"}) as r:
                        assert r.status == 401

                for _ in range(100):  # all in one second of the limiter's clock
                    await refused()
                lines = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
                assert len(lines) == 20, lines  # 20 a second, the other 80 counted
                now[0] += 1.0  # the next second: the count of the last one, then lines again
                await refused()
        lines = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
        assert lines[0].startswith("refused POST /v1/completions from 127.0.0.1: 401 "
                                   "invalid_api_key: incorrect API key")
        assert lines[20:] == ["refused 80 more request(s) in the last second (not shown)",
                              lines[0]], lines[20:]
        assert not any("body-text-xyz" in ln or "sk-" in ln for ln in lines)
    finally:
        await srv.close()
