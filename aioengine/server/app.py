"""``create_app(client)``: the OpenAI-compatible HTTP API over one ``AsyncMPClient``, as an
``aiohttp.web.Application`` that runs alone or mounts inside a host's own aiohttp service::

    host = web.Application()
    host.add_subapp("/llm", create_app(client))   # -> POST /llm/v1/chat/completions

The app never starts or stops the client: whoever owns the client owns its lifetime.
"""

from __future__ import annotations

import asyncio
import functools
import time
from typing import Any, cast

import msgspec
from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from aioengine import AsyncMPClient, EngineDeadError
from aioengine.hub import served_model_name
from aioengine.server.anthropic.routes import MessagesRoutes
from aioengine.server.auth import api_key_middleware
from aioengine.server.client_slot import ClientSlot
from aioengine.server.cors import enable_cors
from aioengine.server.disconnect import DisconnectWatcher
from aioengine.server.embeddings_routes import EmbeddingsRoutes
from aioengine.server.errors import ApiError, RefusalLog, engine_dead, error_middleware
from aioengine.server.generate import GenerateHandlers
from aioengine.server.hosts import allowed_hosts_middleware
from aioengine.server.metrics import CONTENT_TYPE, ServerMetrics
from aioengine.server.openai_responses.routes import ResponsesRoutes
from aioengine.server.openapi import openapi_document
from aioengine.server.rerank_routes import RerankRoutes
from aioengine.server.responses import TOKEN_CACHE
from aioengine.server.settings import ServerSettings
from aioengine.server.tokenize_routes import TokenizeRoutes


def create_app(client: AsyncMPClient | ClientSlot,
               settings: ServerSettings | None = None) -> web.Application:
    """The API over an entered ``AsyncMPClient`` (or a ``ClientSlot`` holding one, to swap in
    another client for the same config while it runs). Routes: ``POST /v1/chat/completions``,
    ``POST /v1/completions``, ``POST /v1/messages[/count_tokens]`` (Anthropic's Messages
    API), ``POST /v1/responses``, ``GET``/``DELETE /v1/responses/{id}`` (OpenAI's Responses
    API), ``GET /v1/models[/{model}]``, ``POST /tokenize``,
    ``POST /detokenize``, ``POST /v1/embeddings`` (an embedding model), ``POST /v1/rerank``,
    ``/v2/rerank``, ``/score`` (a reranker), ``GET /version``,
    ``GET /health``, ``GET /metrics``."""
    settings = settings or ServerSettings()
    if isinstance(client, ClientSlot):
        # The handlers read the slot as a client: it forwards every attribute to the current one.
        client = cast(AsyncMPClient, client)
    config = client.config
    model = settings.model_name or served_model_name(config.model)
    max_model_len = client.max_model_len
    metrics = ServerMetrics(model)
    watcher = DisconnectWatcher(settings.disconnect_poll_interval)
    tokenizer = client.tokenizer

    @functools.lru_cache(maxsize=TOKEN_CACHE)  # this app's: logprobs name each token
    def token_text(token_id: int) -> str:
        return tokenizer.decode([token_id], skip_special_tokens=False)

    gen = GenerateHandlers(
        client, model_name=model, max_request_bytes=settings.max_request_bytes,
        default_max_tokens=settings.default_max_tokens or max_model_len, metrics=metrics,
        watcher=watcher, token_text=token_text, tokenizer=tokenizer,
        request_timeout=settings.request_timeout, tool_call_parser=settings.tool_call_parser,
        strict_request_fields=settings.strict_request_fields)
    info = _Info(client, model, max_model_len, metrics, settings.health_timeout)

    middlewares: list[Middleware] = [error_middleware(RefusalLog())]
    if settings.allowed_hosts is not None:
        middlewares.append(allowed_hosts_middleware(settings.allowed_hosts))
    if settings.api_keys:
        middlewares.append(api_key_middleware(settings.api_keys,
                                              settings.protect_health_and_metrics))
    if isinstance(client, ClientSlot):
        middlewares.append(_restarting_middleware(client))
    app = web.Application(middlewares=middlewares, client_max_size=settings.max_request_bytes)
    app.router.add_post("/v1/chat/completions", gen.chat)
    app.router.add_post("/v1/completions", gen.completions)
    app.router.add_get("/v1/models", info.models)
    app.router.add_get("/v1/models/{model}", info.model)
    app.router.add_get("/health", info.health)
    app.router.add_get("/metrics", info.metrics)
    TokenizeRoutes(client, gen.check_model, settings.max_request_bytes).add_to(app)
    for pooled in (EmbeddingsRoutes, RerankRoutes):
        pooled(client, gen.check_model, model, settings, metrics).add_to(app)
    MessagesRoutes(client, gen, max_request_bytes=settings.max_request_bytes,
                   tool_call_parser=settings.tool_call_parser,
                   strict_request_fields=settings.strict_request_fields).add_to(app)
    ResponsesRoutes(client, gen, model, max_request_bytes=settings.max_request_bytes,
                    store_max_count=settings.response_store_max_count,
                    store_max_bytes=settings.response_store_max_bytes,
                    strict_request_fields=settings.strict_request_fields).add_to(app)
    spec = msgspec.json.encode(openapi_document(bool(settings.api_keys)))

    async def openapi(_: web.Request) -> web.Response:
        return web.Response(body=spec, content_type="application/json")

    app.router.add_get("/openapi.json", openapi)
    if settings.allowed_origins:
        enable_cors(app, settings.allowed_origins, settings.allowed_methods,
                    settings.allowed_headers, settings.allow_credentials)

    async def drain(_: web.Application) -> None:
        # on_shutdown runs before aiohttp waits on (and then cuts) the handlers in flight.
        await gen.drain(settings.shutdown_grace_period)

    async def close_watcher(_: web.Application) -> None:
        await watcher.close()

    app.on_shutdown.append(drain)
    app.on_cleanup.append(close_watcher)
    return app


_GENERATION_PATHS = ("/v1/chat/completions", "/v1/completions", "/v1/messages",
                     "/v1/responses")


def _restarting_middleware(slot: ClientSlot) -> Any:
    """While the slot's engine is restarting, generation requests get 503 ``engine_restarting``
    with ``Retry-After`` (a load balancer or client retries them) instead of ``engine_dead``."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if slot.restarting and request.method == "POST" \
                and request.path.endswith(_GENERATION_PATHS):
            raise ApiError(503, "the engine is restarting; retry shortly",
                           code="engine_restarting", headers={"Retry-After": "1"})
        return await handler(request)

    return middleware


class _Info:
    """The read-only endpoints."""

    def __init__(self, client: AsyncMPClient, model: str, max_model_len: int,
                 metrics: ServerMetrics, timeout: float) -> None:
        self._client = client
        self._model = model
        self._max_model_len = max_model_len
        self._metrics = metrics
        self._timeout = timeout
        self._created = int(time.time())

    def _card(self) -> dict[str, Any]:
        return {"id": self._model, "object": "model", "created": self._created,
                "owned_by": "aioengine", "root": self._model,
                "max_model_len": self._max_model_len}

    async def models(self, request: web.Request) -> web.Response:
        return _json({"object": "list", "data": [self._card()]})

    async def model(self, request: web.Request) -> web.Response:
        name = request.match_info["model"]
        if name != self._model:
            raise ApiError(404, f"model {name!r} does not exist; this server serves "
                           f"{self._model!r}", param="model", code="model_not_found")
        return _json(self._card())

    async def health(self, request: web.Request) -> web.Response:
        await self._ask("check_health")
        total = self._client.config.data_parallel_size
        alive = self._client.replicas_alive
        if alive < total:  # replica_failure="degrade": serving, on fewer replicas
            return _json({"status": "degraded", "replicas_alive": alive,
                          "data_parallel_size": total})
        return _json({"status": "ok"})

    async def metrics(self, request: web.Request) -> web.Response:
        self._metrics.engine.restarts = getattr(self._client, "restarts", 0)
        try:
            self._metrics.engine.stats = await self._ask("get_stats")
            self._metrics.engine.up = True
        except ApiError:
            self._metrics.engine.up = False
        return web.Response(body=self._metrics.render(), headers={"Content-Type": CONTENT_TYPE})

    async def _ask(self, method: str) -> Any:
        """Call a client utility; a dead, restarting or silent engine is a 503."""
        if getattr(self._client, "restarting", False):  # a ClientSlot between two engines
            raise ApiError(503, "the engine is restarting", code="engine_restarting")
        if self._client.is_dead:
            raise ApiError(503, "the engine is dead", code="engine_dead")
        try:
            return await asyncio.wait_for(getattr(self._client, method)(), self._timeout)
        except EngineDeadError as e:
            raise engine_dead(e) from e
        except asyncio.TimeoutError as e:
            raise ApiError(503, f"the engine did not answer {method} within {self._timeout} s",
                           code="engine_unresponsive") from e


def _json(obj: Any, status: int = 200) -> web.Response:
    return web.Response(status=status, body=msgspec.json.encode(obj),
                        content_type="application/json")
