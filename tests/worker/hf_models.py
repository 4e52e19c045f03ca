"""Small random Hugging Face models saved to disk (safetensors), one per supported variant."""

from __future__ import annotations

from typing import Any

import torch
from transformers import (
    AutoModelForCausalLM,
    Gemma3TextConfig,
    LlamaConfig,
    MistralConfig,
    MixtralConfig,
    Phi3Config,
    Qwen2Config,
    Qwen3Config,
    Qwen3MoeConfig,
    SmolLM3Config,
)

_BASE = dict(vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
             rms_norm_eps=1e-5)

VARIANTS: dict[str, tuple[type, dict[str, Any]]] = {
    "llama": (LlamaConfig, dict(_BASE, architectures=["LlamaForCausalLM"],
                                tie_word_embeddings=False)),
    # Llama 3 style: llama3 rope scaling (original context 32, so it matters here), tied.
    "llama3-tied": (LlamaConfig, dict(
        _BASE, architectures=["LlamaForCausalLM"], tie_word_embeddings=True,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 32},
        rope_theta=500000.0)),
    "llama-linear-bias": (LlamaConfig, dict(
        _BASE, architectures=["LlamaForCausalLM"], tie_word_embeddings=False,
        rope_scaling={"rope_type": "linear", "factor": 2.0}, attention_bias=True,
        mlp_bias=True, num_key_value_heads=4)),
    "qwen2": (Qwen2Config, dict(_BASE, architectures=["Qwen2ForCausalLM"],
                                tie_word_embeddings=True, num_key_value_heads=1)),
    "qwen3": (Qwen3Config, dict(_BASE, architectures=["Qwen3ForCausalLM"], head_dim=32,
                                tie_word_embeddings=False)),
    # Layers 0 and 2 sparse (8 experts, top 3, renormalised), layer 1 dense (mlp_only_layers).
    "qwen3-moe": (Qwen3MoeConfig, dict(
        _BASE, architectures=["Qwen3MoeForCausalLM"], head_dim=16, num_hidden_layers=3,
        moe_intermediate_size=32, num_experts=8, num_experts_per_tok=3, norm_topk_prob=True,
        mlp_only_layers=[1], tie_word_embeddings=False)),
    "mixtral": (MixtralConfig, dict(_BASE, architectures=["MixtralForCausalLM"],
                                    num_local_experts=4, num_experts_per_tok=2,
                                    tie_word_embeddings=False)),
    # A window of 7 keys: far shorter than the schedule's sequences (up to ~60 tokens).
    "mistral": (MistralConfig, dict(_BASE, architectures=["MistralForCausalLM"], head_dim=16,
                                    sliding_window=7, tie_word_embeddings=False)),
    # Qwen2 with use_sliding_window: layers from max_window_layers=1 on windowed, layer 0 full.
    "qwen2-window": (Qwen2Config, dict(_BASE, architectures=["Qwen2ForCausalLM"],
                                       tie_word_embeddings=True, use_sliding_window=True,
                                       sliding_window=9, max_window_layers=1)),
    # Gemma 3: local, global, local layers (window 6, local RoPE base 100), soft-capped logits,
    # a query scale that is not head_dim's.
    "gemma3": (Gemma3TextConfig, dict(
        _BASE, architectures=["Gemma3ForCausalLM"], head_dim=16, num_hidden_layers=3,
        sliding_window=6, sliding_window_pattern=2, rope_theta=5000.0,
        rope_local_base_freq=100.0, final_logit_softcapping=20.0, query_pre_attn_scalar=24,
        tie_word_embeddings=True)),
    # SmolLM3: layer 1 of 3 is NoPE (no rotary embedding), tied, as SmolLM3-3B's 1 in 4.
    "smollm3": (SmolLM3Config, dict(_BASE, architectures=["SmolLM3ForCausalLM"],
                                    num_hidden_layers=3, no_rope_layer_interval=2,
                                    tie_word_embeddings=True, pad_token_id=None,
                                    bos_token_id=None, eos_token_id=None)),
    # Phi-4-mini style: longrope with 3/4 of each head rotated; original context 128 (the
    # parity schedule stays on the short factors; test_phi3_longrope crosses it).
    "phi3": (Phi3Config, dict(
        _BASE, architectures=["Phi3ForCausalLM"], tie_word_embeddings=True,
        num_attention_heads=2, num_key_value_heads=1, partial_rotary_factor=0.75,
        pad_token_id=None, eos_token_id=None,
        original_max_position_embeddings=128, rope_scaling={
            "type": "longrope", "short_factor": [1.0 + 0.1 * i for i in range(12)],
            "long_factor": [2.0 + 0.5 * i for i in range(12)]})),
}


def make_hf_model(variant: str, path: str, seed: int = 0, **overrides: Any) -> Any:
    """A random (not default-initialised: every weight, bias and norm is random) model of the
    variant, saved with ``save_pretrained`` to ``path``; returns the HF model in eval mode."""
    cls, kwargs = VARIANTS[variant]
    config = cls(**{**kwargs, **overrides})
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32,
                                             attn_implementation="eager")
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.copy_(1.0 + 0.2 * torch.randn_like(param))
            else:
                param.normal_(0.0, 0.15)
    model.save_pretrained(path)
    return model.eval()
