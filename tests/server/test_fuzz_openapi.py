"""Property-based fuzzing of every endpoint described by the server's own ``/openapi.json``
(schemathesis), against a real ``python -m aioengine.serve`` process on the tiny model: valid
and invalid bodies, path parameters and headers. Nothing may answer 5xx; every 4xx is an
error in the route's shape (OpenAI's; Anthropic's on /v1/messages); the engine is alive
afterwards.

Bounded so it runs in CI in well under a minute: 30 examples per operation and mode,
derandomized, a per-example deadline, no example database. For a longer random hunt:
``AIOENGINE_FUZZ_EXAMPLES=300 pytest tests/server/test_fuzz_openapi.py``."""

from __future__ import annotations

import collections
import json
import os
from datetime import timedelta
from pathlib import Path

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.server.server_process import ServerProcess

EXAMPLES = int(os.environ.get("AIOENGINE_FUZZ_EXAMPLES", "30"))  # per operation and mode


@pytest.fixture(scope="module")
def server():
    # --max-model-len 256 (ServerProcess) bounds every generation; tokens capped further by
    # --default-max-tokens for chats that send none.
    with ServerProcess("--default-max-tokens", "4", "--request-timeout", "20") as srv:
        yield srv
        assert srv.terminate() == 0


def _anthropic(path: str) -> bool:
    return path.startswith("/v1/messages")


def _error_code(path: str, response: requests.Response) -> str:
    """OpenAI's ``error.code``; Anthropic's errors have only a type."""
    error = response.json()["error"]
    return error["type"] if _anthropic(path) else error["code"]


def _check_response(case, response: requests.Response) -> None:
    where = f"{case.method} {case.formatted_path} body={case.body!r:.300}"
    # 504 'timeout' is the answer a request's own (fuzzed, tiny) 'timeout' asks for.
    timed_out = response.status_code == 504 and _error_code(case.path, response) in (
        "timeout", "timeout_error")
    assert response.status_code < 500 or timed_out, \
        f"{where}: {response.status_code} {response.text[:500]}"
    if response.status_code >= 400 and response.status_code != 405:  # 4xx and that 504
        # aiohttp's own 405 for a route's other methods is outside the API's operations.
        body = response.json()
        error = body["error"]
        assert isinstance(error["message"], str) and error["message"], (where, body)
        assert isinstance(error["type"], str), (where, body)
        if _anthropic(case.path):
            assert body["type"] == "error" and set(body) == {"type", "error"}, (where, body)
        else:
            assert "code" in error, (where, body)


def _with_messages(case):
    if isinstance(case.body, dict):
        if case.path == "/v1/responses":
            case.body["input"] = "hi"
            case.body.pop("previous_response_id", None)  # a fuzzed id is never stored: a 400
        else:
            case.body["messages"] = [{"role": "user", "content": "hi"}]
        if _anthropic(case.path) or case.path == "/v1/responses":
            case.body["model"] = "tiny"  # a fuzzed name is a 404
    return case


def _operations(url: str):
    doc = requests.get(f"{url}/openapi.json", timeout=10).json()
    schema = schemathesis.openapi.from_dict(doc)
    return [result.ok() for result in schema.get_all_operations()]


@pytest.mark.parametrize("mode", ["positive", "negative"])
def test_every_endpoint_survives_fuzzing(server, mode):
    operations = _operations(server.url)
    paths = {(op.method.upper(), op.path) for op in operations}
    assert ("POST", "/v1/chat/completions") in paths and ("GET", "/health") in paths
    session = requests.Session()
    seen: collections.Counter[tuple[str, str, int]] = collections.Counter()
    generation_mode = schemathesis.GenerationMode(mode)
    strategies = [op.as_strategy(generation_mode=generation_mode) for op in operations]
    # Generated messages rarely pass the conversation checks (a lone 'tool' message is the
    # first thing hypothesis tries): also fuzz every other field around a valid conversation
    # (a Responses request's input), so sampling parameters reach the engine.
    for path in ("/v1/chat/completions", "/v1/messages", "/v1/responses"):
        op = next(op for op in operations if op.path == path)
        strategies.append(op.as_strategy(generation_mode=generation_mode).map(_with_messages))
    strategy = st.one_of(strategies)

    @settings(max_examples=EXAMPLES * len(operations), deadline=timedelta(seconds=30),
              database=None, derandomize="AIOENGINE_FUZZ_EXAMPLES" not in os.environ,
              phases=("explicit", "generate"),
              suppress_health_check=list(HealthCheck))
    @given(case=strategy)
    def fuzz(case) -> None:
        # Requests sends no Content-Type for a body schemathesis could not serialize as JSON;
        # that is a 415, tested elsewhere: keep JSON so the bodies reach the decoder.
        try:
            response = case.call(base_url=server.url, session=session, timeout=30)
        except requests.ConnectionError as e:
            raise AssertionError(f"{case.method} {case.formatted_path} body={case.body!r:.300}"
                                 f": {e}\nserver log:\n{server.output()[-4000:]}") from None
        seen[(case.method, case.path, response.status_code)] += 1
        _check_response(case, response)

    fuzz()
    print(sorted(seen.items()))
    # Every operation was reached (a GET without parameters has no invalid form), and the
    # bodies got past the HTTP layer into the handlers.
    assert {(m, p) for m, p, _ in seen} == (paths if mode == "positive"
                                            else {(m, p) for m, p in paths if m == "POST"})
    for path in ("/v1/chat/completions", "/v1/completions", "/v1/messages", "/v1/responses"):
        assert seen[("POST", path, 400)] > 0, seen
        if mode == "positive":
            assert any(s == 200 and p == path for _, p, s in seen), seen
    # The engine is alive and answers after all of it.
    health = session.get(f"{server.url}/health", timeout=10)
    assert health.status_code == 200, health.text
    chat = session.post(f"{server.url}/v1/chat/completions", timeout=30, data=json.dumps(
        {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}),
        headers={"Content-Type": "application/json"})
    assert chat.status_code == 200, chat.text


@pytest.mark.parametrize("field", ["temperature", "repetition_penalty"])
@pytest.mark.parametrize("value", [5e-324, 1e-38, 1e-7])
def test_tiny_divisors_are_refused_not_fatal(server, field, value):
    """Found by the fuzz: a float32 logit divided by a temperature or repetition penalty this
    small is inf, the draw fell off the vocabulary, and the engine died for every request."""
    session = requests.Session()
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, field: value}
    response = session.post(f"{server.url}/v1/chat/completions", json=body, timeout=30)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert field in error["message"] and "1e-06" in error["message"], error
    assert session.get(f"{server.url}/health", timeout=10).status_code == 200
    body[field] = 1e-6  # the smallest allowed samples, on the engine, without harm
    response = session.post(f"{server.url}/v1/chat/completions", json=body, timeout=30)
    assert response.status_code == 200, response.text


def test_the_docs_page_renders_every_route_and_field():
    """docs/api.md is filled from the same document at build time (scripts/mkdocs_openapi.py)."""
    from aioengine.server.openapi import openapi_document, openapi_markdown
    from scripts.mkdocs_openapi import MARKER

    doc = openapi_document(False)
    text = openapi_markdown(doc)
    for path, item in doc["paths"].items():
        for method in item:
            assert f"### `{method.upper()} {path}`" in text
    for name, schema in doc["components"]["schemas"].items():
        assert f"### {name}" in text
        for field in schema.get("properties", {}):
            assert f"| `{field}` |" in text, (name, field)
    root = Path(__file__).resolve().parents[2]
    assert MARKER in (root / "docs" / "api.md").read_text(encoding="utf-8")
    assert "scripts/mkdocs_openapi.py" in (root / "mkdocs.yml").read_text(encoding="utf-8")


def test_fuzz_with_api_keys_every_route_needs_one():
    """With --api-key: without a key every route but /health and /metrics answers 401
    invalid_api_key (OpenAI-shaped); with it, the same fuzz gets no 5xx."""
    with ServerProcess("--api-key", "sekrit", "--default-max-tokens", "4") as srv:
        key = {"Authorization": "Bearer sekrit"}
        assert requests.get(f"{srv.url}/openapi.json", timeout=10).status_code == 401
        doc = requests.get(f"{srv.url}/openapi.json", headers=key, timeout=10).json()
        assert doc["security"] == [{"bearer": []}, {"x-api-key": []}]
        operations = [r.ok() for r in schemathesis.openapi.from_dict(doc).get_all_operations()]
        session = requests.Session()
        strategy = st.one_of([op.as_strategy() for op in operations])
        statuses: collections.Counter[tuple[str, int, str | None]] = collections.Counter()

        @settings(max_examples=10 * len(operations), deadline=timedelta(seconds=30),
                  database=None, derandomize=True, phases=("explicit", "generate"),
                  suppress_health_check=list(HealthCheck))
        @given(case=strategy)
        def fuzz(case) -> None:
            for headers in ({"Authorization": "Bearer wrong"}, key):
                case.headers = {**(case.headers or {}), **headers}
                response = case.call(base_url=srv.url, session=session, timeout=30)
                _check_response(case, response)
                if headers is not key:
                    code = (_error_code(case.path, response) if response.status_code >= 400
                            else None)
                    statuses[(case.path, response.status_code, code)] += 1

        fuzz()
        for (path, status, code) in statuses:
            if path in ("/health", "/metrics"):
                assert status == 200
            else:
                want = "authentication_error" if _anthropic(path) else "invalid_api_key"
                assert (status, code) == (401, want), (path, status, code)
        assert srv.terminate() == 0
