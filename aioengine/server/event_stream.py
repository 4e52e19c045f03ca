"""One choice's reply streamed as another API's Server-Sent Events (the Messages API's, the
Responses API's) over the chat pipeline: the waiting for the start, keep-alives while nothing
comes, the chat format's deltas handed to an ``EventWriter``, and the failures it reports as
events. Only the events differ between the APIs: each writes its own ``EventWriter``.

A start that fails within ``ping_interval`` (a prompt too long, an overloaded engine)
propagates: an HTTP error. A start still waiting then (a long prefill) opens the stream (the
writer's ``start``, its usage not known yet), then a keep-alive each interval; a failure after
that is the writer's ``error`` event.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Protocol

from aiohttp import web

from aioengine import EngineDeadError
from aioengine.server.choices import ABORTED
from aioengine.server.deadline import RequestTimedOut, timed_out
from aioengine.server.errors import ApiError, engine_dead, first_line
from aioengine.server.generate import GenerationFailed, Refused
from aioengine.server.responses import ChoiceState, Json

PING_INTERVAL = 10.0  # seconds without output before a keep-alive
_PING = object()


class EventWriter(Protocol):
    """One API's events for one reply."""

    resp: web.StreamResponse

    async def start(self, state: ChoiceState) -> None:
        """The opening events (the reply's usage may not be known yet)."""

    async def ping(self) -> None:
        """A keep-alive while nothing comes."""

    async def delta(self, delta: Json) -> None:
        """One chat stream delta: text, a tool call's header, or a piece of its arguments."""

    async def finish(self, state: ChoiceState, finish_reason: str | None) -> None:
        """The closing events; ``finish_reason`` is the chat format's (``tool_calls`` once
        calls were parsed)."""

    async def error(self, err: ApiError) -> None:
        """A failure after the stream opened."""


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


async def open_sse(request: web.Request, headers: dict[str, str]) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8",
                                       "Cache-Control": "no-cache", "X-Accel-Buffering": "no",
                                       **headers})
    await resp.prepare(request)
    return resp


async def write_stream(request: web.Request, open_writer: Callable[[], Awaitable[EventWriter]],
                       fmt: Any, started: Awaitable[None],
                       events: Callable[[], AsyncIterator[tuple[int, Any]]], state: ChoiceState,
                       ping_interval: float = PING_INTERVAL) -> tuple[web.StreamResponse, str]:
    """Await ``started``, then write one choice's stream from ``fmt``'s deltas through the
    writer ``open_writer`` opens (it prepares the response); returns the response and the
    outcome."""
    waiting = asyncio.ensure_future(started)
    out: EventWriter | None = None
    try:
        while not (await asyncio.wait({waiting}, timeout=ping_interval))[0]:
            if out is None:
                out = await open_writer()
                await out.start(state)
            else:
                await out.ping()
        waiting.result()
    except Refused as e:
        if out is None:
            raise
        await out.error(e.error)
        await out.resp.write_eof()
        return out.resp, e.outcome
    except ConnectionResetError:
        assert out is not None
        return out.resp, "disconnected"
    finally:
        if not waiting.done():
            waiting.cancel()
    opened = out is not None
    out = out or await open_writer()
    return await _write(out, fmt, events(), state, ping_interval, opened)


async def _write(out: EventWriter, fmt: Any, events: AsyncIterator[tuple[int, Any]],
                 state: ChoiceState, ping_interval: float, started: bool
                 ) -> tuple[web.StreamResponse, str]:
    outcome = "error"
    finish: str | None = None
    try:
        try:
            async for item in with_pings(events, ping_interval):
                if item is _PING:
                    await out.ping()
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
            await out.finish(state, finish)
            outcome = state.finish_reason or "abort"
        except EngineDeadError as e:
            outcome = "engine_dead"
            await out.error(engine_dead(e))
        except GenerationFailed as e:
            await out.error(ApiError(500, f"generation failed in the engine: {first_line(e)}",
                                     code="generation_error"))
        except RequestTimedOut as e:
            outcome = "timeout"
            await out.error(timed_out(e))
        await out.resp.write_eof()
    except ConnectionResetError:  # the client went away mid-stream: the caller aborts
        return out.resp, "disconnected"
    return out.resp, outcome
