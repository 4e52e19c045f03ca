"""The Responses API's stream writer on its own, over a scripted start and outputs: a start
slower than the keep-alive interval (a long prefill) opens the stream with ``response.created``
and keeps it alive with SSE comments (the test reads them before it lets the start finish); a
refusal before that is an HTTP error, after it a ``response.failed`` event; the final response
is handed to the store's callback; and the store's bounds."""

from __future__ import annotations

import asyncio
import json

import pytest
from aiohttp import web

from aioengine.server.errors import ApiError
from aioengine.server.event_stream import open_sse, write_stream
from aioengine.server.generate import Refused
from aioengine.server.openai_responses.reply import Reply
from aioengine.server.openai_responses.store import ResponseStore
from aioengine.server.openai_responses.stream import EventWriter
from aioengine.server.responses import ChatFormat, ChoiceState, Json
from aioengine.server.settings import ServerSettings
from tests.server.anthropic_sse import parse_events
from tests.server.app_server import post_once
from tests.server.responses_sse import check_order
from tests.server.test_messages_stream import INTERVAL, _outputs

KEEP_ALIVE = ": keep-alive"


async def _serve(refuse: bool, keep_alives_first: int = 0) -> tuple[int, str, list[Json]]:
    """One stream; ``keep_alives_first``: the start waits until the client has read that many
    keep-alive comments. Returns the status, the raw text, and what the store callback got."""
    gate = asyncio.Event()
    kept: list[Json] = []

    async def start() -> None:
        if keep_alives_first:
            await gate.wait()
        if refuse:
            raise Refused("rejected", ApiError(400, "prompt too long", param="input",
                                               code="invalid_parameter"))

    async def handler(request: web.Request) -> web.StreamResponse:
        fmt = ChatFormat("tiny", str, lambda t: b"")
        reply = Reply("tiny", {"store": True})

        async def open_writer() -> EventWriter:
            return EventWriter(await open_sse(request, {}), reply, kept.append)

        try:
            resp, _ = await write_stream(request, open_writer, fmt, start(), _outputs,
                                         ChoiceState(0), ping_interval=INTERVAL)
        except Refused as e:  # as GenerateHandlers._run answers it
            raise e.error from e
        return resp

    status, raw = await post_once("/v1/responses", handler, gate, KEEP_ALIVE,
                                  keep_alives_first)
    return status, raw, kept


def _events(raw: str) -> list[Json]:
    frames = [f for f in raw.split("\n\n") if f and not f.startswith(KEEP_ALIVE)]
    return parse_events("".join(f + "\n\n" for f in frames))


@pytest.mark.anyio
async def test_a_long_prefill_opens_the_stream_and_keeps_it_alive():
    status, raw, kept = await _serve(refuse=False, keep_alives_first=3)
    assert status == 200, raw
    assert raw.count(KEEP_ALIVE) >= 3
    events = _events(raw)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert events[0]["response"]["usage"] is None  # opened before any output
    (item,) = check_order(events)
    assert item["content"][0]["text"] == "hi"
    final = events[-1]
    assert final["type"] == "response.completed"
    assert final["response"]["usage"]["input_tokens"] == 7  # known by the end
    assert kept == [final["response"]]


@pytest.mark.anyio
async def test_a_refusal_before_the_stream_opened_is_an_http_error():
    status, raw, kept = await _serve(refuse=True)
    assert status == 400 and json.loads(raw)["error"]["param"] == "input", raw
    assert kept == []


@pytest.mark.anyio
async def test_a_refusal_after_the_stream_opened_is_a_failed_response():
    status, raw, kept = await _serve(refuse=True, keep_alives_first=2)
    events = _events(raw)
    assert status == 200 and [e["type"] for e in events] == [
        "response.created", "response.in_progress", "response.failed"]
    response = events[-1]["response"]
    assert response["status"] == "failed" and response["error"] == {
        "code": "invalid_parameter", "message": "prompt too long"}
    assert kept == []  # a failed response is not stored


def test_the_store_evicts_the_least_recently_used_past_its_count_and_bytes():
    store = ResponseStore(max_count=2, max_bytes=10_000)
    for rid in ("a", "b"):
        assert store.put(rid, [{"x": rid}], {"id": rid})
    assert store.get("a") is not None  # now the most recently used
    store.put("c", [], {"id": "c"})
    assert store.get("b") is None and store.get("a") is not None and len(store) == 2
    assert not store.put("big", ["x" * 20_000], {})  # alone over the bytes: not kept
    assert store.get("big") is None and len(store) == 2
    small = ResponseStore(max_count=100, max_bytes=300)
    for i in range(10):
        small.put(f"r{i}", ["y" * 50], {"id": i})
    assert 0 < small.bytes <= 300 and small.get("r0") is None and small.get("r9") is not None
    assert small.delete("r9") and not small.delete("r9")
    assert not ResponseStore(max_count=0, max_bytes=300).put("r", [], {})


@pytest.mark.parametrize("field", ["response_store_max_count", "response_store_max_bytes"])
def test_store_settings_are_checked(field):
    with pytest.raises(ValueError, match=field):
        ServerSettings(**{field: -1})
