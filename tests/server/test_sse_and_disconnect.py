"""Raw HTTP: SSE framing, clients that disconnect mid-request, and 200 concurrent streams."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest

from tests.server.app_server import app_server
from tests.server.engine_setup import LONG_TOKENS
from tests.server.server_sse import chunks, read_events

pytestmark = pytest.mark.anyio


async def test_sse_framing_chat(server):
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 6, "stream": True,
            "stream_options": {"include_usage": True}}
    async with aiohttp.ClientSession() as s, \
            s.post(server.make_url("/v1/chat/completions"), json=body) as resp:
        assert resp.headers["Cache-Control"] == "no-cache"
        data = await read_events(resp)
    parsed = chunks(data)
    assert len({c["id"] for c in parsed}) == 1
    assert all(c["object"] == "chat.completion.chunk" for c in parsed)
    assert parsed[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert parsed[-1]["choices"] == [] and parsed[-1]["usage"]["completion_tokens"] >= 1
    assert parsed[-2]["choices"][0]["finish_reason"] in ("stop", "length")


async def test_sse_framing_completions(server):
    body = {"prompt": "abc", "max_tokens": 4, "stream": True}
    async with aiohttp.ClientSession() as s, \
            s.post(server.make_url("/v1/completions"), json=body) as resp:
        parsed = chunks(await read_events(resp))
    assert all(c["object"] == "text_completion" and "usage" not in c for c in parsed)
    assert parsed[-1]["choices"][0]["finish_reason"] in ("stop", "length")


# Waits for a state; the bound is a hang guard only (generous: a loaded box is slow).
async def _wait_idle(engine, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while True:
        stats = await engine.get_stats()
        if stats.num_running == 0 and stats.num_waiting == 0:
            return stats
        assert time.monotonic() < deadline, f"requests still held: {stats}"
        await asyncio.sleep(0.05)


async def _wait_busy(engine, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        stats = await engine.get_stats()
        if stats.num_running + stats.num_waiting > 0:
            return
        assert time.monotonic() < deadline, "the request never reached the engine"
        await asyncio.sleep(0.01)


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "non-stream"])
async def test_disconnect_aborts_the_request(long_engine, stream):
    # On an engine with tiny's whole context: LONG_TOKENS steps take seconds even on an idle
    # box, so the disconnect -> abort (milliseconds of this loop's work) lands long before the
    # natural end (with 480 tokens, ~0.9 s on a loaded box, a stall of this process could
    # outlast the request and read as "not aborted").
    engine = long_engine
    before = await _wait_idle(engine)
    body = {"prompt": "x", "max_tokens": LONG_TOKENS, "ignore_eos": True, "stream": stream}
    async with app_server(engine) as server:
        session = aiohttp.ClientSession()
        post = asyncio.ensure_future(session.post(server.make_url("/v1/completions"),
                                                  json=body))
        try:
            if stream:
                resp = await post
                assert resp.status == 200
                await resp.content.readuntil(b"\n\n")  # the first token is out
            else:  # no response before the end: wait until the engine has the request
                await _wait_busy(engine)
                post.cancel()
        finally:
            await session.close()  # drops the connection mid-request
        after = await _wait_idle(engine)
    generated = after.generation_tokens_total - before.generation_tokens_total
    assert generated < LONG_TOKENS, "the request ran to the end: it was not aborted"


async def test_two_hundred_concurrent_streams(server, engine):
    async def one(session: aiohttp.ClientSession, i: int) -> list[str]:
        body = {"prompt": f"request {i}", "max_tokens": 6, "stream": True}
        async with session.post(server.make_url("/v1/completions"), json=body) as resp:
            return await read_events(resp)

    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        results = await asyncio.gather(*(one(session, i) for i in range(200)))
    for data in results:
        parsed = chunks(data)
        assert parsed[-1]["choices"][0]["finish_reason"] in ("stop", "length")
    await _wait_idle(engine)
