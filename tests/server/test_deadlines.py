"""Request deadlines: --request-timeout and a request's own ``timeout`` abort it in the engine
and answer 504 ``timeout`` (an error event when streaming); the engine goes on serving."""

from __future__ import annotations

import asyncio
import json
import time

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from aioengine.server import ServerSettings, create_app

pytestmark = pytest.mark.anyio
LONG = {"prompt": "x", "max_tokens": 500, "ignore_eos": True}  # seconds of decoding on tiny


async def _idle(engine) -> None:
    # A wait for the state; 60 s is only a hang guard (an abort lands in milliseconds).
    deadline = time.monotonic() + 60
    while (await engine.get_stats()).num_running != 0:
        assert time.monotonic() < deadline, "the timed-out request still runs in the engine"
        await asyncio.sleep(0.05)


@pytest.fixture
async def timed(engine):
    srv = TestServer(create_app(engine, ServerSettings(request_timeout=0.2)), host="127.0.0.1")
    await srv.start_server()
    try:
        yield srv
    finally:
        await srv.close()


async def test_server_timeout_answers_504_and_aborts(timed, engine, server):
    async with aiohttp.ClientSession() as s:
        t0 = time.monotonic()
        async with s.post(timed.make_url("/v1/completions"), json=LONG) as r:
            assert r.status == 504, await r.text()
            err = (await r.json())["error"]
        assert time.monotonic() - t0 < 30  # well before 400 tokens could finish
        assert err["code"] == "timeout" and err["type"] == "timeout_error"
        assert "--request-timeout of 0.2 s" in err["message"]
        await _idle(engine)
        # The engine goes on serving after the abort. Asked through the module's server (same
        # engine, no --request-timeout): on the 0.2 s server even a 2-token request (three
        # processes, two steps) can take longer than that on a loaded box.
        async with s.post(server.make_url("/v1/completions"),
                          json={"prompt": "x", "max_tokens": 2, "ignore_eos": True}) as r:
            assert r.status == 200, await r.text()
            assert (await r.json())["choices"][0]["finish_reason"] == "length"


async def test_streamed_timeout_is_an_error_event(timed, engine):
    async with aiohttp.ClientSession() as s, \
            s.post(timed.make_url("/v1/chat/completions"),
                   json={"messages": [{"role": "user", "content": "hi"}], "stream": True,
                         "max_tokens": 480, "ignore_eos": True}) as r:
        assert r.status == 200
        events = (await r.read()).decode().split("\n\n")
    assert events[-2:] == ["data: [DONE]", ""]
    err = json.loads(events[-3][len("data: "):])["error"]
    assert err["code"] == "timeout"
    await _idle(engine)


async def test_a_requests_own_timeout_shortens_the_servers(server, engine):
    async with aiohttp.ClientSession() as s:
        async with s.post(server.make_url("/v1/completions"), json=dict(LONG, timeout=0.1)) \
                as r:
            assert r.status == 504
            assert "its timeout of 0.1 s" in (await r.json())["error"]["message"]
        async with s.post(server.make_url("/v1/completions"), json=dict(LONG, timeout=0)) as r:
            assert r.status == 400  # must be positive
        await _idle(engine)
