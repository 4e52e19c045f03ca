"""Huge prompts: one that cannot fit the context is refused before it is tokenized; a long text
that must be tokenized is tokenized off the event loop, so the server keeps answering."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp.test_utils import TestServer

from aioengine.server import ServerSettings
from tests.server.app_server import app_server

Probe = tuple[list[float], Callable[[], Awaitable[list[float]]]]
BIG = "ab " * 2_600_000  # 7.8 MB: ~3.5 s of tokenizer time per 3.9 MB on the 2-core box
HANG_GUARD = 60.0  # seconds; only for waits on a state that should come at once


async def _health_probe(url: str, stop: asyncio.Event, answered: list[float]) -> None:
    """Asks for /health every 50 ms and appends the time of each answer to ``answered``. The
    probe shares the server's loop, so a stalled loop answers nothing."""
    async with aiohttp.ClientSession() as s:
        while not stop.is_set():
            async with s.get(url) as resp:
                assert resp.status == 200
            answered.append(time.perf_counter())
            await asyncio.sleep(0.05)


@asynccontextmanager
async def _probed_server(engine) -> AsyncIterator[tuple[TestServer, Probe]]:
    """The app (16 MB bodies) with a /health probe running; the second item is the probe's
    answer times (growing) and a function that stops it and returns the gaps between them."""
    async with app_server(engine, ServerSettings(max_request_bytes=16 << 20)) as srv:
        stop = asyncio.Event()
        answered = [time.perf_counter()]
        probe = asyncio.create_task(_health_probe(str(srv.make_url("/health")), stop, answered))

        async def gaps() -> list[float]:
            stop.set()
            await probe
            return [b - a for a, b in itertools.pairwise(answered)]

        try:
            yield srv, (answered, gaps)
        finally:
            await gaps()


def _on_a_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


@dataclass
class EncodeCall:
    chars: int
    on_loop: bool  # called in a thread that runs an event loop
    answered_during: int  # /health answers while the real encode ran (the most of its tries)


@contextmanager
def _spy_encode(tokenizer, answered: list[float] | None = None,
                want_answers: int = 0) -> Iterator[list[EncodeCall]]:
    """Records every ``tokenizer.encode`` (the one way the host tokenizes a text: prompts,
    chat templates' output and /tokenize). With ``want_answers``: an encode called off the loop
    is repeated (same text, same ids) until the loop answered that many probes during one
    run of it (a state; HANG_GUARD is only a hang guard): an encode that holds the GIL, or
    runs on the loop, never lets it."""
    real = tokenizer.encode
    calls: list[EncodeCall] = []

    def encode(text: str, *args: Any, **kwargs: Any) -> list[int]:
        on_loop = _on_a_loop()
        deadline = time.monotonic() + HANG_GUARD
        most = 0
        while True:
            before = len(answered) if answered is not None else 0
            ids = real(text, *args, **kwargs)
            if answered is not None:
                most = max(most, len(answered) - before)
            if on_loop or most >= want_answers or time.monotonic() > deadline:
                break
        calls.append(EncodeCall(len(text), on_loop, most))
        return ids

    tokenizer.encode = encode
    try:
        yield calls
    finally:
        del tokenizer.encode  # the class's method again


async def test_huge_chat_message_is_refused_before_tokenizing(engine):
    """A message that cannot fit the context (bytes / the tokenizer's longest token > the
    context) is refused without being tokenized: tokenizing this one took ~7 s of tokenizer
    time and ~1 GB; /health keeps answering throughout."""
    assert engine.tokenizer.max_token_bytes is not None  # tiny's byte-level BPE: a bound
    async with _probed_server(engine) as (srv, (_, health_gaps)):
        with _spy_encode(engine.tokenizer) as encoded:
            body = {"messages": [{"role": "user", "content": BIG}], "max_tokens": 2}
            async with aiohttp.ClientSession() as s:
                async with s.post(srv.make_url("/v1/chat/completions"), json=body) as resp:
                    assert resp.status == 400
                    message = (await resp.json())["error"]["message"]
                # Not tokenized: the tokenizer was never asked (the state, where the test
                # used to time it: < 4 s against ~7 s, which a loaded box blurs).
                assert encoded == [], encoded
                # ... and the spy is on the path a chat request takes: one that fits is.
                small = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
                async with s.post(srv.make_url("/v1/chat/completions"), json=small) as resp:
                    assert resp.status == 200, await resp.text()
                assert len(encoded) == 1, encoded
        gaps = await health_gaps()
    assert "prompt has at least" in message and "longer than the model's context" in message
    # The loop kept answering: decoding the 7.8 MB body and rendering the template stall it for
    # a fraction of a second. A hang guard, not a timing: tokenizing on the loop (the state
    # the spy rules out) would stall it ~7 s idle, far more on a loaded box.
    assert max(gaps) < 10.0, gaps


async def test_long_text_is_tokenized_off_the_loop(engine):
    """A text with no refusal before tokenizing (/tokenize counts any prompt) is tokenized in a
    thread: the server keeps answering while it works."""
    text = "ab " * 400_000  # 1.2 MB
    count = len(engine.tokenizer.encode(text))
    async with _probed_server(engine) as (srv, (answered, health_gaps)):
        with _spy_encode(engine.tokenizer, answered, want_answers=2) as encoded:
            async with aiohttp.ClientSession() as s, \
                    s.post(srv.make_url("/tokenize"), json={"prompt": text}) as resp:
                assert resp.status == 200
                assert (await resp.json())["count"] == count
        await health_gaps()
    # Tokenizing on the loop would answer nothing while it works; in a thread (with the GIL
    # released) the loop answers /health meanwhile. Counted, not timed: the spy re-runs the
    # encode until two answers came during one run (see _spy_encode).
    [call] = encoded
    assert call.chars == len(text) and not call.on_loop, call
    assert call.answered_during >= 2, call
