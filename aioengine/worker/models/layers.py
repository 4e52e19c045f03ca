"""Small replicated layers: RMSNorm (optionally fused with the residual add), SwiGLU and
GeGLU (tanh GELU, Gemma)."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    """``weight * x / rms(x)``, computed in float32 and cast back (as transformers does)."""

    def __init__(self, size: int, eps: float, dtype: torch.dtype,
                 device: torch.device | str, offset: bool = False) -> None:
        super().__init__()
        self.eps = eps
        self.offset = offset  # Gemma: ``(1 + weight) * x / rms(x)``, all in float32
        self.shape = (size,)
        self.weight = nn.Parameter(torch.ones(size, dtype=dtype, device=device),
                                   requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.offset:
            normed = F.rms_norm(x.float(), self.shape, None, self.eps)
            return (normed * (1.0 + self.weight.float())).to(x.dtype)
        if x.dtype == torch.float32:  # one fused kernel; bit-identical to the formula
            return F.rms_norm(x, self.shape, self.weight, self.eps)
        return self.weight * F.rms_norm(x.float(), self.shape, None, self.eps).to(x.dtype)

    def add_forward(self, x: torch.Tensor,
                    residual: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """``residual += x`` then normalise: returns (normed, new residual)."""
        if residual is not None:
            x = x + residual
        return self.forward(x), x

    def full_shape(self, part: int = 0, is_bias: bool = False) -> tuple[int, ...]:
        return tuple(self.weight.shape)

    def load(self, src: Any, part: int = 0, is_bias: bool = False) -> None:
        self.weight.data.copy_(src[:])


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up


def gelu_tanh_and_mul(x: torch.Tensor) -> torch.Tensor:
    gate, up = x.chunk(2, dim=-1)
    return F.gelu(gate, approximate="tanh") * up
