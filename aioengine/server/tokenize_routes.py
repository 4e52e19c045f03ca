"""``POST /tokenize``, ``POST /detokenize`` and ``GET /version``, with vLLM's request and
response shapes (its OpenAI server's extra routes), so tools written for it work here."""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
from aiohttp import web
from msgspec import Meta

from aioengine import AsyncMPClient, __version__
from aioengine.client.tokenizer import run_long_text
from aioengine.server.body import decode, read_body
from aioengine.server.errors import ApiError
from aioengine.server.params import check_messages
from aioengine.server.protocol import ChatMessage, ToolDef
from aioengine.server.tool_prompts import chat_inputs, tool_dicts
from aioengine.server.tools import check_tool_history

_LONG = 16384  # chars: longer texts are tokenized in a thread, off the event loop


class TokenizeRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    model: str | None = None
    prompt: str | None = None
    messages: Annotated[list[ChatMessage], Meta(min_length=1)] | None = None
    add_special_tokens: bool | None = None  # default: True for a prompt, False for messages
    add_generation_prompt: bool = True
    return_token_strs: bool = False
    tools: list[ToolDef] | None = None  # rendered into the prompt as for chat completions


class DetokenizeRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    tokens: list[int]
    model: str | None = None


_TOKENIZE = msgspec.json.Decoder(TokenizeRequest)
_DETOKENIZE = msgspec.json.Decoder(DetokenizeRequest)


class TokenizeRoutes:
    def __init__(self, client: AsyncMPClient, check_model: Any, max_request_bytes: int) -> None:
        self._client = client
        self._check_model = check_model
        self._limit = max_request_bytes

    def add_to(self, app: web.Application) -> None:
        app.router.add_post("/tokenize", self.tokenize)
        app.router.add_post("/detokenize", self.detokenize)
        app.router.add_get("/version", self.version)

    async def tokenize(self, request: web.Request) -> web.Response:
        req = decode(_TOKENIZE, await read_body(request, self._limit))
        self._check_model(req.model)
        if (req.prompt is None) == (req.messages is None):
            raise ApiError(400, "send exactly one of 'prompt' and 'messages'", param="prompt",
                           code="invalid_parameter")
        tok = self._client.tokenizer
        if req.messages is not None:
            check_messages(req.messages)
            check_tool_history(req.messages)
            messages, extra = chat_inputs(req.messages, tool_dicts(req.tools), tok)
            size = sum(len(m["content"]) for m in messages)

            def work() -> list[int]:
                text = tok.apply_chat_template(
                    messages, add_generation_prompt=req.add_generation_prompt, **extra)
                return tok.encode(text, bool(req.add_special_tokens))
        else:
            prompt = req.prompt or ""
            size = len(prompt)

            def work() -> list[int]:
                return tok.encode(prompt, req.add_special_tokens is not False)
        def answer() -> bytes:  # a decode per token for token_strs: off the loop too
            ids = work()
            strs = ([tok.decode([i], skip_special_tokens=False) for i in ids]
                    if req.return_token_strs else None)
            return msgspec.json.encode({"count": len(ids),
                                        "max_model_len": self._client.max_model_len,
                                        "tokens": ids, "token_strs": strs})
        try:
            body = await run_long_text(answer) if size > _LONG else answer()
        except ValueError as e:  # e.g. a tokenizer without a chat template
            raise ApiError(400, str(e), param="messages", code="invalid_parameter") from e
        return web.Response(body=body, content_type="application/json")

    async def detokenize(self, request: web.Request) -> web.Response:
        req = decode(_DETOKENIZE, await read_body(request, self._limit))
        self._check_model(req.model)
        vocab = self._client.tokenizer.vocab_size
        for i, t in enumerate(req.tokens):
            if not 0 <= t < vocab:
                raise ApiError(400, f"tokens[{i}] = {t} is outside the vocabulary [0, {vocab})",
                               param=f"tokens[{i}]", code="invalid_parameter")
        text = self._client.tokenizer.decode(req.tokens, skip_special_tokens=False)
        return web.json_response({"prompt": text})

    async def version(self, request: web.Request) -> web.Response:
        return web.json_response({"version": __version__})
