"""The Messages API's stream writer on its own, over a scripted start and outputs: a start
slower than the ping interval (a long prefill) opens the stream with ``message_start`` and
keeps it alive with pings (the test reads them before it lets the start finish); a refusal
before that is an HTTP error, after it an ``error`` event; a quick start sends no extra pings."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import pytest
from aiohttp import web

from aioengine.server.anthropic.stream import write_stream
from aioengine.server.errors import ApiError
from aioengine.server.generate import Refused
from aioengine.server.responses import ChatFormat, ChoiceState
from tests.server.anthropic_sse import check_order, parse_events
from tests.server.app_server import post_once

pytestmark = pytest.mark.anyio
INTERVAL = 0.2  # s; the tests that wait for pings do not depend on it


def _output(tokens: int, text: str, finished: bool) -> Any:
    return SimpleNamespace(token_ids=list(range(tokens)), text=text, prompt_token_ids=[1] * 7,
                           num_cached_tokens=0, finished=finished,
                           finish_reason="stop" if finished else None, stop_reason=None,
                           delta_text=text[-1:] if text else "", logprobs=None)


async def _outputs() -> AsyncIterator[tuple[int, Any]]:
    yield 0, _output(1, "h", False)
    yield 0, _output(2, "hi", True)


async def _serve(start_delay: float, refuse: bool, pings_first: int = 0) -> tuple[int, str]:
    """One request to ``write_stream``; ``pings_first``: the start waits until the client has
    read that many pings (no timing: the stream must open and ping while it waits)."""
    gate = asyncio.Event()

    async def start() -> None:
        await asyncio.sleep(start_delay)
        if pings_first:
            await gate.wait()
        if refuse:
            raise Refused("rejected", ApiError(400, "prompt too long", param="messages"))

    async def handler(request: web.Request) -> web.StreamResponse:
        fmt = ChatFormat("tiny", str, lambda t: b"")
        try:
            resp, _ = await write_stream(request, fmt, start(), _outputs, ChoiceState(0), [],
                                         {}, ping_interval=INTERVAL)
        except Refused as e:  # as GenerateHandlers._run answers it
            raise e.error from e
        return resp

    return await post_once("/v1/messages", handler, gate, "event: ping", pings_first)


async def test_a_long_prefill_opens_the_stream_and_pings_until_the_first_token():
    status, raw = await _serve(start_delay=0.0, refuse=False, pings_first=3)
    assert status == 200, raw
    events = parse_events(raw)
    kinds = [e["type"] for e in events]
    assert kinds[0] == "message_start" and kinds.index("content_block_start") >= 4, kinds
    assert all(k == "ping" for k in kinds[1:kinds.index("content_block_start")])
    assert events[0]["message"]["usage"]["input_tokens"] == 0  # opened before any output
    assert check_order(events) == [{"type": "text", "text": "hi"}]
    assert events[-2]["usage"]["input_tokens"] == 7  # known by the end
    assert events[-2]["delta"]["stop_reason"] == "end_turn"


async def test_a_quick_start_sends_one_ping_after_message_start():
    status, raw = await _serve(start_delay=0.0, refuse=False)
    kinds = [e["type"] for e in parse_events(raw)]
    assert status == 200 and kinds[:3] == ["message_start", "ping", "content_block_start"]
    assert kinds.count("ping") == 1
    assert parse_events(raw)[0]["message"]["usage"]["input_tokens"] == 7


async def test_a_refusal_before_the_stream_opened_is_an_http_error():
    status, raw = await _serve(start_delay=0.0, refuse=True)
    assert status == 400 and '"type":"invalid_request_error"' in raw, raw


async def test_a_refusal_after_the_stream_opened_is_an_error_event():
    status, raw = await _serve(start_delay=0.0, refuse=True, pings_first=2)
    events = parse_events(raw)
    assert status == 200 and events[0]["type"] == "message_start"
    assert events[-1] == {"type": "error", "error": {"type": "invalid_request_error",
                                                      "message": "messages: prompt too long"}}
