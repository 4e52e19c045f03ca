"""The engine the in-process server tests run on."""

from __future__ import annotations

from aioengine import EngineConfig

MAX_MODEL_LEN = 512


def engine_config() -> EngineConfig:
    # Small and fixed: the KV cache fits 200 short concurrent streams, the context is short
    # enough that a "too long" prompt is cheap to build.
    return EngineConfig(model="tiny", device="cpu", max_model_len=MAX_MODEL_LEN,
                        num_kv_blocks=1024, max_num_seqs=256)
