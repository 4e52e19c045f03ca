"""``POST /v1/responses``, ``GET /v1/responses/{id}``, ``DELETE /v1/responses/{id}``: decode,
translate into a chat request (``translate``), run it through the chat route's pipeline, and
answer as a Responses API ``response`` (``reply``, ``stream``); errors in OpenAI's shape.

With ``store`` (the default) the response and its conversation are kept (``store``) for
``previous_response_id`` and ``GET``; an unknown or evicted id is a 400
``previous_response_not_found``. Hosted tools this engine cannot run (``web_search``, ...) are
skipped and named in the ``x-aioengine-skipped-tools`` header. Accepted and ignored, and named
in the ``x-aioengine-ignored-fields`` header: ``protocol.IGNORED_FIELDS``, ``reasoning`` (no
reasoning parser yet: the effort is echoed in the response, nothing more), ``text.verbosity``
and unknown top-level fields (Codex's ``client_metadata``).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import msgspec
from aiohttp import web

from aioengine import AsyncMPClient
from aioengine.server.body import read_body
from aioengine.server.errors import ApiError
from aioengine.server.event_stream import open_sse, write_stream
from aioengine.server.generate import GenerateHandlers
from aioengine.server.openai_responses.protocol import (
    IGNORED_FIELDS,
    InputItem,
    MessageItem,
    ResponsesRequest,
    convert_items,
)
from aioengine.server.openai_responses.reply import Reply
from aioengine.server.openai_responses.store import ResponseStore
from aioengine.server.openai_responses.stream import EventWriter
from aioengine.server.openai_responses.translate import responses_param, to_chat
from aioengine.server.responses import ChatFormat, ChoiceState, Json
from aioengine.server.unknown_fields import RequestDecoder, ignored_header

logger = logging.getLogger(__name__)

SKIPPED_TOOLS_HEADER = "x-aioengine-skipped-tools"


class _Render:
    """The chat pipeline's ``Renderer`` for one Responses request; ``keep`` gets the final
    response body."""

    def __init__(self, fmt: ChatFormat, reply: Reply, keep: Callable[[Json], None]) -> None:
        self._fmt = fmt
        self._reply = reply
        self._keep = keep

    def full(self, states: list[ChoiceState]) -> Json:
        body = self._reply.full(self._fmt, states[0])
        self._keep(body)
        return body

    async def stream(self, request: web.Request, started: Awaitable[None],
                     events: Callable[[], AsyncIterator[tuple[int, Any]]],
                     states: list[ChoiceState], headers: dict[str, str]
                     ) -> tuple[web.StreamResponse, str]:
        async def open_writer() -> EventWriter:
            return EventWriter(await open_sse(request, headers), self._reply, self._keep)

        return await write_stream(request, open_writer, self._fmt, started, events, states[0])


def _echo(req: ResponsesRequest) -> Json:
    """The request's fields a response repeats (OpenAI's defaults where not sent)."""
    text = {"format": {"type": "text"}}
    if req.text is not None and req.text.format is not None:
        text = {"format": msgspec.to_builtins(req.text.format)}
    return {"instructions": req.instructions, "max_output_tokens": req.max_output_tokens,
            "parallel_tool_calls": req.parallel_tool_calls is not False,
            "previous_response_id": req.previous_response_id,
            "reasoning": msgspec.to_builtins(req.reasoning) if req.reasoning else
            {"effort": None, "summary": None},
            "store": req.store, "temperature": req.temperature, "top_p": req.top_p,
            "text": text, "tool_choice": msgspec.to_builtins(req.tool_choice or "auto"),
            "tools": req.tools or [], "truncation": req.truncation or "disabled",
            "metadata": req.metadata or {}, "user": req.user,
            "prompt_cache_key": req.prompt_cache_key, "background": False}


class ResponsesRoutes:
    def __init__(self, client: AsyncMPClient, gen: GenerateHandlers, model: str, *,
                 max_request_bytes: int, store_max_count: int, store_max_bytes: int,
                 strict_request_fields: bool = False) -> None:
        self._client = client
        self._gen = gen
        self._model = model
        self._limit = max_request_bytes
        self.store = ResponseStore(store_max_count, store_max_bytes)
        self._decoder = RequestDecoder(ResponsesRequest, msgspec.json.Decoder(ResponsesRequest),
                                       strict=strict_request_fields)
        logger.info("Responses API: keeping up to %d stored responses, %d bytes in all "
                    "(--response-store-max-count, --response-store-max-bytes)",
                    store_max_count, store_max_bytes)

    def add_to(self, app: web.Application) -> None:
        app.router.add_post("/v1/responses", self.create)
        app.router.add_get("/v1/responses/{response_id}", self.get)
        app.router.add_delete("/v1/responses/{response_id}", self.delete)

    async def create(self, request: web.Request) -> web.StreamResponse:
        req, ignored = self._decoder.decode(await read_body(request, self._limit))
        ignored += [f for f in IGNORED_FIELDS if getattr(req, f) is not None]
        if req.reasoning is not None:
            ignored.append("reasoning")
        if req.text is not None and req.text.verbosity is not None:
            ignored.append("text.verbosity")
        items: list[InputItem] = ([MessageItem("user", req.input)] if isinstance(req.input, str)
                                  else convert_items(req.input))
        previous = self._previous(req.previous_response_id)
        # A max_output_tokens past the context is capped to it; absent, the chat route's
        # default (--default-max-tokens, else up to the context's end).
        cap = (min(req.max_output_tokens, self._client.max_model_len)
               if req.max_output_tokens is not None else None)
        tr = to_chat(req, previous + items, cap, first=len(previous))
        headers = ignored_header(ignored)
        if tr.skipped_tools:
            headers[SKIPPED_TOOLS_HEADER] = ", ".join(tr.skipped_tools)
        reply = Reply(self._model, _echo(req), tr.namespaces)

        def keep(body: Json) -> None:
            if req.store:
                output = convert_items(body["output"], "output")
                self.store.put(reply.id, [*previous, *items, *output], body)

        try:
            return await self._gen.serve_chat(request, "responses", tr.chat, headers,
                                              render=lambda fmt: _Render(fmt, reply, keep))
        except ApiError as e:
            raise responses_param(e, tr) from e

    def _previous(self, response_id: str | None) -> list[InputItem]:
        if response_id is None:
            return []
        entry = self.store.get(response_id)
        if entry is None:
            raise ApiError(400, f"previous response with id {response_id!r} not found (never "
                           "stored, deleted, or evicted from this server's bounded store)",
                           param="previous_response_id", code="previous_response_not_found")
        return list(entry.items)

    async def get(self, request: web.Request) -> web.Response:
        response_id = request.match_info["response_id"]
        entry = self.store.get(response_id)
        if entry is None:
            raise _not_found(response_id)
        return web.json_response(entry.body)

    async def delete(self, request: web.Request) -> web.Response:
        response_id = request.match_info["response_id"]
        if not self.store.delete(response_id):
            raise _not_found(response_id)
        return web.json_response({"id": response_id, "object": "response", "deleted": True})


def _not_found(response_id: str) -> ApiError:
    return ApiError(404, f"response with id {response_id!r} not found", param="response_id",
                    code="not_found")
