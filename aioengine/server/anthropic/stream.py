"""The Messages API's event stream, made from the chat format's stream deltas::

    message_start, ping,
    (content_block_start, content_block_delta*, content_block_stop)*,
    message_delta (stop_reason, usage), message_stop

Text arrives as ``text_delta``s of a ``text`` block; each tool call opens a ``tool_use`` block
whose input arrives as ``input_json_delta``s. A failure mid-stream is an ``error`` event.
While no output comes for ``PING_INTERVAL`` seconds (a long prompt's prefill, before the first
token; a slow step later) a ``ping`` keeps the connection alive.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import msgspec
from aiohttp import web

from aioengine import EngineDeadError
from aioengine.server.anthropic.reply import (
    message,
    message_id,
    stop_reason,
    tool_use_id,
    usage,
)
from aioengine.server.choices import ABORTED
from aioengine.server.deadline import RequestTimedOut, timed_out
from aioengine.server.errors import ApiError, engine_dead, first_line
from aioengine.server.generate import GenerationFailed, Refused
from aioengine.server.responses import ChoiceState, Json

PING_INTERVAL = 10.0  # seconds without output before a ping
_PING = object()


async def with_pings(events: AsyncIterator[Any], interval: float) -> AsyncIterator[Any]:
    """``events``, with ``_PING`` after each ``interval`` seconds that brought none. The
    pending step is never cancelled by a tick (that would close ``events``)."""
    step: asyncio.Future[Any] | None = None
    try:
        while True:
            if step is None:
                step = asyncio.ensure_future(anext(events))
            done, _ = await asyncio.wait({step}, timeout=interval)
            if not done:
                yield _PING
                continue
            try:
                item = step.result()
            except StopAsyncIteration:
                return
            step = None
            yield item
    finally:
        if step is not None and not step.done():
            step.cancel()
            with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
                await step


class EventWriter:
    """Writes one reply's events; keeps which content block is open."""

    def __init__(self, resp: web.StreamResponse, model: str) -> None:
        self.resp = resp
        self._model = model
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

    async def finish(self, state: ChoiceState, stop: tuple[str, str | None]) -> None:
        await self.close_block()
        await self.send({"type": "message_delta",
                         "delta": {"stop_reason": stop[0], "stop_sequence": stop[1]},
                         "usage": usage(state)})
        await self.send({"type": "message_stop"})


async def write_stream(request: web.Request, fmt: Any, started: Awaitable[None],
                       events: Callable[[], AsyncIterator[tuple[int, Any]]], state: ChoiceState,
                       stop_sequences: list[str], headers: dict[str, str],
                       ping_interval: float = PING_INTERVAL) -> tuple[web.StreamResponse, str]:
    """Await ``started``, then write one choice's stream from ``fmt``'s deltas; returns the
    response and the outcome. A start that fails within ``ping_interval`` (a prompt too long,
    an overloaded engine) propagates: an HTTP error. A start still waiting then (a long
    prefill) opens the stream: ``message_start`` (its usage not known yet), then a ``ping``
    each interval; a failure after that is an ``error`` event."""
    waiting = asyncio.ensure_future(started)
    out: EventWriter | None = None
    try:
        while not (await asyncio.wait({waiting}, timeout=ping_interval))[0]:
            if out is None:
                out = await _open(request, fmt, headers)
                await out.start(state)
            else:
                await out.send({"type": "ping"})
        waiting.result()
    except Refused as e:
        if out is None:
            raise
        await out.send(e.error.anthropic_body())
        await out.resp.write_eof()
        return out.resp, e.outcome
    except ConnectionResetError:
        assert out is not None
        return out.resp, "disconnected"
    finally:
        if not waiting.done():
            waiting.cancel()
    opened = out is not None
    out = out or await _open(request, fmt, headers)
    return await _write(out, fmt, events(), state, stop_sequences, ping_interval, opened)


async def _open(request: web.Request, fmt: Any, headers: dict[str, str]) -> EventWriter:
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8",
                                       "Cache-Control": "no-cache", "X-Accel-Buffering": "no",
                                       **headers})
    await resp.prepare(request)
    return EventWriter(resp, fmt.model)


async def _write(out: EventWriter, fmt: Any, events: AsyncIterator[tuple[int, Any]],
                 state: ChoiceState, stop_sequences: list[str], ping_interval: float,
                 started: bool) -> tuple[web.StreamResponse, str]:
    outcome = "error"
    finish: str | None = None
    try:
        try:
            async for item in with_pings(events, ping_interval):
                if item is _PING:
                    await out.send({"type": "ping"})
                    continue
                _, output = item
                if output is ABORTED:
                    if not state.abort():
                        continue
                    text = ""
                else:
                    text, _ = state.update(output)
                if not started:
                    await out.start(state)
                    started = True
                for choice in fmt.delta_choices(0, text, None, state.finish_reason):
                    await out.delta(choice["delta"])
                    finish = choice["finish_reason"] or finish
            if not started:
                await out.start(state)
            await out.finish(state, stop_reason(state, finish, stop_sequences))
            outcome = state.finish_reason or "abort"
        except EngineDeadError as e:
            outcome = "engine_dead"
            await out.send(engine_dead(e).anthropic_body())
        except GenerationFailed as e:
            await out.send(ApiError(500, f"generation failed in the engine: {first_line(e)}",
                                    code="generation_error").anthropic_body())
        except RequestTimedOut as e:
            outcome = "timeout"
            await out.send(timed_out(e).anthropic_body())
        await out.resp.write_eof()
    except ConnectionResetError:  # the client went away mid-stream: the caller aborts
        return out.resp, "disconnected"
    return out.resp, outcome
