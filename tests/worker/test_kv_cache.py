"""KV cache sizing and allocation."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig

from aioengine.worker.kv_cache import (
    allocate_kv_cache,
    kv_cache_bytes_per_block,
    num_blocks_for_bytes,
)

CONFIG = LlamaConfig(hidden_size=64, num_attention_heads=8, num_key_value_heads=4,
                     num_hidden_layers=3, intermediate_size=96, vocab_size=100,
                     architectures=["LlamaForCausalLM"])


def test_bytes_per_block():
    # 2 (k, v) * 3 layers * 16 tokens * 4 kv heads * 8 head_dim * 2 bytes
    assert kv_cache_bytes_per_block(CONFIG, 16, torch.bfloat16) == 2 * 3 * 16 * 4 * 8 * 2
    assert kv_cache_bytes_per_block(CONFIG, 16, torch.float32, tp_size=2) == 2 * 3 * 16 * 2 * 8 * 4


def test_allocate_shapes_and_zeroed():
    caches = allocate_kv_cache(CONFIG, 10, 16, torch.float32, "cpu", tp_size=2)
    assert len(caches) == 3
    assert all(c.shape == (2, 2, 10, 16, 8) and not c.any() for c in caches)
    per = kv_cache_bytes_per_block(CONFIG, 16, torch.float32, tp_size=2)
    assert sum(c.numel() * c.element_size() for c in caches) == 10 * per


def test_num_blocks_for_bytes():
    per = kv_cache_bytes_per_block(CONFIG, 16, torch.float32)
    assert num_blocks_for_bytes(CONFIG, 5 * per + 1, 16, torch.float32) == 5
    with pytest.raises(ValueError, match="holds no block"):
        num_blocks_for_bytes(CONFIG, per - 1, 16, torch.float32)


def test_bad_sizes():
    with pytest.raises(ValueError, match="must be positive"):
        allocate_kv_cache(CONFIG, 0, 16, torch.float32, "cpu")
    with pytest.raises(ValueError, match=r"num_key_value_heads \(4\) must be divisible"):
        kv_cache_bytes_per_block(CONFIG, 16, torch.float32, tp_size=3)
