"""aioengine: an asyncio-native, embeddable LLM inference engine.

The public names load on first use, so child processes that import ``aioengine.engine`` or
``aioengine.worker`` do not pay for the client, and importing ``aioengine`` never imports torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_PUBLIC = {
    "AsyncMPClient": "aioengine.client.async_client",
    "SyncMPClient": "aioengine.client.sync_client",
    "LLM": "aioengine.client.llm",
    "RequestOutput": "aioengine.client.outputs",
    "RequestMetrics": "aioengine.client.outputs",
    "EngineConfig": "aioengine.config",
    "SamplingParams": "aioengine.messages.sampling_params",
    "StructuredOutputs": "aioengine.messages.sampling_params",
    "EngineStats": "aioengine.messages.engine_io",
    "EngineStartupError": "aioengine.runtime.errors",
    "EngineDeadError": "aioengine.runtime.errors",
    "EngineOverloadedError": "aioengine.runtime.errors",
    "make_client": "aioengine.client.factory",
}

__all__ = [
    "LLM", "AsyncMPClient", "EngineConfig", "EngineDeadError", "EngineOverloadedError",
    "EngineStartupError", "EngineStats", "RequestMetrics", "RequestOutput", "SamplingParams",
    "StructuredOutputs", "SyncMPClient", "__version__", "make_client",
]

if TYPE_CHECKING:
    from aioengine.client.async_client import AsyncMPClient
    from aioengine.client.factory import make_client
    from aioengine.client.llm import LLM
    from aioengine.client.outputs import RequestMetrics, RequestOutput
    from aioengine.client.sync_client import SyncMPClient
    from aioengine.config import EngineConfig
    from aioengine.messages.engine_io import EngineStats
    from aioengine.messages.sampling_params import SamplingParams, StructuredOutputs
    from aioengine.runtime.errors import (
        EngineDeadError,
        EngineOverloadedError,
        EngineStartupError,
    )


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'aioengine' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted(__all__)
