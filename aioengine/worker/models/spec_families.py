"""Per-family config readers: mixture-of-experts settings and sliding-window layers."""

from __future__ import annotations

from typing import Any

from aioengine.worker.models.rope_config import Getter, _is_int

MOE_FAMILIES = ("qwen3_moe", "mixtral")


def window_fields(get: Getter, family: str, source: str) -> dict[str, Any]:
    """The sliding window and its layers, as transformers reads them per family."""
    layers = get("num_hidden_layers")
    if family in ("qwen2", "qwen3", "qwen3_moe") and not get("use_sliding_window"):
        return {}
    window = get("sliding_window")
    if window is None or family == "llama":
        return {}
    if not _is_int(window) or window < 1:
        raise ValueError(f"{source}: 'sliding_window' must be a positive integer or null, got "
                         f"{window!r}")
    if family not in ("qwen2", "qwen3"):
        return {"sliding_window": window, "window_layers": tuple(range(layers))}
    types = get("layer_types")
    if types is None:
        first = get("max_window_layers")
        if not _is_int(first) or first < 0:
            raise ValueError(f"{source}: 'max_window_layers' must be a non-negative integer, "
                             f"got {first!r}")
        return {"sliding_window": window, "window_layers": tuple(range(first, layers))}
    kinds = ("full_attention", "sliding_attention")
    if (not isinstance(types, list | tuple) or len(types) != layers
            or not all(t in kinds for t in types)):
        raise ValueError(f"{source}: 'layer_types' must list {layers} of {list(kinds)}, got "
                         f"{types!r}")
    return {"sliding_window": window,
            "window_layers": tuple(i for i, t in enumerate(types) if t == "sliding_attention")}




def moe_fields(get: Getter, family: str, source: str) -> dict[str, Any]:
    """The expert settings and which layers are sparse (as transformers decides it)."""
    experts = get("num_experts")
    experts = get("num_local_experts") if experts is None else experts
    top_k = get("num_experts_per_tok")
    layers = get("num_hidden_layers")
    for key, value in (("num_experts", experts), ("num_experts_per_tok", top_k)):
        if not _is_int(value) or value < 1:
            raise ValueError(f"{source}: {key!r} must be a positive integer, got {value!r}")
    if top_k > experts:
        raise ValueError(f"{source}: num_experts_per_tok ({top_k}) exceeds num_experts "
                         f"({experts})")
    if family == "mixtral":  # every layer sparse, experts as wide as the dense MLP
        return {"num_experts": experts, "num_experts_per_tok": top_k,
                "moe_intermediate_size": get("intermediate_size"), "norm_topk_prob": True,
                "moe_layers": tuple(range(layers))}
    size, step = get("moe_intermediate_size"), get("decoder_sparse_step")
    dense = get("mlp_only_layers") or []
    if not _is_int(size) or size < 1:
        raise ValueError(f"{source}: 'moe_intermediate_size' must be a positive integer, got "
                         f"{size!r}")
    if not _is_int(step) or step < 1:
        raise ValueError(f"{source}: 'decoder_sparse_step' must be a positive integer, got "
                         f"{step!r}")
    if not isinstance(dense, list | tuple) or not all(_is_int(i) for i in dense):
        raise ValueError(f"{source}: 'mlp_only_layers' must be a list of layer indices, got "
                         f"{dense!r}")
    return {"num_experts": experts, "num_experts_per_tok": top_k, "moe_intermediate_size": size,
            "norm_topk_prob": bool(get("norm_topk_prob")),
            "moe_layers": tuple(i for i in range(layers)
                                if i not in dense and (i + 1) % step == 0)}


