"""``POST /v1/embeddings`` (OpenAI's request and response shapes) over an embedding model.

Each input is its own engine request; they run concurrently, so the engine batches them in
its steps (with any other client's). Every input is checked and tokenized before any is sent:
a bad one is a 400 naming ``input[i]``, and nothing of the request runs.
"""

from __future__ import annotations

import base64
import struct
from typing import Any, Literal

import msgspec
from aiohttp import web

from aioengine.server.body import decode, read_body
from aioengine.server.errors import ApiError, from_value_error
from aioengine.server.pooled_calls import (
    PooledRoutes,
    input_error,
    model_task_error,
    prepare_all,
    run_all,
)


class EmbeddingsRequest(msgspec.Struct, kw_only=True):
    input: Any
    """A string, a list of strings, a list of token ids, or a list of such lists."""
    model: str | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None
    user: str | None = None
    truncate_prompt_tokens: int | None = None
    """vLLM's: cut each input to this many tokens (-1: the model's default length)."""
    truncate: Literal["END", "NONE"] = "END"
    """Cohere's: ``NONE`` refuses an input longer than the model's length (a 400)."""


_DECODER = msgspec.json.Decoder(EmbeddingsRequest)


def split_inputs(value: Any) -> list[str | list[int]]:
    """The request's inputs, one per embedding; ApiError naming ``input`` for a bad shape."""
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list) or not value:
        raise ApiError(400, "input must be a string, a list of strings, a list of token ids "
                       "or a list of such lists, and not empty", param="input",
                       code="invalid_parameter")
    if all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return [value]
    for i, item in enumerate(value):
        if not isinstance(item, (str, list)):
            raise ApiError(400, f"input[{i}] must be a string or a list of token ids, got "
                           f"{type(item).__name__}", param=f"input[{i}]",
                           code="invalid_parameter")
    return value


class EmbeddingsRoutes(PooledRoutes):
    def add_to(self, app: web.Application) -> None:
        app.router.add_post("/v1/embeddings", self.measured("embeddings", self.embeddings))

    async def embeddings(self, request: web.Request) -> web.Response:
        req = decode(_DECODER, await read_body(request, self._limit))
        self._check_model(req.model)
        client = self._client
        try:
            client.embedding_model  # noqa: B018 (raises for a model that does not embed)
        except ValueError as e:
            raise model_task_error(e) from e
        items = split_inputs(req.input)
        self.check_count(len(items), "input")
        truncate = truncation(req.truncate, req.truncate_prompt_tokens, client.max_model_len)

        def prepare(i: int, item: str | list[int]) -> list[int]:
            try:
                return client.prepare_embedding(item, truncate, req.dimensions)
            except ValueError as e:
                if str(e).startswith("dimensions"):
                    raise from_value_error(e) from e
                raise input_error(e, "input" if len(items) == 1 else f"input[{i}]") from e

        ids = await prepare_all(items, prepare, sum(len(x) for x in items if isinstance(x, str)))
        outs = await run_all([client.embed_prepared(x, req.dimensions) for x in ids])
        tokens = sum(len(o.prompt_token_ids) for o in outs)
        data = [{"object": "embedding", "index": i,
                 "embedding": _encoded(o.embedding, req.encoding_format)}
                for i, o in enumerate(outs)]
        body = {"object": "list", "data": data, "model": self._model,
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}
        return web.Response(body=msgspec.json.encode(body), content_type="application/json")


def truncation(truncate: str, tokens: int | None, limit: int) -> bool | int:
    """Cohere's ``truncate`` (``END``, ``NONE``) and vLLM's ``truncate_prompt_tokens`` (N, or
    -1 for the model's length) as the client's ``truncate`` argument."""
    if truncate == "NONE":
        if tokens is not None:
            raise ApiError(400, "truncate_prompt_tokens cannot be given with truncate "
                           "NONE", param="truncate_prompt_tokens", code="invalid_parameter")
        return False
    if tokens is None or tokens == -1:
        return True
    if not 1 <= tokens <= limit:
        raise ApiError(400, f"truncate_prompt_tokens must be -1 or in [1, {limit}], got "
                       f"{tokens}", param="truncate_prompt_tokens", code="invalid_parameter")
    return tokens


def _encoded(vector: list[float], encoding: str) -> list[float] | str:
    if encoding == "float":
        return vector
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
