"""A huge prompt is tokenized off the event loop: the server keeps answering while it works,
then refuses the prompt as too long for the context."""

from __future__ import annotations

import asyncio
import itertools
import time

import aiohttp
from aiohttp.test_utils import TestServer

from aioengine.server import ServerSettings, create_app

BIG = "ab " * 2_600_000  # 7.8 MB: ~3.5 s of tokenizer time per 3.9 MB on the 2-core box


async def _health_gaps(url: str, stop: asyncio.Event) -> list[float]:
    """Seconds between successive /health answers (one asked for every 50 ms). The probe
    shares the server's loop, so a stalled loop shows as one long gap."""
    answered = [time.perf_counter()]
    async with aiohttp.ClientSession() as s:
        while not stop.is_set():
            async with s.get(url) as resp:
                assert resp.status == 200
            answered.append(time.perf_counter())
            await asyncio.sleep(0.05)
    return [b - a for a, b in itertools.pairwise(answered)]


async def test_huge_chat_message_does_not_stall_the_server(engine):
    srv = TestServer(create_app(engine, ServerSettings(max_request_bytes=16 << 20)),
                     host="127.0.0.1")
    await srv.start_server()
    try:
        stop = asyncio.Event()
        probe = asyncio.create_task(_health_gaps(str(srv.make_url("/health")), stop))
        await asyncio.sleep(0.2)
        body = {"messages": [{"role": "user", "content": BIG}], "max_tokens": 2}
        t0 = time.perf_counter()
        async with aiohttp.ClientSession() as s, \
                s.post(srv.make_url("/v1/chat/completions"), json=body) as resp:
            assert resp.status == 400
            assert "longer than the model's context" in (await resp.json())["error"]["message"]
        took = time.perf_counter() - t0
        stop.set()
        gaps = await probe
        # Tokenizing on the loop answered nothing for the whole time it took (several
        # seconds); in a thread, /health keeps answering within a fraction of it.
        assert len(gaps) >= 5 and max(gaps) < took / 2, (took, max(gaps))
    finally:
        await srv.close()
