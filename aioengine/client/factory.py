"""Pick a client: async multiprocess (the host's event loop), sync multiprocess (blocking
callers), or in-process (engine core in this process, for debugging)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from aioengine.client.async_client import AsyncMPClient
from aioengine.client.chat_template import ChatMessage
from aioengine.client.inputs import Prompt
from aioengine.client.outputs import RequestOutput
from aioengine.client.tokenizer import Tokenizer
from aioengine.config import EngineConfig
from aioengine.messages.engine_io import EngineStats
from aioengine.messages.sampling_params import SamplingParams

CLIENT_KINDS = ("async", "mp", "inproc")


class SyncClient(Protocol):
    """What ``LLM`` needs from a blocking client."""

    @property
    def tokenizer(self) -> Tokenizer: ...
    @property
    def max_model_len(self) -> int: ...
    def prepare(self, prompt: Prompt, params: SamplingParams | None
                ) -> tuple[list[int], SamplingParams]: ...
    def prepare_chat(self, messages: Sequence[ChatMessage], params: SamplingParams | None,
                     **template_kwargs: Any) -> tuple[list[int], SamplingParams]: ...
    def generate_all(self, requests: Sequence[tuple[list[int], SamplingParams]],
                     on_finished: Callable[[], object] | None = None) -> list[RequestOutput]: ...
    def get_stats(self) -> EngineStats: ...
    def shutdown(self) -> None: ...


def make_sync_client(config: EngineConfig | None, kind: str = "mp") -> SyncClient:
    """``mp``: engine in child processes; ``inproc``: engine core in this process."""
    if kind == "mp":
        from aioengine.client.sync_client import SyncMPClient
        return SyncMPClient(config)
    if kind == "inproc":
        # Imported only here: the in-process client brings torch into this process.
        from aioengine.client.inproc_client import InprocClient
        return InprocClient(config)
    raise ValueError(f"client must be 'mp' or 'inproc' for a blocking client, got {kind!r}")


def make_client(config: EngineConfig | None = None, kind: str = "async"
                ) -> AsyncMPClient | SyncClient:
    """``async``: an unstarted ``AsyncMPClient`` (``async with`` it); ``mp`` / ``inproc``: a
    started blocking client."""
    if kind == "async":
        return AsyncMPClient(config)
    if kind in CLIENT_KINDS:
        return make_sync_client(config, kind)
    raise ValueError(f"client kind must be one of {CLIENT_KINDS}, got {kind!r}")
