"""Shape presets for benchmarks: public config values of real models, dummy weights.

They reuse the tiny model's tokenizer (no network, no download): prompts are tokenized with it,
and ``bos``/``eos`` ids in the written config are the tiny tokenizer's. Dummy weights can
produce ids beyond that tokenizer's vocab; those decode to empty text. Only the shapes (and so
the speed) are those of the named model.
"""

from __future__ import annotations

import json
import os
from typing import Any

from aioengine.hub.tokenizer_build import SPECIAL_TOKENS

PRESET_VERSION = 1

PRESETS: dict[str, dict[str, Any]] = {
    # Qwen/Qwen2.5-0.5B-Instruct config.json
    "qwen2.5-0.5b": {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "hidden_size": 896,
        "intermediate_size": 4864,
        "num_hidden_layers": 24,
        "num_attention_heads": 14,
        "num_key_value_heads": 2,
        "max_position_embeddings": 32768,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "vocab_size": 151936,
        "tie_word_embeddings": True,
        "hidden_act": "silu",
        "use_sliding_window": False,
        "torch_dtype": "bfloat16",
    },
    # meta-llama/Llama-3.2-1B config.json
    "llama-3.2-1b": {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "num_hidden_layers": 16,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 64,
        "max_position_embeddings": 131072,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                         "original_max_position_embeddings": 8192, "rope_type": "llama3"},
        "vocab_size": 128256,
        "tie_word_embeddings": True,
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "torch_dtype": "bfloat16",
    },
}


def preset_dir_name(name: str) -> str:
    return f"preset-{name}-v{PRESET_VERSION}"


def write_preset(name: str, out_dir: str) -> None:
    bos, eos, im_end = 0, SPECIAL_TOKENS.index("<|eos|>"), SPECIAL_TOKENS.index("<|im_end|>")
    config = dict(PRESETS[name], bos_token_id=bos, eos_token_id=eos)
    with open(os.path.join(out_dir, "config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2)
    with open(os.path.join(out_dir, "generation_config.json"), "w", encoding="utf-8") as f:
        json.dump({"bos_token_id": bos, "eos_token_id": [eos, im_end]}, f, indent=2)
