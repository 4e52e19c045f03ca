"""/tokenize, /detokenize and /version with vLLM's shapes, on the engine's own tokenizer."""

from __future__ import annotations

import aiohttp
import pytest

from aioengine import __version__
from tests.server.engine_setup import MAX_MODEL_LEN

pytestmark = pytest.mark.anyio


async def _post(server, path: str, body: dict) -> tuple[int, dict]:
    async with aiohttp.ClientSession() as s, s.post(server.make_url(path), json=body) as r:
        return r.status, await r.json()


async def test_tokenize_a_prompt_and_back(server, engine):
    status, body = await _post(server, "/tokenize", {"prompt": "Once upon a time",
                                                      "return_token_strs": True})
    assert status == 200, body
    ids = engine.tokenizer.encode("Once upon a time")
    assert body == {"count": len(ids), "max_model_len": MAX_MODEL_LEN, "tokens": ids,
                    "token_strs": [engine.tokenizer.decode([i], skip_special_tokens=False)
                                   for i in ids]}
    status, back = await _post(server, "/detokenize", {"tokens": ids, "model": "tiny"})
    assert status == 200 and back == {"prompt": engine.tokenizer.decode(
        ids, skip_special_tokens=False)}
    _, plain = await _post(server, "/tokenize", {"prompt": "Once", "add_special_tokens": False})
    assert plain["tokens"] == engine.tokenizer.encode("Once", add_special_tokens=False)


async def test_tokenize_messages_applies_the_chat_template(server, engine):
    messages = [{"role": "user", "content": "Hello"}]
    status, body = await _post(server, "/tokenize", {"messages": messages})
    assert status == 200, body
    assert body["tokens"] == engine.tokenizer.encode_chat(messages)
    assert body["token_strs"] is None


@pytest.mark.parametrize(("path", "body", "status", "fragment"), [
    ("/tokenize", {}, 400, "exactly one of 'prompt' and 'messages'"),
    ("/tokenize", {"prompt": "a", "messages": [{"role": "user", "content": "b"}]}, 400,
     "exactly one of"),
    ("/tokenize", {"prompt": "a", "model": "gpt-4"}, 404, "'gpt-4' does not exist"),
    ("/tokenize", {"prompt": "a", "extra": 1}, 400, "unsupported parameter `extra`"),
    ("/detokenize", {"tokens": [1, 10**9]}, 400, "tokens[1] = 1000000000 is outside"),
    ("/detokenize", {"tokens": "abc"}, 400, "Expected `array`"),
])
async def test_bad_requests(server, path, body, status, fragment):
    got, payload = await _post(server, path, body)
    assert got == status and fragment in payload["error"]["message"], payload


async def test_version(server):
    async with aiohttp.ClientSession() as s, s.get(server.make_url("/version")) as r:
        assert r.status == 200 and await r.json() == {"version": __version__}


async def test_openapi_describes_every_route_from_the_request_structs(server):
    async with aiohttp.ClientSession() as s, s.get(server.make_url("/openapi.json")) as r:
        assert r.status == 200
        doc = await r.json()
    assert doc["openapi"] == "3.1.0" and doc["info"]["version"] == __version__
    routes = {(res.method, res.resource.canonical) for res in server.app.router.routes()
              if res.method not in ("HEAD", "OPTIONS")}
    described = {(method.upper(), path) for path, ops in doc["paths"].items() for method in ops}
    assert described == routes - {("GET", "/openapi.json")}
    body = doc["paths"]["/v1/completions"]["post"]["requestBody"]["content"]
    ref = body["application/json"]["schema"]["$ref"].rsplit("/", 1)[1]
    props = doc["components"]["schemas"][ref]["properties"]
    assert {"prompt", "max_tokens", "temperature", "stream", "logprobs"} <= set(props)
    assert "security" not in doc  # no keys configured on this server
