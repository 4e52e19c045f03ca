"""The facts of a decoder-only model our one decoder implementation needs, read from a Hugging
Face ``config.json`` (``ModelSpec.from_config_dict``) with the small per-family differences
made explicit.

The engine reads the JSON itself: importing transformers for ``AutoConfig`` costs seconds of
CPU in every engine and worker process. ``FAMILY_DEFAULTS`` restates the defaults transformers'
``LlamaConfig``, ``Qwen2Config`` and ``Qwen3Config`` (5.x) give keys a config leaves out, so
both readings agree; ``ModelSpec.from_hf`` reads a transformers config object, and the tests
hold the two against each other.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from aioengine.worker.models.rope_config import (
    DEFAULT_ROPE_THETA,
    ROPE_TYPES,
    Getter,
    RopeSpec,
    _is_int,
    _is_number,
    rope_spec,
)
from aioengine.worker.models.spec_families import (
    MOE_FAMILIES,
    gemma3_fields,
    moe_fields,
    nope_layers,
    window_fields,
)
from aioengine.worker.parallel.state import divide

# Families whose attention_bias flag is honoured (Qwen2: always biased q/k/v).
_ATTN_BIAS = ("llama", "qwen3", "qwen3_moe", "gemma3", "smollm3")

__all__ = ["DEFAULT_ROPE_THETA", "ROPE_TYPES", "SUPPORTED_ARCHITECTURES", "ModelSpec", "RopeSpec",
           "family_of", "rope_spec"]

# HF ``architectures`` entry -> family. The families differ only in flags below.
SUPPORTED_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "Qwen3MoeForCausalLM": "qwen3_moe",
    "MixtralForCausalLM": "mixtral",
    "Phi3ForCausalLM": "phi3",
    "MistralForCausalLM": "mistral",
    "Gemma3ForCausalLM": "gemma3",
    "SmolLM3ForCausalLM": "smollm3",
}
_MODEL_TYPES = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "qwen3_moe": "qwen3_moe",
                "mixtral": "mixtral", "phi3": "phi3", "mistral": "mistral",
                "gemma3_text": "gemma3", "smollm3": "smollm3"}

_QWEN = {"vocab_size": 151936, "intermediate_size": 22016, "num_key_value_heads": 32,
         "max_position_embeddings": 32768, "use_sliding_window": False, "sliding_window": 4096,
         "max_window_layers": 28}
# The transformers config class defaults, by ``model_type`` (as AutoConfig picks the class).
# ``None`` means "derived": kv heads = attention heads, head_dim = hidden_size // heads.
FAMILY_DEFAULTS: dict[str, dict[str, Any]] = {
    "llama": {"vocab_size": 32000, "intermediate_size": 11008, "num_key_value_heads": None,
              "max_position_embeddings": 2048, "head_dim": None, "mlp_bias": False},
    "qwen2": {**_QWEN, "head_dim": None},
    "qwen3": {**_QWEN, "head_dim": 128},
    "qwen3_moe": {**_QWEN, "head_dim": None, "hidden_size": 2048, "intermediate_size": 6144,
                  "num_hidden_layers": 24, "num_key_value_heads": 4,
                  "moe_intermediate_size": 768, "num_local_experts": 128, "num_experts_per_tok": 8,
                  "norm_topk_prob": False, "decoder_sparse_step": 1, "mlp_only_layers": []},
    "mixtral": {"vocab_size": 32000, "intermediate_size": 14336, "num_key_value_heads": 8,
                "max_position_embeddings": 131072, "head_dim": None, "rms_norm_eps": 1e-5,
                "rope_theta": 1e6, "num_local_experts": 8, "num_experts_per_tok": 2},
    "mistral": {"vocab_size": 32000, "intermediate_size": 14336, "num_key_value_heads": 8,
                "max_position_embeddings": 131072, "head_dim": None, "sliding_window": 4096},
    "gemma3": {"vocab_size": 262208, "hidden_size": 2304, "intermediate_size": 9216,
               "num_hidden_layers": 26, "num_attention_heads": 8, "num_key_value_heads": 4,
               "head_dim": 256, "max_position_embeddings": 131072, "tie_word_embeddings": True,
               "sliding_window": 4096, "query_pre_attn_scalar": 256, "rope_theta": 1e6,
               "rope_local_base_freq": 10000.0, "sliding_window_pattern": 6,
               "hidden_activation": "gelu_pytorch_tanh"},
    "smollm3": {"vocab_size": 128256, "hidden_size": 2048, "intermediate_size": 11008,
                "num_hidden_layers": 36, "num_attention_heads": 16, "num_key_value_heads": 4,
                "max_position_embeddings": 32768, "head_dim": None, "mlp_bias": False,
                "tie_word_embeddings": True, "use_sliding_window": False,
                "sliding_window": None, "no_rope_layer_interval": 4, "rope_theta": 2e6},
    "phi3": {"vocab_size": 32064, "hidden_size": 3072, "intermediate_size": 8192,
             "num_key_value_heads": None, "max_position_embeddings": 4096, "head_dim": None,
             "rms_norm_eps": 1e-5, "original_max_position_embeddings": 4096},
}
_COMMON_DEFAULTS = {"hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
                    "hidden_act": "silu", "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
                    "attention_bias": False}

_POSITIVE_INTS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                  "num_attention_heads", "max_position_embeddings")
_OPTIONAL_INTS = ("num_key_value_heads", "head_dim")
_BOOLS = ("tie_word_embeddings", "attention_bias", "mlp_bias", "use_sliding_window",
          "norm_topk_prob")



@dataclass(frozen=True)
class ModelSpec:
    family: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    max_position_embeddings: int
    rms_norm_eps: float
    rope: RopeSpec
    qkv_bias: bool  # Qwen2: always; Llama/Qwen3: ``attention_bias``
    o_bias: bool  # Llama/Qwen3 ``attention_bias`` covers o_proj too; never on Qwen2
    mlp_bias: bool  # Llama only (Qwen MLPs have no bias whatever the config says)
    qk_norm: bool  # Qwen3: RMSNorm over head_dim on q and k before RoPE
    tie_word_embeddings: bool
    checkpoint_dtype: str | None = None  # config's ``dtype`` / ``torch_dtype``, e.g. "bfloat16"
    # Mixture of experts (Qwen3-MoE, Mixtral): the layers whose MLP is a sparse expert block.
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = False
    moe_layers: tuple[int, ...] = ()
    # Sliding-window attention: the layers (all, or Qwen2's upper ones) where the query at
    # position p sees keys p - sliding_window + 1 .. p only.
    sliding_window: int | None = None
    window_layers: tuple[int, ...] = ()
    # Gemma 3: (1 + w) RMSNorms, also after attention and around the MLP; GELU (tanh) MLP;
    # embeddings times embed_scale; queries scaled by attn_scale (else head_dim ** -0.5);
    # windowed layers on local_rope; logits soft-capped.
    norm_offset: bool = False
    sandwich_norms: bool = False
    hidden_act: str = "silu"
    embed_scale: float | None = None
    attn_scale: float | None = None
    local_rope: RopeSpec | None = None
    final_logit_softcapping: float | None = None
    # SmolLM3: the layers whose attention applies no rotary embedding (NoPE).
    nope_layers: tuple[int, ...] = ()

    @property
    def all_layers_windowed(self) -> bool:
        """KV blocks wholly before every window can be freed (no layer reads them)."""
        return len(self.window_layers) == self.num_layers

    @classmethod
    def from_config_dict(cls, raw: Mapping[str, Any], source: str = "config.json"
                         ) -> ModelSpec:
        """From a parsed ``config.json``; keys it leaves out get the family's transformers
        defaults. Raises ValueError naming ``source`` and the key for a bad or unsupported
        value."""
        if not isinstance(raw, Mapping):
            raise ValueError(f"{source}: expected a JSON object, got {type(raw).__name__}")
        family = family_of(raw.get, source)
        model_type = raw.get("model_type")
        known = isinstance(model_type, str) and model_type in _MODEL_TYPES
        defaults = FAMILY_DEFAULTS[_MODEL_TYPES[model_type] if known else family]
        merged = {**_COMMON_DEFAULTS, **defaults, **raw}
        _check_types(merged, source)
        return _build(merged.get, family, source)

    @classmethod
    def from_hf(cls, cfg: Any) -> ModelSpec:
        """From a transformers config object (its defaults are applied already). The engine
        reads JSON; this is the oracle the tests compare ``from_config_dict`` with."""
        source = type(cfg).__name__

        def get(key: str) -> Any:
            return getattr(cfg, key, None)

        family = family_of(get, source)
        _check_types({key: get(key) for key in (*_POSITIVE_INTS, *_OPTIONAL_INTS, "rms_norm_eps")},
                     source)
        return _build(get, family, source)

    def kv_heads_per_rank(self, tp_size: int) -> int:
        return divide(self.num_kv_heads, tp_size, "num_key_value_heads")

    def check_tp(self, tp_size: int) -> None:
        divide(self.num_heads, tp_size, "num_attention_heads")
        divide(self.num_kv_heads, tp_size, "num_key_value_heads")
        divide(self.intermediate_size, tp_size, "intermediate_size")
        if self.moe_layers:
            divide(self.moe_intermediate_size, tp_size, "moe_intermediate_size")


def family_of(get: Getter, source: str = "config") -> str:
    """The family from ``architectures`` (or ``model_type`` when that is absent)."""
    archs = get("architectures") or []
    if not isinstance(archs, list | tuple) or not all(isinstance(a, str) for a in archs):
        raise ValueError(f"{source}: 'architectures' must be a list of strings, got {archs!r}")
    for arch in archs:
        if arch in SUPPORTED_ARCHITECTURES:
            return SUPPORTED_ARCHITECTURES[arch]
    model_type = get("model_type")
    if not archs and isinstance(model_type, str) and model_type in _MODEL_TYPES:
        return _MODEL_TYPES[model_type]
    got = list(archs) or [model_type]
    raise ValueError(f"{source}: unsupported model architecture {got}; supported: "
                     f"{sorted(SUPPORTED_ARCHITECTURES)}")


def _check_types(values: Mapping[str, Any], source: str) -> None:
    """JSON gives any type anywhere: name the key instead of failing deep in model code."""
    for key in _POSITIVE_INTS:
        value = values.get(key)
        if not _is_int(value) or value < 1:
            raise ValueError(f"{source}: {key!r} must be a positive integer, got {value!r}")
    for key in _OPTIONAL_INTS:
        value = values.get(key)
        if value is not None and (not _is_int(value) or value < 1):
            raise ValueError(f"{source}: {key!r} must be a positive integer or null, got "
                             f"{value!r}")
    eps = values.get("rms_norm_eps")
    if not _is_number(eps) or eps <= 0:
        raise ValueError(f"{source}: 'rms_norm_eps' must be a positive number, got {eps!r}")
    for key in _BOOLS:
        if key in values and values[key] is not None and not isinstance(values[key], bool):
            raise ValueError(f"{source}: {key!r} must be true or false, got {values[key]!r}")


def _build(get: Getter, family: str, source: str) -> ModelSpec:
    extra = gemma3_fields(get, source) if family == "gemma3" else {}
    act = extra.get("hidden_act") or get("hidden_act") or "silu"
    if act != "silu" and family != "gemma3":
        raise ValueError(f"{source}: hidden_act {act!r} is not supported (only 'silu')")
    heads = get("num_attention_heads")
    kv_heads = get("num_key_value_heads") or heads
    if heads % kv_heads:
        raise ValueError(f"{source}: num_attention_heads ({heads}) must be a multiple of "
                         f"num_key_value_heads ({kv_heads})")
    attention_bias = bool(get("attention_bias"))
    dtype = get("dtype") or get("torch_dtype")
    moe = moe_fields(get, family, source) if family in MOE_FAMILIES else {}
    nope = {"nope_layers": nope_layers(get, source)} if family == "smollm3" else {}
    return ModelSpec(
        family=family,
        vocab_size=get("vocab_size"),
        hidden_size=get("hidden_size"),
        intermediate_size=get("intermediate_size"),
        num_layers=get("num_hidden_layers"),
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=get("head_dim") or get("hidden_size") // heads,
        max_position_embeddings=get("max_position_embeddings"),
        rms_norm_eps=float(get("rms_norm_eps")),
        rope=extra.pop("rope", None) or rope_spec(get, source, family,
                                                  get("hidden_size") // heads),
        qkv_bias=True if family == "qwen2" else attention_bias and family in _ATTN_BIAS,
        o_bias=attention_bias and family in _ATTN_BIAS,
        mlp_bias=bool(get("mlp_bias")) if family in ("llama", "smollm3") else False,
        qk_norm=extra.pop("qk_norm", family in ("qwen3", "qwen3_moe")),
        tie_word_embeddings=bool(get("tie_word_embeddings")),
        checkpoint_dtype=None if dtype is None else str(dtype).removeprefix("torch."),
        **moe,
        **nope,
        **(extra or window_fields(get, family, source)),
    )
