"""KV capacity planning and the context length, on the tiny model's real config."""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

import psutil
import pytest
import torch

from aioengine.config import EngineConfig
from aioengine.hub import resolve_model
from aioengine.worker.capacity import determine_num_kv_blocks, max_context_len
from aioengine.worker.kv_cache import kv_cache_bytes_per_block
from aioengine.worker.models import ModelSpec

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def spec() -> ModelSpec:
    # The real config.json, read without transformers (keeps this module quick to import).
    path = os.path.join(resolve_model("tiny").model_path, "config.json")
    with open(path) as f:
        return ModelSpec.from_hf(SimpleNamespace(**json.load(f)))


def plan(spec: ModelSpec, dtype: torch.dtype = torch.float32, tp: int = 1, **cfg) -> int:
    return determine_num_kv_blocks(EngineConfig(**cfg), spec, dtype, CPU, tp)[0]


def test_explicit_block_count_wins(spec) -> None:
    assert plan(spec, num_kv_blocks=7, kv_cache_memory=10**9) == 7


def test_bytes_give_as_many_blocks_as_fit(spec) -> None:
    per = kv_cache_bytes_per_block(spec, 16, torch.float32)
    # 2 (k, v) x layers x block x kv heads x head dim x 4 bytes
    assert per == 2 * spec.num_layers * 16 * spec.num_kv_heads * spec.head_dim * 4
    assert plan(spec, kv_cache_memory=per * 10 + per - 1) == 10
    assert plan(spec, torch.bfloat16, kv_cache_memory=per * 10) == 20
    assert plan(spec, tp=2, kv_cache_memory=per * 10) == 20  # half the kv heads per rank


def test_too_little_memory_is_a_clear_error(spec) -> None:
    with pytest.raises(ValueError, match="holds no block"):
        plan(spec, kv_cache_memory=100)


def test_fraction_of_free_ram_capped_at_what_can_be_used(spec) -> None:
    blocks, profile = determine_num_kv_blocks(
        EngineConfig(max_num_seqs=3, max_model_len=100, block_size=16,
                     kv_cache_memory_fraction=0.5), spec, torch.float32, CPU)
    assert blocks == 3 * 7  # ceil(100 / 16) blocks for each of 3 sequences
    assert profile is not None and profile.activation_peak_bytes == 0
    assert 0 < profile.free_bytes <= psutil.virtual_memory().total


def test_fraction_uncapped_follows_free_memory(spec) -> None:
    cfg = EngineConfig(max_num_seqs=10**6, kv_cache_memory_fraction=0.01)
    blocks, profile = determine_num_kv_blocks(cfg, spec, torch.float32, CPU)
    assert profile is not None
    assert blocks == int(profile.free_bytes * 0.01) // profile.bytes_per_block


def test_context_length(spec) -> None:
    assert max_context_len(EngineConfig(), spec) == spec.max_position_embeddings
    assert max_context_len(EngineConfig(max_model_len=64), spec) == 64
    with pytest.raises(ValueError, match="exceeds the model's context length"):
        max_context_len(EngineConfig(max_model_len=spec.max_position_embeddings + 1), spec)
