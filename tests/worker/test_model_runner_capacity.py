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
from aioengine.worker.capacity import (
    CPU_RAM_FRACTION,
    PREFIX_CACHE_PERCENT,
    max_context_len,
    plan_kv_cache,
)
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
    return plan_kv_cache(EngineConfig(**cfg), spec, dtype, CPU, tp).num_blocks


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


def test_cpu_default_is_the_need_plus_the_prefix_share(spec) -> None:
    kv = plan_kv_cache(EngineConfig(max_num_seqs=3, max_model_len=100, block_size=16), spec,
                       torch.float32, CPU)
    need = 3 * 7  # ceil(100 / 16) blocks for each of 3 sequences
    assert kv.num_blocks == need + -(-need * PREFIX_CACHE_PERCENT // 100) == 24
    assert kv.sized_by.startswith("need: max_num_seqs=3 x 112 tokens + 10% prefix-cache share")
    assert kv.profile is not None and kv.profile.activation_peak_bytes == 0
    assert 0 < kv.profile.free_bytes <= psutil.virtual_memory().total
    # without prefix caching there is no share
    assert plan(spec, max_num_seqs=3, max_model_len=100, enable_prefix_caching=False) == need


def test_cpu_default_capped_at_a_fraction_of_available_ram(spec) -> None:
    cfg = EngineConfig(max_num_seqs=10**6, kv_cache_memory_fraction=0.01)
    kv = plan_kv_cache(cfg, spec, torch.float32, CPU)
    assert kv.profile is not None
    assert kv.num_blocks == int(kv.profile.free_bytes * 0.01) // kv.profile.bytes_per_block
    assert kv.sized_by.startswith("cap: kv_cache_memory_fraction=0.01 of ")
    default = plan_kv_cache(EngineConfig(max_num_seqs=10**6), spec, torch.float32, CPU)
    assert default.profile is not None
    assert default.num_blocks * default.bytes_per_block <= \
        default.profile.free_bytes * CPU_RAM_FRACTION


def test_tokens_give_whole_blocks(spec) -> None:
    assert plan(spec, kv_cache_tokens=1000) == 63  # ceil(1000 / 16)
    kv = plan_kv_cache(EngineConfig(kv_cache_memory="1MiB"), spec, torch.float32, CPU)
    assert kv.num_blocks == 2**20 // kv.bytes_per_block
    assert kv.sized_by == "kv_cache_memory=1.00 MiB"


def test_explicit_size_below_one_sequence_names_the_field_and_minimum(spec) -> None:
    with pytest.raises(ValueError, match=r"kv_cache_tokens: .* less than one sequence of "
                       r"max_model_len=512; the minimum is 512 tokens"):
        plan(spec, kv_cache_tokens=100, max_model_len=512)


def test_more_than_the_ram_fails_naming_the_setting(spec) -> None:
    ram = psutil.virtual_memory().total
    with pytest.raises(ValueError, match=r"RAM available; lower kv_cache_memory$"):
        plan(spec, kv_cache_memory=2 * ram)
    with pytest.raises(ValueError, match=r"RAM available; lower kv_cache_tokens$"):
        plan(spec, kv_cache_tokens=ram)  # every token takes more than a byte


def test_cap_below_one_sequence_fails_naming_the_settings(spec) -> None:
    with pytest.raises(ValueError, match=r"one sequence of max_model_len=2048 tokens needs .* "
                       r"more than the cap .*lower max_model_len, or set kv_cache_memory"):
        plan(spec, max_model_len=2048, kv_cache_memory_fraction=1e-12)


def test_context_length(spec) -> None:
    assert max_context_len(EngineConfig(), spec) == spec.max_position_embeddings
    assert max_context_len(EngineConfig(max_model_len=64), spec) == 64
    with pytest.raises(ValueError, match="exceeds the model's context length"):
        max_context_len(EngineConfig(max_model_len=spec.max_position_embeddings + 1), spec)
