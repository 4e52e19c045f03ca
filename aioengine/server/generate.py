"""``POST /v1/chat/completions`` and ``POST /v1/completions``: validate, start the choices,
then answer with one JSON body or a Server-Sent Events stream ending in ``data: [DONE]``.

Everything is checked before the first output is awaited on; the client refuses bad prompts
before they reach the engine; so a rejected request costs the engine nothing. A client that
goes away (a failed write, or the disconnect watcher) cancels the choices, which aborts them.
At shutdown ``drain()`` gives the requests in flight a grace period, then aborts the rest: their
clients still get a whole answer, ending with ``finish_reason: "abort"``.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, Protocol

import msgspec
from aiohttp import web

from aioengine import AsyncMPClient, EngineDeadError, EngineOverloadedError, SamplingParams
from aioengine.server.body import read_body
from aioengine.server.choices import ABORTED, ChoiceRunner
from aioengine.server.deadline import Deadline, RequestTimedOut, timed_out
from aioengine.server.disconnect import DisconnectWatcher
from aioengine.server.errors import ApiError, engine_dead, first_line, from_value_error
from aioengine.server.metrics import ServerMetrics
from aioengine.server.params import (
    chat_params,
    check_messages,
    completion_params,
    completion_prompts,
    seeded,
)
from aioengine.server.protocol import (
    CHAT_DECODER,
    COMPLETION_DECODER,
    ChatCompletionRequest,
    CompletionRequest,
)
from aioengine.server.responses import (
    TOKEN_CACHE,
    ChatFormat,
    ChoiceState,
    CompletionFormat,
    Json,
    Logprobs,
    TokenText,
    usage,
)
from aioengine.server.structured_fields import with_structured_fields
from aioengine.server.tool_prompts import chat_inputs
from aioengine.server.tool_replies import ToolChatFormat
from aioengine.server.tools import plan_tools
from aioengine.server.unknown_fields import RequestDecoder, ignored_header

logger = logging.getLogger(__name__)

RETRY_AFTER_S = "1"  # a refused request's hint: the queue moves within about a second

_SEVERITY = {None: 0, "stop": 1, "length": 2, "abort": 3, "error": 4}
_ABORT_WRITE_TIMEOUT = 5.0  # after an abort at shutdown: time left to write the endings


class GenerationFailed(Exception):
    """A choice finished with ``finish_reason="error"``; the message is the engine's."""


class Renderer(Protocol):
    """Another API's reply over the chat pipeline: one choice's whole body, or its stream."""

    def full(self, states: list[ChoiceState]) -> Json: ...

    async def stream(self, request: web.Request, started: Awaitable[None],
                     events: Callable[[], AsyncIterator[tuple[int, Any]]],
                     states: list[ChoiceState], headers: dict[str, str]
                     ) -> tuple[web.StreamResponse, str]:
        """Await ``started`` (``Refused`` before the stream opened propagates: an HTTP error),
        then write ``events()``; returns the response and the outcome (as ``_stream``)."""
        ...


MakeRenderer = Callable[[ChatFormat], Renderer]


class GenerateHandlers:
    def __init__(self, client: AsyncMPClient, *, model_name: str, max_request_bytes: int,
                 default_max_tokens: int, metrics: ServerMetrics, watcher: DisconnectWatcher,
                 token_text: TokenText, tokenizer: Any,
                 request_timeout: float | None = None, tool_call_parser: str = "hermes",
                 strict_request_fields: bool = False) -> None:
        self._client = client
        self._tool_call_parser = tool_call_parser
        self._chat_decoder = RequestDecoder(ChatCompletionRequest, CHAT_DECODER,
                                            strict=strict_request_fields)
        self._completion_decoder = RequestDecoder(CompletionRequest, COMPLETION_DECODER,
                                                  strict=strict_request_fields)
        self._request_timeout = request_timeout
        self._model = model_name
        self._limit = max_request_bytes
        self._default_max_tokens = default_max_tokens
        self._metrics = metrics
        self._watcher = watcher
        self._token_text = token_text
        self._tokenizer = tokenizer  # the client's: which tokens the text is made of
        # Chat logprobs want each token's and each alternative's bytes: the same few thousand
        # tokens again and again, a decode each (see TOKEN_CACHE).
        self._token_bytes = functools.lru_cache(maxsize=TOKEN_CACHE)(tokenizer.token_bytes)
        self._runs: set[ChoiceRunner] = set()
        self._idle = asyncio.Event()
        self._idle.set()

    async def drain(self, grace_period: float) -> None:
        """Let the requests in flight run up to ``grace_period`` seconds, then abort the rest
        and wait (briefly) for their handlers to send the endings."""
        if not await self._wait_idle(grace_period):
            logger.info("aborting %d request(s) still running after the %.1f s grace period",
                        len(self._runs), grace_period)
            for runner in self._runs:
                runner.abort()
            if not await self._wait_idle(_ABORT_WRITE_TIMEOUT):
                logger.warning("%d aborted request(s) did not finish writing within %.1f s",
                               len(self._runs), _ABORT_WRITE_TIMEOUT)

    async def _wait_idle(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while self._runs:
            try:
                await asyncio.wait_for(self._idle.wait(), max(0.0, deadline - time.monotonic()))
            except asyncio.TimeoutError:
                return not self._runs
        return True

    async def chat(self, request: web.Request) -> web.StreamResponse:
        try:
            req, ignored = self._chat_decoder.decode(await read_body(request, self._limit))
        except ApiError:
            self._metrics.count("chat", "rejected")
            raise
        return await self.serve_chat(request, "chat", req, ignored_header(ignored))

    async def serve_chat(self, request: web.Request, endpoint: str, req: ChatCompletionRequest,
                         headers: dict[str, str], render: MakeRenderer | None = None
                         ) -> web.StreamResponse:
        """Check and run a chat request: the chat route's, or another API's translated into
        it; ``render`` (None: chat completions' own) writes the reply in that API's shape."""
        try:
            self.check_model(req.model)
            check_messages(req.messages)
            params = chat_params(req, self._default_max_tokens)
            params = with_structured_fields(params, req, self._tokenizer.vocab_size)
            plan, params = plan_tools(req, params, self._tool_call_parser)
        except ApiError:
            self._metrics.count(endpoint, "rejected")
            raise
        messages, extra = chat_inputs(req.messages, plan.tools if plan else None,
                                      self._tokenizer, may_call=plan is None or plan.parses)

        def start(i: int) -> AsyncIterator[Any]:
            return self._client.chat(messages, seeded(params, i), **extra)

        fmt = (ChatFormat(self._model, self._token_text, self._token_bytes) if plan is None
               else ToolChatFormat(self._model, self._token_text, self._token_bytes, plan))
        return await self._run(request, endpoint, req, start, fmt, params.logprobs is not None,
                               headers=headers, render=render(fmt) if render else None)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        try:
            req, ignored = self._completion_decoder.decode(await read_body(request, self._limit))
            self.check_model(req.model)
            params = completion_params(req)
            params = with_structured_fields(params, req, self._tokenizer.vocab_size)
            prompts: Sequence[str | list[int]] = completion_prompts(req)
            if len(prompts) > 1:  # check them all first: a bad one must not leave others running
                prompts = await self._prepare_all(prompts, params)
        except ApiError:
            self._metrics.count("completions", "rejected")
            raise
        n = req.n

        def start(i: int) -> AsyncIterator[Any]:
            # Choice i answers prompt i // n (OpenAI's and vLLM's index = prompt * n + j).
            return self._client.generate(prompts[i // n], seeded(params, i % n))

        fmt = CompletionFormat(self._model, self._token_text)
        return await self._run(request, "completions", req, start, fmt,
                               params.logprobs is not None, choices=len(prompts) * n,
                               headers=ignored_header(ignored))

    async def _prepare_all(self, prompts: Sequence[str | list[int]], params: SamplingParams
                           ) -> list[list[int]]:
        """Tokenize and check every prompt of a batch (off the loop: there may be many); a bad
        one is a 400 naming it, before any reaches the engine."""
        def prepare() -> list[list[int]]:
            out = []
            for i, p in enumerate(prompts):
                try:
                    out.append(self._client.prepare(p, params)[0])
                except ValueError as e:
                    raise ApiError(400, f"prompt[{i}]: {e}", param=f"prompt[{i}]",
                                   code="invalid_parameter") from e
            return out

        return await asyncio.to_thread(prepare)

    def check_model(self, model: str | None) -> None:
        """404 for a ``model`` other than the served one (absent: fine)."""
        if model is not None and model not in (self._model, self._client.config.model):
            raise ApiError(404, f"model {model!r} does not exist; this server serves "
                           f"{self._model!r} (GET /v1/models)", param="model",
                           code="model_not_found")

    async def _run(self, request: web.Request, endpoint: str,
                   req: ChatCompletionRequest | CompletionRequest,
                   start: Callable[[int], AsyncIterator[Any]], fmt: ChatFormat | CompletionFormat,
                   want_logprobs: bool, *, choices: int | None = None,
                   headers: dict[str, str] | None = None,
                   render: Renderer | None = None) -> web.StreamResponse:
        """``choices``: how many (``req.n`` unless a batch of prompts); ``headers``: extra
        response headers; ``render``: another API's reply shape (None: ``fmt``'s)."""
        choices = choices or req.n
        runner = ChoiceRunner(start, choices)
        deadline = Deadline.of(self._request_timeout, req.timeout)
        tokenizer = self._tokenizer if want_logprobs else None
        states = [ChoiceState(i, tokenizer, counts_prompt=i % req.n == 0)
                  for i in range(choices)]
        last: dict[int, Any] = {}
        outcome = "error"
        self._runs.add(runner)
        self._idle.clear()
        with self._watcher.watch(request) as watch:
            try:
                started = _started(runner, deadline, endpoint)
                if req.stream and render is not None:
                    # The renderer awaits the start itself: it may open its stream (and keep
                    # it alive) while a long prompt is prefilled.
                    resp, outcome = await render.stream(
                        request, started, lambda: deadline.bound(_tracked(runner.events(), last)),
                        states, headers or {})
                    return resp
                await started
                events = deadline.bound(_tracked(runner.events(), last))
                if req.stream:
                    resp, outcome = await _stream(request, events, states, fmt,
                                                  want_logprobs, req.include_usage,
                                                  continuous_usage=req.continuous_usage,
                                                  headers=headers)
                    return resp
                try:
                    outcome = await _collect(events, states)
                except EngineDeadError as e:
                    outcome = "engine_dead"
                    raise engine_dead(e) from e
                except GenerationFailed as e:
                    raise ApiError(500, f"generation failed in the engine: {first_line(e)}",
                                   code="generation_error") from e
                except RequestTimedOut as e:
                    outcome = "timeout"
                    raise timed_out(e) from e
                body = render.full(states) if render is not None else fmt.full(states)
                return web.Response(body=msgspec.json.encode(body),
                                    content_type="application/json", headers=headers)
            except Refused as e:
                outcome = e.outcome
                raise e.error from e.__cause__
            except asyncio.CancelledError:
                if watch.gone:
                    outcome = "disconnected"
                raise
            finally:
                await runner.aclose()
                self._record(endpoint, outcome, last.values())
                self._runs.discard(runner)
                if not self._runs:
                    self._idle.set()

    def _record(self, endpoint: str, outcome: str, outputs: Any) -> None:
        self._metrics.count(endpoint, outcome)
        for out in outputs:
            m = out.metrics
            if m.time_to_first_token is not None:
                self._metrics.first_token(m.time_to_first_token)
            for gap in m.inter_token_latencies:
                self._metrics.inter_token(gap)
            if m.e2e_latency is not None:
                self._metrics.finished(m.e2e_latency)


class Refused(Exception):
    """The engine or the client refused to start a request: ``error`` is the HTTP answer,
    ``outcome`` the metrics' label."""

    def __init__(self, outcome: str, error: ApiError) -> None:
        super().__init__(error.message)
        self.outcome = outcome
        self.error = error


async def _started(runner: ChoiceRunner, deadline: Deadline, endpoint: str) -> None:
    """Start the choices and wait for the first output; ``Refused`` if they cannot start."""
    try:
        await deadline.run(runner.start())
    except RequestTimedOut as e:
        raise Refused("timeout", timed_out(e)) from e
    except ValueError as e:
        err = from_value_error(e)
        if endpoint != "completions" and err.param == "prompt":
            err.param = "messages"  # the prompt the template made of them
        raise Refused("rejected", err) from e
    except EngineDeadError as e:
        raise Refused("engine_dead", engine_dead(e)) from e
    except EngineOverloadedError as e:
        raise Refused("overloaded", ApiError(503, str(e), code="overloaded",
                                             headers={"Retry-After": RETRY_AFTER_S})) from e


async def _tracked(events: AsyncIterator[tuple[int, Any]],
                   last: dict[int, Any]) -> AsyncIterator[tuple[int, Any]]:
    async for index, out in events:
        if out is ABORTED:
            yield index, out
            continue
        last[index] = out
        if out.finished and out.finish_reason == "error":
            logger.warning("request failed in the engine: %s", out.error)  # in full, here
            raise GenerationFailed(out.error or "unknown error")
        yield index, out


def _outcome(states: list[ChoiceState]) -> str:
    worst = max((s.finish_reason for s in states), key=lambda r: _SEVERITY.get(r, 4))
    return worst or "abort"


async def _collect(events: AsyncIterator[tuple[int, Any]], states: list[ChoiceState]) -> str:
    async for index, out in events:
        if out is ABORTED:
            states[index].abort()
        else:
            states[index].update(out)
    return _outcome(states)


async def _stream(request: web.Request, events: AsyncIterator[tuple[int, Any]],
                  states: list[ChoiceState], fmt: ChatFormat | CompletionFormat,
                  want_logprobs: bool, include_usage: bool, *, continuous_usage: bool = False,
                  headers: dict[str, str] | None = None) -> tuple[web.StreamResponse, str]:
    """Write the SSE stream; returns the response and the outcome. ``continuous_usage``: the
    usage so far in every chunk (vLLM's ``continuous_usage_stats``), not null."""
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8",
                                       "Cache-Control": "no-cache", "X-Accel-Buffering": "no",
                                       **(headers or {})})
    await resp.prepare(request)

    async def send(obj: Any) -> None:
        await resp.write(b"data: " + msgspec.json.encode(obj) + b"\n\n")

    outcome = "error"
    try:
        if isinstance(fmt, ChatFormat):
            for s in states:
                await send(fmt.chunk([fmt.role_choice(s.index)], include_usage))
        logprobs: Logprobs
        try:
            async for index, out in events:
                state = states[index]
                if out is ABORTED:
                    if not state.abort():
                        continue
                    text, logprobs = "", []
                else:
                    text, logprobs = state.update(out)
                finish = state.finish_reason
                if not text and not logprobs and finish is None:
                    continue
                lp = logprobs if want_logprobs else None
                for choice in fmt.delta_choices(index, text, lp, finish):
                    chunk = fmt.chunk([choice], include_usage)
                    if continuous_usage:
                        chunk["usage"] = usage(states)
                    await send(chunk)
            outcome = _outcome(states)
        except EngineDeadError as e:
            outcome = "engine_dead"
            await send(engine_dead(e).body())
        except GenerationFailed as e:
            await send(ApiError(500, f"generation failed in the engine: {first_line(e)}",
                                code="generation_error").body())
        except RequestTimedOut as e:
            outcome = "timeout"
            await send(timed_out(e).body())
        if include_usage:
            await send(fmt.usage_chunk(states))
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
    except ConnectionResetError:  # the client went away mid-stream: the caller aborts
        return resp, "disconnected"
    return resp, outcome
