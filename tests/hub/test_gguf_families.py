"""GGUF metadata -> config.json per family, where llama.cpp fixes what a file leaves out (the
files llama.cpp's converter writes are in tests/models/test_gguf_families.py)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from aioengine.hub.gguf_families import base_config, family_config
from aioengine.worker.models.spec import ModelSpec

BASE = {"num_hidden_layers": 7, "hidden_size": 64, "num_attention_heads": 4,
        "num_key_value_heads": 2, "max_position_embeddings": 256, "intermediate_size": 96,
        "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "vocab_size": 9}


def _tensors(*names: str, vocab: int = 32) -> dict[str, Any]:
    out = {"token_embd.weight": SimpleNamespace(shape=[64, vocab])}
    out.update({n: SimpleNamespace(shape=[1]) for n in names})
    return out


def _config(arch: str, fields: dict[str, Any], tensors: dict[str, Any] | None = None,
            **base: Any) -> dict[str, Any]:
    return family_config(arch, fields.get, tensors or _tensors(), {**BASE, **base})


def _gemma(**fields: Any) -> ModelSpec:
    config = _config("gemma3", {"gemma3.attention.key_length": 16, **fields})
    return ModelSpec.from_config_dict(config)


def test_gemma3_layer_pattern_as_llama_cpp_reads_it() -> None:
    # no pattern in the file: llama.cpp's 6 (five local, one global)
    spec = _gemma(**{"gemma3.attention.sliding_window": 4})
    assert spec.window_layers == (0, 1, 2, 3, 4, 6) and spec.sliding_window == 4
    assert spec.attn_scale == 16 ** -0.5 and spec.local_rope is not None
    assert spec.local_rope.theta == 10000.0 and spec.tie_word_embeddings
    assert spec.vocab_size == 32  # the embedding's rows, not the metadata's 9
    # a pattern given as a number, then per layer
    spec = _gemma(**{"gemma3.attention.sliding_window": 4,
                     "gemma3.attention.sliding_window_pattern": 2,
                     "gemma3.rope.freq_base_swa": 100.0})
    assert spec.window_layers == (0, 2, 4, 6) and spec.local_rope.theta == 100.0
    flags = [True, False, False, True, True, True, False]
    spec = _gemma(**{"gemma3.attention.sliding_window": 4,
                     "gemma3.attention.sliding_window_pattern": flags})
    assert spec.window_layers == (0, 3, 4, 5)
    assert _gemma().window_layers == ()  # no window: every layer global
    with pytest.raises(ValueError, match="sliding_window_pattern lists 2 layers; the file has "
                                         "7"):
        _gemma(**{"gemma3.attention.sliding_window": 4,
                  "gemma3.attention.sliding_window_pattern": [True, False]})


def test_llama_file_with_experts_is_mixtral() -> None:
    config = _config("llama", {"llama.expert_count": 4, "llama.expert_used_count": 2},
                     _tensors("output.weight"), model_type="llama")
    spec = ModelSpec.from_config_dict(config)
    assert spec.family == "mixtral" and spec.moe_layers == tuple(range(7))
    assert (spec.num_experts, spec.num_experts_per_tok) == (4, 2)
    assert not spec.tie_word_embeddings
    plain = ModelSpec.from_config_dict(_config("llama", {}, model_type="llama"))
    assert plain.family == "llama" and not plain.moe_layers


def test_qwen3moe_every_layer_sparse_and_renormalised() -> None:
    config = _config("qwen3moe", {"qwen3moe.expert_count": 8, "qwen3moe.expert_used_count": 3,
                                  "qwen3moe.expert_feed_forward_length": 32,
                                  "qwen3moe.attention.key_length": 16})
    spec = ModelSpec.from_config_dict(config)
    assert spec.family == "qwen3_moe" and spec.moe_layers == tuple(range(7))
    assert spec.norm_topk_prob and spec.moe_intermediate_size == 32 and spec.head_dim == 16


def test_phi3_partial_rotary_and_longrope_from_tensors() -> None:
    factors = {"rope_factors_long.weight": SimpleNamespace(data=np.full(6, 2.0, np.float32)),
               "rope_factors_short.weight": SimpleNamespace(data=np.ones(6, np.float32))}
    config = _config("phi3", {"phi3.rope.dimension_count": 12,
                              "phi3.rope.scaling.original_context_length": 128,
                              "phi3.rope.scaling.attn_factor": 1.25,
                              "phi3.attention.sliding_window": 0},
                     {**_tensors(), **factors})
    spec = ModelSpec.from_config_dict(config)
    assert spec.rope.rope_type == "longrope" and spec.rope.partial_rotary_factor == 0.75
    assert spec.rope.long_factor == (2.0,) * 6 and spec.rope.original_max_position == 128
    assert spec.rope.attention_factor == 1.25 and spec.sliding_window is None


def test_smollm3_base_keys_and_fixed_nope_step() -> None:
    fields = {"smollm3.block_count": 8, "smollm3.context_length": 512,
              "smollm3.embedding_length": 64, "smollm3.feed_forward_length": 96,
              "smollm3.attention.head_count": 4, "smollm3.attention.head_count_kv": 2,
              "smollm3.rope.freq_base": 2e6, "smollm3.attention.layer_norm_rms_epsilon": 1e-6,
              "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2}
    base = base_config("smollm3", fields.get)
    assert base["num_hidden_layers"] == 8 and base["eos_token_id"] == 2
    spec = ModelSpec.from_config_dict(family_config("smollm3", fields.get, _tensors(), base))
    assert spec.family == "smollm3" and spec.nope_layers == (3, 7)
    assert spec.rope.theta == 2e6 and spec.tie_word_embeddings
