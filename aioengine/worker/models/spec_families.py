"""Per-family config readers: mixture-of-experts settings, sliding-window layers, Gemma 3,
SmolLM3's NoPE layers."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aioengine.worker.models.rope_config import Getter, RopeSpec, _is_int, _is_number, rope_spec

MOE_FAMILIES = ("qwen3_moe", "mixtral")


def window_fields(get: Getter, family: str, source: str) -> dict[str, Any]:
    """The sliding window and its layers, as transformers reads them per family."""
    layers = get("num_hidden_layers")
    if family in ("qwen2", "qwen3", "qwen3_moe", "smollm3") and not get("use_sliding_window"):
        return {}
    window = get("sliding_window")
    if window is None or family == "llama":
        return {}
    if not _is_int(window) or window < 1:
        raise ValueError(f"{source}: 'sliding_window' must be a positive integer or null, got "
                         f"{window!r}")
    if family not in ("qwen2", "qwen3", "smollm3"):
        return {"sliding_window": window, "window_layers": tuple(range(layers))}
    types = get("layer_types")
    if types is None and family == "smollm3":  # as SmolLM3Config: the NoPE layers slide
        nope = nope_layers(get, source)
        types = ["sliding_attention" if i in nope else "full_attention" for i in range(layers)]
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




def nope_layers(get: Getter, source: str) -> tuple[int, ...]:
    """SmolLM3: the layers without rotary embeddings, from ``no_rope_layers`` (1 = rotary,
    per layer) or else every ``no_rope_layer_interval``-th layer, as SmolLM3Config."""
    layers, flags = get("num_hidden_layers"), get("no_rope_layers")
    if flags is None:
        step = get("no_rope_layer_interval")
        if not _is_int(step) or step < 1:
            raise ValueError(f"{source}: 'no_rope_layer_interval' must be a positive integer, "
                             f"got {step!r}")
        flags = [int((i + 1) % step != 0) for i in range(layers)]
    if (not isinstance(flags, list | tuple) or len(flags) != layers
            or not all(f in (0, 1) and not isinstance(f, float) for f in flags)):
        raise ValueError(f"{source}: 'no_rope_layers' must list {layers} flags (1: rotary, "
                         f"0: none), got {flags!r}")
    return tuple(i for i, f in enumerate(flags) if not f)


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




def gemma3_fields(get: Getter, source: str) -> dict[str, Any]:
    """Gemma 3 text: (1 + w) RMSNorms around attention and MLP, GELU (tanh) MLP, embeddings
    scaled by sqrt(hidden), query scale from query_pre_attn_scalar, local (sliding) layers on
    their own RoPE base, final logit soft-capping."""
    act = get("hidden_activation") or "gelu_pytorch_tanh"
    if act != "gelu_pytorch_tanh":
        raise ValueError(f"{source}: hidden_activation {act!r} is not supported for Gemma 3 "
                         "(only 'gelu_pytorch_tanh')")
    if get("attn_logit_softcapping") is not None:
        raise ValueError(f"{source}: attention logit soft-capping (attn_logit_softcapping="
                         f"{get('attn_logit_softcapping')!r}) is not supported")
    if get("use_bidirectional_attention"):
        raise ValueError(f"{source}: bidirectional attention (use_bidirectional_attention=true) "
                         "is not supported")
    softcap, scalar = get("final_logit_softcapping"), get("query_pre_attn_scalar")
    if softcap is not None and (not _is_number(softcap) or softcap <= 0):
        raise ValueError(f"{source}: 'final_logit_softcapping' must be a positive number or "
                         f"null, got {softcap!r}")
    if not _is_number(scalar) or scalar <= 0:
        raise ValueError(f"{source}: 'query_pre_attn_scalar' must be a positive number, got "
                         f"{scalar!r}")
    window, layers = get("sliding_window"), get("num_hidden_layers")
    if not _is_int(window) or window < 1:
        raise ValueError(f"{source}: 'sliding_window' must be a positive integer, got "
                         f"{window!r}")
    types = get("layer_types")
    if types is None:
        pattern = get("sliding_window_pattern")
        if not _is_int(pattern) or pattern < 1:
            raise ValueError(f"{source}: 'sliding_window_pattern' must be a positive integer, "
                             f"got {pattern!r}")
        types = ["sliding_attention" if (i + 1) % pattern else "full_attention"
                 for i in range(layers)]
    kinds = ("full_attention", "sliding_attention")
    if (not isinstance(types, list | tuple) or len(types) != layers
            or not all(t in kinds for t in types)):
        raise ValueError(f"{source}: 'layer_types' must list {layers} of {list(kinds)}, got "
                         f"{types!r}")
    params = get("rope_parameters") or get("rope_scaling") or {}
    if isinstance(params, Mapping) and set(params) & set(kinds):
        if set(params) != set(kinds):
            raise ValueError(f"{source}: 'rope_parameters' by layer type must give exactly "
                             f"{list(kinds)}, got {sorted(params)}")
        full, local = (rope_spec(_sub_getter(get, params[k]), source) for k in kinds)
    else:
        full = rope_spec(get, source)
        base = get("rope_local_base_freq")
        if not _is_number(base) or base <= 0:
            raise ValueError(f"{source}: 'rope_local_base_freq' must be a positive number, "
                             f"got {base!r}")
        local = RopeSpec(theta=float(base))
    return {"norm_offset": True, "sandwich_norms": True, "qk_norm": True,
            "hidden_act": act, "embed_scale": get("hidden_size") ** 0.5,
            "final_logit_softcapping": None if softcap is None else float(softcap),
            "attn_scale": float(scalar) ** -0.5, "rope": full, "local_rope": local,
            "sliding_window": window,
            "window_layers": tuple(i for i, t in enumerate(types) if t == "sliding_attention")}


def _sub_getter(get: Getter, params: Any) -> Getter:
    """Reads one layer type's RoPE dict as if it were the config's own rope_parameters."""
    def sub(key: str) -> Any:
        if key == "rope_parameters":
            return params
        return None if key in ("rope_scaling", "rope_theta") else get(key)
    return sub
