"""``POST /v1/rerank`` and ``/v2/rerank`` (the Jina/Cohere shape vLLM serves) and ``POST
/score`` (vLLM's text pairs) over a reranker: each pair is one engine request, run
concurrently so the engine batches them; every pair is checked and tokenized before any runs
(a bad one is a 400 naming it)."""

from __future__ import annotations

import time
import uuid
from typing import Annotated, Any, Literal

import msgspec
from aiohttp import web
from msgspec import Meta

from aioengine.server.body import decode, read_body
from aioengine.server.embeddings_routes import truncation
from aioengine.server.errors import ApiError
from aioengine.server.pooled_calls import (
    PooledRoutes,
    input_error,
    model_task_error,
    prepare_all,
    run_all,
)


class RerankDocument(msgspec.Struct):
    text: str


class RerankRequest(msgspec.Struct, kw_only=True):
    query: str
    documents: list[str | RerankDocument]
    model: str | None = None
    top_n: Annotated[int, Meta(ge=0)] | None = None  # 0 or absent: every document
    return_documents: bool = True
    truncate_prompt_tokens: int | None = None
    truncate: Literal["END", "NONE"] = "END"


class ScoreRequest(msgspec.Struct, kw_only=True):
    text_1: str | list[str]
    text_2: str | list[str]
    model: str | None = None
    truncate_prompt_tokens: int | None = None
    truncate: Literal["END", "NONE"] = "END"


_RERANK = msgspec.json.Decoder(RerankRequest)
_SCORE = msgspec.json.Decoder(ScoreRequest)


class RerankRoutes(PooledRoutes):
    def add_to(self, app: web.Application) -> None:
        rerank = self.measured("rerank", self.rerank)
        app.router.add_post("/v1/rerank", rerank)
        app.router.add_post("/v2/rerank", rerank)
        app.router.add_post("/score", self.measured("score", self.score))

    async def rerank(self, request: web.Request) -> web.Response:
        req = decode(_RERANK, await read_body(request, self._limit))
        self._check(req.model)
        texts = [d if isinstance(d, str) else d.text for d in req.documents]
        self.check_count(len(texts), "documents")
        if not req.query:
            raise ApiError(400, "query is an empty string: there is nothing to rank for",
                           param="query", code="invalid_parameter")
        empty = next((i for i, t in enumerate(texts) if not t), None)
        if empty is not None:
            raise ApiError(400, f"documents[{empty}] is an empty string", param=f"documents"
                           f"[{empty}]", code="invalid_parameter")
        scores, tokens = await self._scores([(req.query, t) for t in texts], "documents",
                                            req.truncate, req.truncate_prompt_tokens)
        order = sorted(range(len(texts)), key=lambda i: -scores[i])[:req.top_n or None]
        results = [{"index": i, "relevance_score": scores[i],
                    **({"document": {"text": texts[i]}} if req.return_documents else {})}
                   for i in order]
        return _json({"id": f"rerank-{uuid.uuid4().hex}", "model": self._model,
                      "usage": {"total_tokens": tokens}, "results": results})

    async def score(self, request: web.Request) -> web.Response:
        req = decode(_SCORE, await read_body(request, self._limit))
        self._check(req.model)
        pairs = _pairs(req.text_1, req.text_2)
        self.check_count(len(pairs), "text_2")
        scores, tokens = await self._scores(pairs, "text_2", req.truncate,
                                            req.truncate_prompt_tokens)
        data = [{"index": i, "object": "score", "score": s} for i, s in enumerate(scores)]
        return _json({"id": f"score-{uuid.uuid4().hex}", "object": "list",
                      "created": int(time.time()), "model": self._model, "data": data,
                      "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})

    def _check(self, model: str | None) -> None:
        self._check_model(model)
        try:
            self._client.score_model  # noqa: B018 (raises for a model that does not score)
        except ValueError as e:
            raise model_task_error(e) from e

    async def _scores(self, pairs: list[tuple[str, str]], field: str, truncate: str,
                      tokens: int | None) -> tuple[list[float], int]:
        client = self._client
        cut = truncation(truncate, tokens, client.max_model_len)

        def prepare(i: int, pair: tuple[str, str]) -> tuple[list[int], int]:
            try:
                return client.prepare_score(pair[0], pair[1], cut)
            except ValueError as e:
                raise input_error(e, f"{field}[{i}]" if len(pairs) > 1 else field) from e

        prepared = await prepare_all(pairs, prepare, sum(len(a) + len(b) for a, b in pairs))
        outs = await run_all([client.score_prepared(ids, start) for ids, start in prepared])
        return [o.score for o in outs], sum(len(o.prompt_token_ids) for o in outs)


def _pairs(text_1: str | list[str], text_2: str | list[str]) -> list[tuple[str, str]]:
    """vLLM's pairing: one to one, one to each, or each to each of two lists as long."""
    first = [text_1] if isinstance(text_1, str) else text_1
    second = [text_2] if isinstance(text_2, str) else text_2
    if not first or not second:
        raise ApiError(400, "text_1 and text_2 must not be empty lists",
                       param="text_1" if not first else "text_2", code="invalid_parameter")
    if len(first) == 1:
        first = first * len(second)
    if len(first) != len(second):
        raise ApiError(400, f"text_1 has {len(first)} texts and text_2 {len(second)}: give "
                       "one text_1, or as many as text_2", param="text_1",
                       code="invalid_parameter")
    return list(zip(first, second, strict=True))


def _json(body: dict[str, Any]) -> web.Response:
    return web.Response(body=msgspec.json.encode(body), content_type="application/json")
