"""RoPE settings read from a Hugging Face config (``RopeSpec``), as transformers standardises
them; shared helpers for reading JSON values."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

Getter = Callable[[str], Any]  # config key -> value, None when absent
DEFAULT_ROPE_THETA = 10000.0  # transformers' ``default_theta``
ROPE_TYPES = ("default", "linear", "llama3", "longrope")


@dataclass(frozen=True)
class RopeSpec:
    theta: float
    rope_type: str = "default"  # default | linear | llama3
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position: int = 8192
    # Phi-3 "longrope" ("su"): per-frequency divisors below / above the original context,
    # cos and sin scaled by ``attention_factor``.
    short_factor: tuple[float, ...] = ()
    long_factor: tuple[float, ...] = ()
    attention_factor: float = 1.0
    partial_rotary_factor: float = 1.0  # rotate only this leading fraction of each head

    def rotary_dim(self, head_dim: int) -> int:
        return int(head_dim * self.partial_rotary_factor)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def rope_spec(get: Getter, source: str = "config", family: str = "llama",
              default_head_dim: int = 0) -> RopeSpec:
    """RoPE settings as transformers standardises them: ``rope_scaling`` (older configs) or
    ``rope_parameters`` (transformers 5), with ``rope_theta`` inside or at the top level."""
    given = get("rope_scaling") or get("rope_parameters") or {}
    if not isinstance(given, Mapping):
        raise ValueError(f"{source}: 'rope_parameters' must be an object, got {given!r}")
    params = dict(given)
    theta = params.get("rope_theta", get("rope_theta"))
    theta = DEFAULT_ROPE_THETA if theta is None else theta
    partial = params.get("partial_rotary_factor", get("partial_rotary_factor"))
    if partial not in (None, 1, 1.0) and (family != "phi3" or not _is_number(partial)
                                          or not 0 < partial <= 1):
        raise ValueError(f"{source}: partial rotary embeddings (partial_rotary_factor="
                         f"{partial!r}) are not supported")
    partial = 1.0 if partial is None else float(partial)
    rope_type = params.get("rope_type", params.get("type")) or "default"
    if family == "phi3" and rope_type == "su":  # transformers' Phi-3 reads "su" as longrope
        rope_type = "longrope"
    if rope_type == "longrope" and family != "phi3":
        raise ValueError(f"{source}: rope type 'longrope' is supported for Phi-3 only")
    if rope_type not in ROPE_TYPES:
        raise ValueError(f"{source}: rope type {rope_type!r} is not supported; supported: "
                         f"{list(ROPE_TYPES)}")

    def number(key: str) -> float:
        value = params.get(key)
        if not _is_number(value) or value <= 0:
            missing = "missing" if value is None else f"{value!r}"
            raise ValueError(f"{source}: {rope_type} RoPE needs a positive {key!r}, got "
                             f"{missing}")
        return float(value)

    if not _is_number(theta) or theta <= 0:
        raise ValueError(f"{source}: 'rope_theta' must be a positive number, got {theta!r}")
    if rope_type == "default":
        return RopeSpec(theta=float(theta), partial_rotary_factor=partial)
    if rope_type == "linear":
        return RopeSpec(theta=float(theta), rope_type="linear", factor=number("factor"))
    # As transformers: a top-level original_max_position_embeddings wins, then the dict's,
    # then max_position_embeddings.
    if get("original_max_position_embeddings") is not None:
        params["original_max_position_embeddings"] = get("original_max_position_embeddings")
    params.setdefault("original_max_position_embeddings", get("max_position_embeddings"))
    if rope_type == "longrope":
        return _longrope(params, get, float(theta), partial,
                         get("head_dim") or default_head_dim, source)
    return RopeSpec(
        theta=float(theta), rope_type="llama3", factor=number("factor"),
        low_freq_factor=number("low_freq_factor"), high_freq_factor=number("high_freq_factor"),
        original_max_position=int(number("original_max_position_embeddings")))


def _longrope(params: Mapping[str, Any], get: Getter, theta: float, partial: float,
              head_dim: int, source: str) -> RopeSpec:
    """As transformers' ``_compute_longrope_parameters``."""
    original = params["original_max_position_embeddings"]
    if not _is_int(original) or original < 1:
        raise ValueError(f"{source}: 'original_max_position_embeddings' must be a positive "
                         f"integer, got {original!r}")
    half = int(head_dim * partial) // 2
    factors = {}
    for key in ("short_factor", "long_factor"):
        value = params.get(key)
        if (not isinstance(value, list | tuple) or len(value) != half
                or not all(_is_number(x) and x > 0 for x in value)):
            raise ValueError(f"{source}: longrope RoPE needs {key!r} as {half} positive numbers "
                             f"(rotary dims / 2), got {value!r}")
        factors[key] = tuple(float(x) for x in value)
    factor = params.get("factor")
    if factor is None:
        factor = get("max_position_embeddings") / original
    attention = params.get("attention_factor")
    if attention is None:
        attention = (1.0 if factor <= 1.0
                     else math.sqrt(1 + math.log(factor) / math.log(original)))
    return RopeSpec(theta=theta, rope_type="longrope", factor=float(factor),
                    original_max_position=original, attention_factor=float(attention),
                    partial_rotary_factor=partial, **factors)
