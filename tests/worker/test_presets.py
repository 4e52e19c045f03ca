"""Benchmark presets: public shapes parse into our model spec; dummy weights build."""

from __future__ import annotations

import torch

from aioengine.hub import resolve_model
from aioengine.worker.kv_cache import kv_cache_bytes_per_block
from aioengine.worker.loader import read_model_spec


def test_preset_shapes():
    qwen = read_model_spec(resolve_model("qwen2.5-0.5b").model_path)
    assert (qwen.family, qwen.hidden_size, qwen.num_layers, qwen.num_heads, qwen.num_kv_heads,
            qwen.head_dim, qwen.vocab_size) == ("qwen2", 896, 24, 14, 2, 64, 151936)
    assert qwen.qkv_bias and qwen.tie_word_embeddings
    llama = read_model_spec(resolve_model("llama-3.2-1b").model_path)
    assert (llama.family, llama.hidden_size, llama.num_layers, llama.num_heads,
            llama.num_kv_heads, llama.head_dim) == ("llama", 2048, 16, 32, 8, 64)
    assert llama.rope.rope_type == "llama3" and llama.rope.factor == 32.0
    # 2 * 16 layers * 16 tokens * 8 kv heads * 64 * 2 bytes
    assert kv_cache_bytes_per_block(llama, 16, torch.bfloat16) == 2 * 16 * 16 * 8 * 64 * 2
