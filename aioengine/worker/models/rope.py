"""Rotary position embeddings (Hugging Face "rotate_half" layout) with llama3, linear and
Phi-3 longrope scaling and partial rotary dims. cos/sin for every position are computed once
at build time, in float32 like transformers does, then cast to the model dtype."""

from __future__ import annotations

import math

import torch
from torch import nn

from aioengine.worker.attention import AttentionMetadata
from aioengine.worker.models.rope_config import RopeSpec


def inverse_frequencies(rope: RopeSpec, head_dim: int, long: bool = False) -> torch.Tensor:
    dim = rope.rotary_dim(head_dim)
    exponents = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim
    if rope.rope_type == "longrope":
        ext = torch.tensor(rope.long_factor if long else rope.short_factor,
                           dtype=torch.float32)
        return 1.0 / (ext * rope.theta ** exponents)
    inv = 1.0 / (rope.theta ** exponents)
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
        self.longrope = rope.rope_type == "longrope"
        self.original_max_position = rope.original_max_position
        positions = torch.arange(max_positions, dtype=torch.float32)
        # longrope: the short-factor table, then the long-factor one (rows max_pos + p).
        tables = [torch.outer(positions, inverse_frequencies(rope, head_dim, long))
                  for long in ((False, True) if self.longrope else (False,))]
        freqs = torch.cat(tables)
        scale = rope.attention_factor
        # [max_pos, R/2] each; a buffer, not a parameter: never in a checkpoint.
        self.register_buffer("cos_cache", (freqs.cos() * scale).to(dtype=dtype, device=device),
                             persistent=False)
        self.register_buffer("sin_cache", (freqs.sin() * scale).to(dtype=dtype, device=device),
                             persistent=False)
        self.max_positions = max_positions

    def cos_sin(self, positions: torch.Tensor, meta: AttentionMetadata | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """``[T, 1, R/2]`` each, broadcasting over heads. Looked up once per step.

        longrope (as transformers, which switches on the longest position of a forward): a
        chunk reaching past the original context uses the long factors for all its tokens."""
        if self.longrope and meta is not None:
            ends = meta.context_lens.repeat_interleave(meta.query_start_loc.diff(),
                                                       output_size=positions.shape[0])
            positions = positions + (ends > self.original_max_position) * self.max_positions
        return (self.cos_cache.index_select(0, positions).unsqueeze(1),
                self.sin_cache.index_select(0, positions).unsqueeze(1))


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``x`` ``[T, H, D]``: ``x * cos + rotate_half(x) * sin`` with half-size cos/sin over the
    first ``2 * cos.shape[-1]`` dims of each head (partial rotary: the rest pass through)."""
    rot = 2 * cos.shape[-1]
    if rot < x.shape[-1]:
        return torch.cat((apply_rope(x[..., :rot], cos, sin), x[..., rot:]), dim=-1)
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
