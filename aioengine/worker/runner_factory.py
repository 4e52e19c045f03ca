"""The runner for the configured model: an ``EncoderRunner`` for an embedding encoder, else the
``ModelRunner`` (decoders, with their KV cache and sampler)."""

from __future__ import annotations

from aioengine.config import EngineConfig
from aioengine.hub import read_model_info, resolve_model
from aioengine.worker.encoder.runner import EncoderRunner
from aioengine.worker.model_runner import ModelRunner


def make_runner(config: EngineConfig, *, rank: int = 0, world_size: int = 1,
                device: str | None = None) -> ModelRunner | EncoderRunner:
    resolved = resolve_model(config.model, config.tokenizer)
    if read_model_info(resolved.model_path).task in ("embed", "score"):
        return EncoderRunner(config, rank=rank, world_size=world_size, device=device)
    return ModelRunner(config, rank=rank, world_size=world_size, device=device)
