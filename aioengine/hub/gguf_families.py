"""GGUF metadata -> the Hugging Face ``config.json`` keys of each family, as llama.cpp reads the
file (its ``src/models/<arch>.cpp``): where llama.cpp fixes a value the file does not carry
(Gemma 3's layer pattern, query scale and local RoPE base), the config says what llama.cpp
runs, so a file means the same model here as there.

transformers' own GGUF mapping (``load_gguf_checkpoint``) gives the shared keys; this module
adds what it leaves out per family. Runs in the converter child (``gguf_convert``), never in
the host.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

# GGUF ``general.architecture`` -> the HF architecture class name our ModelSpec reads. A
# ``llama`` file with experts is Mixtral (llama.cpp's converter writes Mixtral and Mistral
# checkpoints as ``llama``).
ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "qwen3moe": "Qwen3MoeForCausalLM",
    "gemma3": "Gemma3ForCausalLM",
    "phi3": "Phi3ForCausalLM",
    "smollm3": "SmolLM3ForCausalLM",
}
_MODEL_TYPES = {"qwen3moe": "qwen3_moe", "gemma3": "gemma3_text"}
# Architectures transformers' GGUF mapping does not read: ``base_config`` reads them.
OWN_BASE = ("smollm3",)
# llama.cpp's fixed NoPE step for SmolLM3 (src/models/smollm3.cpp): every 4th layer.
SMOLLM3_NO_ROPE_STEP = 4
_BASE_KEYS = {"context_length": "max_position_embeddings", "block_count": "num_hidden_layers",
              "feed_forward_length": "intermediate_size", "embedding_length": "hidden_size",
              "rope.freq_base": "rope_theta", "attention.head_count": "num_attention_heads",
              "attention.head_count_kv": "num_key_value_heads",
              "attention.layer_norm_rms_epsilon": "rms_norm_eps"}
_TOKEN_IDS = {"bos_token_id": "bos_token_id", "eos_token_id": "eos_token_id",
              "padding_token_id": "pad_token_id"}

# llama.cpp's defaults for keys a Gemma 3 file may leave out (src/models/gemma3.cpp).
GEMMA3_SWA_PATTERN = 6
GEMMA3_ROPE_BASE_SWA = 10000.0
GEMMA3_27B_LAYERS = 62  # llama.cpp scales the 27B's queries by hidden/heads, not head_dim

Field = Callable[[str], Any]  # a metadata key -> its value, None when absent


def family_config(arch: str, field: Field, tensors: dict[str, Any],
                  config: dict[str, Any]) -> dict[str, Any]:
    """``config`` (transformers' reading of the file) completed for ``arch``: architectures,
    model_type, tied embeddings and vocabulary from the tensors, and the family's own keys.
    ``tensors``: tensor name -> the reader's tensor."""
    out = {k: v for k, v in config.items() if not k.startswith("_")}
    key_length = field(f"{arch}.attention.key_length")
    if key_length is not None:  # transformers' mapping drops it for several families
        out["head_dim"] = int(key_length)
    embed = tensors.get("token_embd.weight")
    if embed is not None:  # the tensor decides (Gemma's converter drops padding rows)
        out["vocab_size"] = int(embed.shape[-1])
    out["tie_word_embeddings"] = "output.weight" not in tensors
    name = ARCHITECTURES[arch]
    if arch == "llama" and field("llama.expert_count"):
        name = "MixtralForCausalLM"
        out.update(model_type="mixtral", num_local_experts=int(field("llama.expert_count")),
                   num_experts_per_tok=int(field("llama.expert_used_count")))
    elif arch == "qwen3moe":
        out.update(_qwen3moe(field))
    elif arch == "gemma3":
        out.update(_gemma3(field, out))
    elif arch == "phi3":
        out.update(_phi3(field, tensors, out))
    elif arch == "smollm3":
        out.update(no_rope_layer_interval=SMOLLM3_NO_ROPE_STEP, use_sliding_window=False)
    out["architectures"] = [name]
    out["model_type"] = out.get("model_type") if arch == "llama" else _MODEL_TYPES.get(arch, arch)
    return out


def base_config(arch: str, field: Field) -> dict[str, Any]:
    """The shared keys, for an architecture transformers' GGUF mapping lacks (``OWN_BASE``),
    read as that mapping reads them for the others."""
    out: dict[str, Any] = {"model_type": arch}
    for key, name in _BASE_KEYS.items():
        value = field(f"{arch}.{key}")
        if value is not None:
            out[name] = value
    for key, name in _TOKEN_IDS.items():
        value = field(f"tokenizer.ggml.{key}")
        if value is not None:
            out[name] = int(value)
    return out


def _qwen3moe(field: Field) -> dict[str, Any]:
    # llama.cpp: every layer sparse, top-k weights renormalised
    return {"num_experts": int(field("qwen3moe.expert_count")),
            "num_experts_per_tok": int(field("qwen3moe.expert_used_count")),
            "moe_intermediate_size": int(field("qwen3moe.expert_feed_forward_length")),
            "norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": []}


def _gemma3(field: Field, config: dict[str, Any]) -> dict[str, Any]:
    layers, head_dim = config["num_hidden_layers"], config["head_dim"]
    window = field("gemma3.attention.sliding_window")
    pattern = field("gemma3.attention.sliding_window_pattern")
    if not window:  # no sliding window: every layer global
        kinds = [False] * layers
        window = config["max_position_embeddings"]
    elif isinstance(pattern, list):  # per layer: true = sliding
        if len(pattern) != layers:
            raise ValueError(f"gemma3.attention.sliding_window_pattern lists {len(pattern)} "
                             f"layers; the file has {layers}")
        kinds = [bool(p) for p in pattern]
    else:
        n = int(pattern) if pattern is not None else GEMMA3_SWA_PATTERN
        kinds = [i % n < n - 1 for i in range(layers)]
    scalar = (config["hidden_size"] // config["num_attention_heads"]
              if layers == GEMMA3_27B_LAYERS else head_dim)
    base_swa = field("gemma3.rope.freq_base_swa")
    return {"sliding_window": int(window),
            "layer_types": ["sliding_attention" if k else "full_attention" for k in kinds],
            "query_pre_attn_scalar": scalar,
            "rope_local_base_freq": float(base_swa or GEMMA3_ROPE_BASE_SWA),
            "final_logit_softcapping": field("gemma3.final_logit_softcapping"),
            "hidden_activation": "gelu_pytorch_tanh"}


def _phi3(field: Field, tensors: dict[str, Any], config: dict[str, Any]) -> dict[str, Any]:
    head_dim = config["hidden_size"] // config["num_attention_heads"]
    out: dict[str, Any] = {"head_dim": head_dim}
    rotary = field("phi3.rope.dimension_count")
    if rotary is not None and int(rotary) != head_dim:
        out["partial_rotary_factor"] = int(rotary) / head_dim
    window = field("phi3.attention.sliding_window")
    out["sliding_window"] = int(window) if window else None
    long, short = tensors.get("rope_factors_long.weight"), tensors.get("rope_factors_short.weight")
    if long is not None and short is not None:
        original = field("phi3.rope.scaling.original_context_length")
        rope: dict[str, Any] = {"rope_type": "longrope", "rope_theta": config.get("rope_theta"),
                                "long_factor": [float(x) for x in long.data],
                                "short_factor": [float(x) for x in short.data]}
        attn_factor = field("phi3.rope.scaling.attn_factor")
        if attn_factor is not None:
            rope["attention_factor"] = float(attn_factor)
        out["rope_scaling"] = rope
        out["original_max_position_embeddings"] = int(original or
                                                      config["max_position_embeddings"])
    return out
