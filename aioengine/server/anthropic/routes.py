"""``POST /v1/messages`` and ``POST /v1/messages/count_tokens`` (Claude Code calls them with
``?beta=true``): decode, translate into a chat request (``translate``), run it through the chat
route's pipeline, and answer in the Messages API's shape (``reply``, ``stream``); errors in
Anthropic's shape (``errors.ANTHROPIC_PATHS``).

Accepted and ignored, and named in the ``x-aioengine-ignored-fields`` response header: the
fields of ``protocol.IGNORED_FIELDS``, ``thinking`` (no reasoning parser yet), ``cache_control``
(on any block or tool: the prefix cache needs no hints) and unknown top-level fields; the
``anthropic-beta`` header's betas in ``x-aioengine-ignored-betas``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import msgspec
from aiohttp import web

from aioengine import AsyncMPClient, SamplingParams
from aioengine.server.anthropic.protocol import (
    IGNORED_FIELDS,
    CountTokensRequest,
    MessagesRequest,
    ToolResultBlock,
)
from aioengine.server.anthropic.reply import full_message
from aioengine.server.anthropic.stream import write_stream
from aioengine.server.anthropic.translate import anthropic_param, to_chat
from aioengine.server.body import read_body
from aioengine.server.errors import ApiError
from aioengine.server.generate import GenerateHandlers
from aioengine.server.params import check_messages
from aioengine.server.responses import ChatFormat, ChoiceState, Json
from aioengine.server.tool_prompts import chat_inputs
from aioengine.server.tools import plan_tools
from aioengine.server.unknown_fields import RequestDecoder, ignored_header

IGNORED_BETAS_HEADER = "x-aioengine-ignored-betas"


class _Reply:
    """The chat pipeline's ``Renderer`` for one Messages request."""

    def __init__(self, fmt: ChatFormat, stop_sequences: list[str]) -> None:
        self._fmt = fmt
        self._stops = stop_sequences

    def full(self, states: list[ChoiceState]) -> Json:
        return full_message(self._fmt, states[0], self._stops)

    async def stream(self, request: web.Request, started: Awaitable[None],
                     events: Callable[[], AsyncIterator[tuple[int, Any]]],
                     states: list[ChoiceState], headers: dict[str, str]
                     ) -> tuple[web.StreamResponse, str]:
        return await write_stream(request, self._fmt, started, events, states[0], self._stops,
                                  headers)


def _cache_control(req: CountTokensRequest) -> bool:
    """Whether any block or tool carries ``cache_control`` (a prompt-caching hint)."""
    blocks: list[Any] = list(req.tools or [])
    if isinstance(req.system, list):
        blocks += req.system
    for m in req.messages:
        if isinstance(m.content, list):
            blocks += m.content
            blocks += [c for b in m.content if isinstance(b, ToolResultBlock)
                       and isinstance(b.content, list) for c in b.content]
    return any(b.cache_control is not None for b in blocks)


class MessagesRoutes:
    def __init__(self, client: AsyncMPClient, gen: GenerateHandlers, *, max_request_bytes: int,
                 tool_call_parser: str, strict_request_fields: bool = False) -> None:
        self._client = client
        self._gen = gen
        self._limit = max_request_bytes
        self._parser = tool_call_parser
        self._messages = RequestDecoder(MessagesRequest, msgspec.json.Decoder(MessagesRequest),
                                        strict=strict_request_fields)
        self._count = RequestDecoder(CountTokensRequest,
                                     msgspec.json.Decoder(CountTokensRequest),
                                     strict=strict_request_fields)

    def add_to(self, app: web.Application) -> None:
        app.router.add_post("/v1/messages", self.messages)
        app.router.add_post("/v1/messages/count_tokens", self.count_tokens)

    async def messages(self, request: web.Request) -> web.StreamResponse:
        req, headers = self._decode(self._messages, await read_body(request, self._limit),
                                    request)
        # A max_tokens past the context is capped to it (Claude Code asks for 32000 or more);
        # the engine stops a reply at the context's end, with stop_reason "max_tokens".
        chat = to_chat(req, min(req.max_tokens, self._client.max_model_len))
        stops = list(req.stop_sequences or [])
        try:
            return await self._gen.serve_chat(request, "messages", chat, headers,
                                              render=lambda fmt: _Reply(fmt, stops))
        except ApiError as e:
            raise anthropic_param(e) from e

    async def count_tokens(self, request: web.Request) -> web.Response:
        req, headers = self._decode(self._count, await read_body(request, self._limit), request)
        chat = to_chat(req)
        try:
            self._gen.check_model(chat.model)
            check_messages(chat.messages)
            plan, _ = plan_tools(chat, SamplingParams(), self._parser)
        except ApiError as e:
            raise anthropic_param(e) from e
        messages, extra = chat_inputs(chat.messages, plan.tools if plan else None,
                                      self._client.tokenizer,
                                      may_call=plan is None or plan.parses)
        tok = self._client.tokenizer

        def count() -> int:  # a long conversation takes a while: off the event loop
            text = tok.apply_chat_template(messages, **extra)
            return len(tok.encode(text, add_special_tokens=False))

        try:
            n = await asyncio.to_thread(count)
        except ValueError as e:  # e.g. a tokenizer without a chat template
            raise ApiError(400, str(e), param="messages", code="invalid_parameter") from e
        return web.json_response({"input_tokens": n}, headers=headers)

    @staticmethod
    def _decode(decoder: RequestDecoder[Any], body: bytes, request: web.Request
                ) -> tuple[Any, dict[str, str]]:
        """The request, and the response headers naming what it sent that is ignored."""
        req, ignored = decoder.decode(body)
        ignored += [f for f in IGNORED_FIELDS if getattr(req, f, None) is not None]
        if req.thinking is not None:
            ignored.append("thinking")
        if _cache_control(req):
            ignored.append("cache_control")
        headers = ignored_header(ignored)
        betas = request.headers.get("anthropic-beta", "").strip()
        if betas:
            headers[IGNORED_BETAS_HEADER] = betas
        return req, headers
