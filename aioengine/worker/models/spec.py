"""The facts of a decoder-only model our one decoder implementation needs, read from a Hugging
Face config, with the small per-family differences made explicit."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from aioengine.worker.parallel.state import divide

# HF ``architectures`` entry -> family. The families differ only in flags below.
SUPPORTED_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
}
_MODEL_TYPES = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}


@dataclass(frozen=True)
class RopeSpec:
    theta: float
    rope_type: str = "default"  # default | linear | llama3
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position: int = 8192


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
    o_bias: bool  # Llama ``attention_bias`` covers o_proj too
    mlp_bias: bool
    qk_norm: bool  # Qwen3: RMSNorm over head_dim on q and k before RoPE
    tie_word_embeddings: bool

    @classmethod
    def from_hf(cls, cfg: Any) -> ModelSpec:
        family = family_of(cfg)
        act = getattr(cfg, "hidden_act", "silu")
        if act != "silu":
            raise ValueError(f"hidden_act {act!r} is not supported (only 'silu')")
        if getattr(cfg, "use_sliding_window", False):
            raise ValueError("sliding-window attention (use_sliding_window=true) is not "
                             "supported")
        heads = cfg.num_attention_heads
        kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
        if heads % kv_heads:
            raise ValueError(f"num_attention_heads ({heads}) must be a multiple of "
                             f"num_key_value_heads ({kv_heads})")
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
        attention_bias = bool(getattr(cfg, "attention_bias", False))
        return cls(
            family=family,
            vocab_size=cfg.vocab_size,
            hidden_size=cfg.hidden_size,
            intermediate_size=cfg.intermediate_size,
            num_layers=cfg.num_hidden_layers,
            num_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            max_position_embeddings=cfg.max_position_embeddings,
            rms_norm_eps=cfg.rms_norm_eps,
            rope=rope_spec(cfg),
            qkv_bias=True if family == "qwen2" else attention_bias,
            o_bias=attention_bias if family == "llama" else False,
            mlp_bias=bool(getattr(cfg, "mlp_bias", False)),
            qk_norm=family == "qwen3",
            tie_word_embeddings=bool(getattr(cfg, "tie_word_embeddings", False)),
        )

    def kv_heads_per_rank(self, tp_size: int) -> int:
        return divide(self.num_kv_heads, tp_size, "num_key_value_heads")

    def check_tp(self, tp_size: int) -> None:
        divide(self.num_heads, tp_size, "num_attention_heads")
        divide(self.num_kv_heads, tp_size, "num_key_value_heads")
        divide(self.intermediate_size, tp_size, "intermediate_size")


def family_of(cfg: Any) -> str:
    archs = list(getattr(cfg, "architectures", None) or [])
    for arch in archs:
        if arch in SUPPORTED_ARCHITECTURES:
            return SUPPORTED_ARCHITECTURES[arch]
    if not archs and getattr(cfg, "model_type", None) in _MODEL_TYPES:
        return _MODEL_TYPES[cfg.model_type]
    got = archs or [getattr(cfg, "model_type", None)]
    raise ValueError(f"unsupported model architecture {got}; supported: "
                     f"{sorted(SUPPORTED_ARCHITECTURES)}")


def rope_spec(cfg: Any) -> RopeSpec:
    """RoPE settings from ``rope_parameters`` (transformers 5) or ``rope_scaling`` +
    ``rope_theta`` (older configs)."""
    params = dict(getattr(cfg, "rope_parameters", None) or {})
    legacy = getattr(cfg, "rope_scaling", None)
    if not params and legacy:
        params = dict(legacy)
    theta = params.get("rope_theta", getattr(cfg, "rope_theta", 10000.0))
    rope_type = params.get("rope_type", params.get("type", "default")) or "default"
    if rope_type == "default":
        return RopeSpec(theta=float(theta))
    if rope_type == "linear":
        return RopeSpec(theta=float(theta), rope_type="linear", factor=float(params["factor"]))
    if rope_type == "llama3":
        return RopeSpec(
            theta=float(theta), rope_type="llama3", factor=float(params["factor"]),
            low_freq_factor=float(params["low_freq_factor"]),
            high_freq_factor=float(params["high_freq_factor"]),
            original_max_position=int(params["original_max_position_embeddings"]))
    raise ValueError(f"rope type {rope_type!r} is not supported; supported: "
                     "['default', 'linear', 'llama3']")
