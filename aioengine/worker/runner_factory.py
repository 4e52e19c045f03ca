"""The runner for the configured model: an ``EncoderRunner`` for an encoder (an embedder or a
reranker), else the ``ModelRunner`` (decoders, with their KV cache and sampler; a decoder
embedder pools there)."""

from __future__ import annotations

from aioengine.config import EngineConfig
from aioengine.hub import read_model_info, resolve_model
from aioengine.hub.model_info import CLASSIFIER_ARCHITECTURES, ENCODER_ARCHITECTURES
from aioengine.worker.encoder.runner import EncoderRunner
from aioengine.worker.model_runner import ModelRunner


def make_runner(config: EngineConfig, *, rank: int = 0, world_size: int = 1,
                device: str | None = None) -> ModelRunner | EncoderRunner:
    resolved = resolve_model(config.model, config.tokenizer)
    architectures = read_model_info(resolved.model_path).architectures
    if any(a in ENCODER_ARCHITECTURES + CLASSIFIER_ARCHITECTURES for a in architectures):
        return EncoderRunner(config, rank=rank, world_size=world_size, device=device)
    return ModelRunner(config, rank=rank, world_size=world_size, device=device)
