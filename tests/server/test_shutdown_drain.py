"""Shutting the app down with requests in flight: they get the grace period, then they are
aborted, and every client still receives a complete answer (``finish_reason: "abort"`` and
``data: [DONE]``) instead of a connection cut mid-stream."""

from __future__ import annotations

import asyncio
import json
import time

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from aioengine.server import ServerSettings, create_app
from tests.server.engine_setup import LONG_TOKENS
from tests.server.server_sse import chunks, read_events

pytestmark = pytest.mark.anyio

# ignore_eos: only an abort ends it before the shutdown returns. On the module's long engine
# (tiny's whole context) such a request decodes for seconds even on an idle box, so the
# stream's two choices are still running while the chat request is templated, tokenized and
# admitted (with 480 tokens, ~0.9 s on a loaded box, they could end "length" first).
LONG = LONG_TOKENS
HANG_GUARD = 60.0  # seconds; the waits below return as soon as their state is reached


async def _wait_running(engine, count: int) -> None:
    deadline = time.monotonic() + HANG_GUARD
    while True:
        stats = await engine.get_stats()
        if stats.num_running >= count:
            return
        assert time.monotonic() < deadline, f"{count} requests never ran in the engine: {stats}"
        await asyncio.sleep(0.01)


async def _wait_idle(engine) -> None:
    deadline = time.monotonic() + HANG_GUARD
    while True:
        stats = await engine.get_stats()
        if stats.num_running == 0 and stats.num_waiting == 0:
            return
        assert time.monotonic() < deadline, f"requests still held after the shutdown: {stats}"
        await asyncio.sleep(0.05)


@pytest.mark.parametrize("mounted", [False, True], ids=["app", "sub-app"])
async def test_shutdown_aborts_what_outlives_the_grace_period(long_engine, mounted):
    engine = long_engine
    api = create_app(engine, ServerSettings(shutdown_grace_period=0.0))
    app = api
    prefix = ""
    if mounted:  # the host's shutdown reaches a mounted app too
        app, prefix = web.Application(), "/llm"
        app.add_subapp(prefix, api)
    srv = TestServer(app, host="127.0.0.1")
    await srv.start_server()
    stream_body = {"prompt": "x", "max_tokens": LONG, "ignore_eos": True, "stream": True,
                   "n": 2}
    chat_body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": LONG,
                 "ignore_eos": True}
    async with aiohttp.ClientSession() as s:
        try:
            stream = await s.post(srv.make_url(prefix + "/v1/completions"), json=stream_body)
            await stream.content.readuntil(b"\n\n")  # the first token is out
            whole = asyncio.ensure_future(
                s.post(srv.make_url(prefix + "/v1/chat/completions"), json=chat_body))
            await _wait_running(engine, 3)
        finally:
            await srv.close()
        data = await read_events(stream)  # complete: ends with data: [DONE]
        finish = {}
        for c in chunks(data):
            for choice in c["choices"]:
                if choice["finish_reason"] is not None:
                    finish[choice["index"]] = choice["finish_reason"]
        assert finish == {0: "abort", 1: "abort"}, data[-4:]
        resp = await whole
        assert resp.status == 200, await resp.text()
        body = json.loads(await resp.text())
        assert body["choices"][0]["finish_reason"] == "abort"
        assert body["usage"]["completion_tokens"] < LONG
    await _wait_idle(engine)


async def test_requests_that_finish_within_the_grace_period_are_untouched(engine):
    srv = TestServer(create_app(engine, ServerSettings(shutdown_grace_period=120.0)),
                     host="127.0.0.1")
    await srv.start_server()
    body = {"prompt": "x", "max_tokens": 40, "ignore_eos": True, "stream": True}
    async with aiohttp.ClientSession() as s:
        try:
            stream = await s.post(srv.make_url("/v1/completions"), json=body)
            await stream.content.readuntil(b"\n\n")
        finally:
            await srv.close()  # returns once the stream has run to its end
        parsed = chunks(await read_events(stream))
    assert parsed[-1]["choices"][0]["finish_reason"] == "length"


def test_shutdown_grace_period_is_validated():
    with pytest.raises(ValueError, match="shutdown_grace_period must be >= 0, got -1"):
        ServerSettings(shutdown_grace_period=-1)
