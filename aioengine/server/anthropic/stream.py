"""The Messages API's event stream, made from the chat format's stream deltas::

    message_start, ping,
    (content_block_start, content_block_delta*, content_block_stop)*,
    message_delta (stop_reason, usage), message_stop

Text arrives as ``text_delta``s of a ``text`` block; each tool call opens a ``tool_use`` block
whose input arrives as ``input_json_delta``s. A failure mid-stream is an ``error`` event.
While no output comes for ``event_stream.PING_INTERVAL`` seconds (a long prompt's prefill,
before the first token; a slow step later) a ``ping`` keeps the connection alive.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import msgspec
from aiohttp import web

from aioengine.server.anthropic.reply import (
    message,
    message_id,
    stop_reason,
    tool_use_id,
    usage,
)
from aioengine.server.errors import ApiError
from aioengine.server.event_stream import PING_INTERVAL, open_sse
from aioengine.server.event_stream import write_stream as write_events
from aioengine.server.responses import ChoiceState, Json


class EventWriter:
    """Writes one reply's events; keeps which content block is open."""

    def __init__(self, resp: web.StreamResponse, model: str, stop_sequences: list[str]) -> None:
        self.resp = resp
        self._model = model
        self._stops = stop_sequences
        self._index = -1
        self._open: str | None = None  # "text" | "tool_use"

    async def send(self, event: Json) -> None:
        await self.resp.write(b"event: " + event["type"].encode() + b"\ndata: "
                               + msgspec.json.encode(event) + b"\n\n")

    async def start(self, state: ChoiceState) -> None:
        await self.send({"type": "message_start",
                         "message": message(message_id(), self._model, [], state)})
        await self.send({"type": "ping"})

    async def _open_block(self, block: Json) -> None:
        await self.close_block()
        self._index += 1
        self._open = block["type"]
        await self.send({"type": "content_block_start", "index": self._index,
                         "content_block": block})

    async def close_block(self) -> None:
        if self._open is not None:
            await self.send({"type": "content_block_stop", "index": self._index})
            self._open = None

    async def delta(self, delta: Json) -> None:
        """One chat stream delta: text, a tool call's header, or a piece of its arguments."""
        if delta.get("content"):
            if self._open != "text":
                await self._open_block({"type": "text", "text": ""})
            await self.send({"type": "content_block_delta", "index": self._index,
                             "delta": {"type": "text_delta", "text": delta["content"]}})
        for call in delta.get("tool_calls") or []:
            if "id" in call:
                await self._open_block({"type": "tool_use", "id": tool_use_id(call["id"]),
                                        "name": call["function"]["name"], "input": {}})
            args = call["function"].get("arguments")
            if args:
                await self.send({"type": "content_block_delta", "index": self._index,
                                 "delta": {"type": "input_json_delta", "partial_json": args}})

    async def ping(self) -> None:
        await self.send({"type": "ping"})

    async def error(self, err: ApiError) -> None:
        await self.send(err.anthropic_body())

    async def finish(self, state: ChoiceState, finish_reason: str | None) -> None:
        stop = stop_reason(state, finish_reason, self._stops)
        await self.close_block()
        await self.send({"type": "message_delta",
                         "delta": {"stop_reason": stop[0], "stop_sequence": stop[1]},
                         "usage": usage(state)})
        await self.send({"type": "message_stop"})


async def write_stream(request: web.Request, fmt: Any, started: Awaitable[None],
                       events: Callable[[], AsyncIterator[tuple[int, Any]]], state: ChoiceState,
                       stop_sequences: list[str], headers: dict[str, str],
                       ping_interval: float = PING_INTERVAL) -> tuple[web.StreamResponse, str]:
    """Await ``started``, then write one choice's stream from ``fmt``'s deltas
    (``event_stream.write_stream``); returns the response and the outcome."""

    async def open_writer() -> EventWriter:
        return EventWriter(await open_sse(request, headers), fmt.model, stop_sequences)

    return await write_events(request, open_writer, fmt, started, events, state, ping_interval)
