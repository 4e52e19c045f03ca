"""Running a request's pooling calls (embeddings, scores) together: every one concurrently, so
the engine batches them; the first failure ends the request with its HTTP answer and aborts
the rest (nothing keeps running for a request already answered)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from aiohttp import web

from aioengine import AsyncMPClient, EngineDeadError, EngineOverloadedError
from aioengine.server.errors import ApiError, engine_dead, from_value_error
from aioengine.server.generate import RETRY_AFTER_S
from aioengine.server.metrics import ServerMetrics
from aioengine.server.settings import ServerSettings

T = TypeVar("T")


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
_OUTCOMES = {"engine_dead": "engine_dead", "overloaded": "overloaded"}


class PooledRoutes:
    """What the embedding and rerank routes share: the client, the served name, the limits,
    and the request metrics (``aioengine_requests_total`` by endpoint and outcome, the e2e
    latency of those answered)."""

    def __init__(self, client: AsyncMPClient, check_model: Callable[[str | None], None],
                 model_name: str, settings: ServerSettings, metrics: ServerMetrics) -> None:
        self._client = client
        self._check_model = check_model
        self._model = model_name
        self._limit = settings.max_request_bytes
        self._max_inputs = settings.max_pooling_inputs
        self._metrics = metrics

    def check_count(self, count: int, field: str) -> None:
        """400 naming ``field`` for no inputs or more than ``--max-pooling-inputs``."""
        if not 1 <= count <= self._max_inputs:
            raise ApiError(400, f"{field} must hold 1 to {self._max_inputs} items, got "
                           f"{count} (the server's --max-pooling-inputs)", param=field,
                           code="invalid_parameter")

    def measured(self, endpoint: str, handler: Handler) -> Handler:
        async def run(request: web.Request) -> web.StreamResponse:
            start = time.monotonic()
            try:
                response = await handler(request)
            except ApiError as e:
                self._metrics.count(endpoint, _OUTCOMES.get(e.code or "", "rejected"))
                raise
            self._metrics.count(endpoint, "stop")
            self._metrics.finished(time.monotonic() - start)
            return response

        return run
_THREAD_CHARS = 16384  # inputs longer in total are tokenized in a thread, off the event loop


async def prepare_all(items: Sequence[Any], prepare: Callable[[int, Any], T],
                      chars: int) -> list[T]:
    """``prepare(i, item)`` for every item, in a thread when they hold more than a few
    thousand characters of text (tokenizing them would stall the event loop)."""
    def work() -> list[T]:
        return [prepare(i, item) for i, item in enumerate(items)]

    return await asyncio.to_thread(work) if chars > _THREAD_CHARS else work()


async def run_all(calls: Sequence[Awaitable[T]]) -> list[T]:
    tasks = [asyncio.ensure_future(c) for c in calls]
    try:
        return await asyncio.gather(*tasks)
    except ValueError as e:
        raise from_value_error(e) from e
    except EngineDeadError as e:
        raise engine_dead(e) from e
    except EngineOverloadedError as e:
        raise ApiError(503, str(e), code="overloaded",
                       headers={"Retry-After": RETRY_AFTER_S}) from e
    finally:
        for task in tasks:
            task.cancel()


def model_task_error(err: ValueError) -> ApiError:
    """A request for a task the served model does not do."""
    return ApiError(400, str(err), param="model", code="model_not_supported")


def input_error(err: ValueError, where: str) -> ApiError:
    """400 naming the input (``input[3]``, ``documents[0]``) that ``err`` is about."""
    return ApiError(400, f"{where}: {err}", param=where, code="invalid_parameter")
