"""Ray Serve entry point: each Serve replica runs one ``AsyncMPClient`` (an engine tree on the
replica's node), and Serve does the replica management, autoscaling and routing.

- ``check_health`` raises once the engine is dead (or does not answer a ping), so Serve
  replaces the replica: engine death becomes a replica restart.
- Requests carry their text as ``prompt`` (``CompletionRequest``) or ``messages``
  (``ChatRequest``), the attributes Ray Serve's ``PrefixCacheAffinityRouter`` reads, so
  ``deployment(..., prefix_aware=True)`` sends a repeated prefix to the replica that caches it.

Ray is imported only when ``deployment`` is called (``pip install 'aioengine[ray]'``)::

    from ray import serve
    from aioengine import EngineConfig
    from aioengine.integrations.ray_serve import CompletionRequest, deployment

    handle = serve.run(deployment(EngineConfig(model="tiny"), num_replicas=2))
    reply = handle.completions.remote(CompletionRequest("Once upon a time")).result()
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from aioengine.client.async_client import AsyncMPClient
from aioengine.client.chat_template import ChatMessage
from aioengine.config import EngineConfig
from aioengine.messages.sampling_params import SamplingParams
from aioengine.runtime.errors import EngineDeadError


@dataclass
class CompletionRequest:
    """A text completion: ``prompt`` and the ``SamplingParams`` fields to set."""

    prompt: str
    """The text to continue (what the prefix-aware router matches on)."""
    params: dict[str, Any] = field(default_factory=dict)
    """``SamplingParams`` fields, e.g. ``{"max_tokens": 32, "temperature": 0.0}``."""


@dataclass
class ChatRequest:
    """A chat turn: ``messages`` (``{"role": ..., "content": ...}``) and sampling fields."""

    messages: list[ChatMessage]
    """The conversation so far (the prefix-aware router matches on its contents)."""
    params: dict[str, Any] = field(default_factory=dict)
    """``SamplingParams`` fields."""


class EngineReplica:
    """The Serve deployment's class: one engine per Serve replica."""

    async def __init__(self, config: dict[str, Any]) -> None:
        self._client = AsyncMPClient(EngineConfig(**config))
        await self._client.start()

    async def completions(self, request: CompletionRequest) -> dict[str, Any]:
        """The final output of one completion, as a plain dict."""
        outs = [o async for o in self._client.generate(request.prompt,
                                                       SamplingParams(**request.params))]
        return _reply(outs[-1])

    async def chat(self, request: ChatRequest) -> dict[str, Any]:
        """The final output of one chat turn, as a plain dict."""
        outs = [o async for o in self._client.chat(request.messages,
                                                   SamplingParams(**request.params))]
        return _reply(outs[-1])

    async def engine_pid(self) -> int:
        """The pid of this replica's engine process (for operators and tests)."""
        return next(iter(self._client.process_ids.values()))

    async def check_health(self) -> None:
        """Serve calls this periodically; raising makes Serve replace this replica."""
        if self._client.is_dead:
            raise EngineDeadError(f"the engine is dead: {await self._client.wait_dead()}")
        await self._client.check_health()

    async def __del__(self) -> None:
        await self._client.shutdown()


def _reply(out: Any) -> dict[str, Any]:
    return {"text": out.text, "token_ids": out.token_ids, "finish_reason": out.finish_reason,
            "num_cached_tokens": out.num_cached_tokens}


def prefix_router() -> type:
    """Ray Serve's ``PrefixCacheAffinityRouter``. Its public home, ``ray.serve.llm``, refuses
    to import without vLLM or SGLang (ray 2.60: its package imports their protocol models);
    the class itself needs neither, so it is taken from where it is defined then (the public
    one subclasses it with nothing added)."""
    try:
        from ray.serve.llm.request_router import PrefixCacheAffinityRouter
    except ImportError:
        from ray.llm._internal.serve.routing_policies.prefix_aware.prefix_aware_router import (
            PrefixCacheAffinityRouter,
        )
    return PrefixCacheAffinityRouter


def deployment(config: EngineConfig, *, num_replicas: int = 1, prefix_aware: bool = True,
               name: str = "aioengine", **options: Any) -> Any:
    """A bound Serve application: ``num_replicas`` engine replicas (``config`` each; keep its
    ``data_parallel_size`` at 1 and let Serve replicate), routed by Ray Serve's
    ``PrefixCacheAffinityRouter`` when ``prefix_aware``. ``options`` go to
    ``serve.deployment`` (``ray_actor_options``, ``health_check_period_s``, ...)."""
    from ray import serve

    if not isinstance(config, EngineConfig):
        raise ValueError(f"config must be an EngineConfig, got {type(config).__name__}")
    if config.data_parallel_size != 1:
        raise ValueError("with Ray Serve, Serve replicates: set num_replicas, not "
                         f"data_parallel_size ({config.data_parallel_size})")
    if prefix_aware:
        from ray.serve.config import RequestRouterConfig

        options.setdefault("request_router_config", RequestRouterConfig(
            request_router_class=prefix_router()))
    fields = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}
    return serve.deployment(EngineReplica, name=name, num_replicas=num_replicas,
                            **options).bind(fields)
