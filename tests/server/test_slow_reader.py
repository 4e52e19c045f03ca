"""A streaming client that stops reading holds up nobody: other streams finish at their own
pace, and the stalled one is aborted in the engine once it goes away."""

from __future__ import annotations

import asyncio
import json
import socket

import aiohttp
import pytest

pytestmark = pytest.mark.anyio


async def test_a_stalled_sse_reader_does_not_hold_up_other_streams(server, engine):
    host, port = server.host, server.port
    body = json.dumps({"prompt": "x", "max_tokens": 480, "ignore_eos": True,
                       "stream": True, "logprobs": 5}).encode()
    stalled = socket.create_connection((host, port))
    stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # fills after a few chunks
    stalled.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: %s:%d\r\n"
                    b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                    % (host.encode(), port, len(body)) + body)
    try:
        await asyncio.sleep(0.5)  # it is streaming into a socket nobody reads
        async with aiohttp.ClientSession() as s:
            for _ in range(3):
                async with s.post(server.make_url("/v1/completions"),
                                  json={"prompt": "y", "max_tokens": 64, "ignore_eos": True}) \
                        as r:
                    assert r.status == 200
                    assert (await r.json())["choices"][0]["finish_reason"] == "length"
    finally:
        stalled.close()
    for _ in range(200):  # the stalled request ends (the server sees the socket gone)
        if (await engine.get_stats()).num_running == 0:
            break
        await asyncio.sleep(0.05)
    else:
        raise AssertionError("the stalled stream's request still runs")
