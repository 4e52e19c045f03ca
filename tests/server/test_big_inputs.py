"""Huge prompts: one that cannot fit the context is refused before it is tokenized; a long text
that must be tokenized is tokenized off the event loop, so the server keeps answering."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import aiohttp
from aiohttp.test_utils import TestServer

from aioengine.server import ServerSettings
from tests.server.app_server import app_server

Gaps = Callable[[], Awaitable[list[float]]]
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


@asynccontextmanager
async def _probed_server(engine) -> AsyncIterator[tuple[TestServer, Gaps]]:
    """The app (16 MB bodies) with a /health probe running; the second item stops the probe
    and returns its gaps."""
    async with app_server(engine, ServerSettings(max_request_bytes=16 << 20)) as srv:
        stop = asyncio.Event()
        probe = asyncio.create_task(_health_gaps(str(srv.make_url("/health")), stop))
        await asyncio.sleep(0.2)

        async def gaps() -> list[float]:
            stop.set()
            return await probe

        try:
            yield srv, gaps
        finally:
            await gaps()


async def test_huge_chat_message_is_refused_before_tokenizing(engine):
    """A message that cannot fit the context (bytes / the tokenizer's longest token > the
    context) is refused without being tokenized: tokenizing this one took ~7 s of tokenizer
    time and ~1 GB; /health keeps answering throughout."""
    assert engine.tokenizer.max_token_bytes is not None  # tiny's byte-level BPE: a bound
    async with _probed_server(engine) as (srv, health_gaps):
        body = {"messages": [{"role": "user", "content": BIG}], "max_tokens": 2}
        t0 = time.perf_counter()
        async with aiohttp.ClientSession() as s, \
                s.post(srv.make_url("/v1/chat/completions"), json=body) as resp:
            assert resp.status == 400
            message = (await resp.json())["error"]["message"]
        took = time.perf_counter() - t0
        gaps = await health_gaps()
    assert "prompt has at least" in message and "longer than the model's context" in message
    # decoding the body and rendering the template, no tokenizing (~7 s here); the margin is for
    # the other xdist worker's load on the same cores
    assert took < 4.0, took
    assert max(gaps) < 1.0, gaps


async def test_long_text_is_tokenized_off_the_loop(engine):
    """A text with no refusal before tokenizing (/tokenize counts any prompt) is tokenized in a
    thread: the server keeps answering while it works."""
    text = "ab " * 400_000  # 1.2 MB
    count = len(engine.tokenizer.encode(text))
    async with _probed_server(engine) as (srv, health_gaps):
        t0 = time.perf_counter()
        async with aiohttp.ClientSession() as s, \
                s.post(srv.make_url("/tokenize"), json={"prompt": text}) as resp:
            assert resp.status == 200
            assert (await resp.json())["count"] == count
        took = time.perf_counter() - t0
        gaps = await health_gaps()
    # Tokenizing on the loop answered nothing for the whole time it took; in a thread,
    # /health keeps answering within a fraction of it.
    assert len(gaps) >= 5 and max(gaps) < took / 2, (took, max(gaps))
