"""Rotary position embeddings (Hugging Face "rotate_half" layout) with llama3 and linear
scaling. cos/sin for every position are computed once at build time, in float32 like
transformers does, then cast to the model dtype."""

from __future__ import annotations

import math

import torch
from torch import nn

from aioengine.worker.models.spec import RopeSpec


def inverse_frequencies(rope: RopeSpec, head_dim: int) -> torch.Tensor:
    inv = 1.0 / (rope.theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float()
                                / head_dim))
    if rope.rope_type == "linear":
        return inv / rope.factor
    if rope.rope_type == "llama3":
        low_wavelen = rope.original_max_position / rope.low_freq_factor
        high_wavelen = rope.original_max_position / rope.high_freq_factor
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > low_wavelen, inv / rope.factor, inv)
        smooth = ((rope.original_max_position / wavelen - rope.low_freq_factor)
                  / (rope.high_freq_factor - rope.low_freq_factor))
        smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
        medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
        return torch.where(medium, smoothed, scaled)
    return inv


class RotaryEmbedding(nn.Module):
    def __init__(self, rope: RopeSpec, head_dim: int, max_positions: int, dtype: torch.dtype,
                 device: torch.device | str) -> None:
        super().__init__()
        inv = inverse_frequencies(rope, head_dim)
        freqs = torch.outer(torch.arange(max_positions, dtype=torch.float32), inv)
        # [max_pos, D/2] each; a buffer, not a parameter: never in a checkpoint.
        self.register_buffer("cos_cache", freqs.cos().to(dtype=dtype, device=device),
                             persistent=False)
        self.register_buffer("sin_cache", freqs.sin().to(dtype=dtype, device=device),
                             persistent=False)
        self.max_positions = max_positions

    def cos_sin(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``[T, 1, D/2]`` each, broadcasting over heads. Looked up once per step."""
        return (self.cos_cache.index_select(0, positions).unsqueeze(1),
                self.sin_cache.index_select(0, positions).unsqueeze(1))


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``x`` ``[T, H, D]``: ``x * cos + rotate_half(x) * sin`` with half-size cos/sin."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
