"""A streaming client that stops reading holds up nobody: other streams finish at their own
pace, and the stalled one is aborted in the engine once it goes away."""

from __future__ import annotations

import asyncio
import json
import socket
import time

import aiohttp
import pytest

from tests.server.app_server import app_server
from tests.server.engine_setup import LONG_TOKENS

pytestmark = pytest.mark.anyio
SHORT = 64
HANG_GUARD = 60.0  # seconds; the waits below are for states that come at once


async def test_a_stalled_sse_reader_does_not_hold_up_other_streams(long_engine):
    # On an engine with tiny's whole context: the stalled request (LONG_TOKENS) cannot end on
    # its own before it is aborted, so "aborted once it goes away" is checked, not passed by
    # a request that had simply finished (480 tokens took ~0.9 s on a loaded box).
    engine = long_engine
    before = (await engine.get_stats()).generation_tokens_total
    async with app_server(engine) as server:
        host, port = server.host, server.port
        body = json.dumps({"prompt": "x", "max_tokens": LONG_TOKENS, "ignore_eos": True,
                           "stream": True, "logprobs": 5}).encode()
        stalled = socket.create_connection((host, port))
        stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # fills after a few chunks
        stalled.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: %s:%d\r\n"
                        b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                        % (host.encode(), port, len(body)) + body)
        try:
            # It runs in the engine (a state, where a 0.5 s sleep guessed it), streaming into a
            # socket nobody reads.
            deadline = time.monotonic() + HANG_GUARD
            while (await engine.get_stats()).num_running < 1:
                assert time.monotonic() < deadline, "the stalled request never ran"
                await asyncio.sleep(0.01)
            async with aiohttp.ClientSession() as s:
                for _ in range(3):
                    async with s.post(server.make_url("/v1/completions"),
                                      json={"prompt": "y", "max_tokens": SHORT,
                                            "ignore_eos": True}) as r:
                        assert r.status == 200
                        assert (await r.json())["choices"][0]["finish_reason"] == "length"
        finally:
            stalled.close()
        # The stalled request ends (the server sees the socket gone), aborted: cut short.
        deadline = time.monotonic() + HANG_GUARD
        while (stats := await engine.get_stats()).num_running != 0:
            assert time.monotonic() < deadline, "the stalled stream's request still runs"
            await asyncio.sleep(0.05)
    generated = stats.generation_tokens_total - before
    assert generated < LONG_TOKENS + 3 * SHORT, "the stalled request ran to its end"
