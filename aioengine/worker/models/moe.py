"""Mixture-of-experts feed-forward (Qwen3-MoE, Mixtral): softmax top-k routing, experts run
batched per expert (the tokens routed to one expert gathered, one GEMM pair per expert, added
back with ``index_add_``). Tensor parallel: every rank holds every expert, split along the
expert's intermediate size (column-parallel gate/up, row-parallel down: one all-reduce)."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from aioengine.worker.models.layers import silu_and_mul
from aioengine.worker.parallel.distributed import all_reduce
from aioengine.worker.parallel.state import TPInfo, divide
from aioengine.worker.parallel.weights import copy_cols, copy_rows

GATE, UP, DOWN = 0, 1, 2  # part = expert * 3 + one of these


class Router(nn.Module):
    """The replicated ``[num_experts, hidden]`` router weight."""

    def __init__(self, num_experts: int, hidden: int, dtype: torch.dtype,
                 device: torch.device | str) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_experts, hidden, dtype=dtype, device=device),
                                   requires_grad=False)

    def full_shape(self, part: int = 0, is_bias: bool = False) -> tuple[int, ...]:
        return tuple(self.weight.shape)

    def load(self, src: Any, part: int = 0, is_bias: bool = False) -> None:
        self.weight.data.copy_(src[:])


class SparseMoE(nn.Module):
    def __init__(self, hidden: int, intermediate: int, num_experts: int, top_k: int,
                 norm_topk_prob: bool, tp: TPInfo, dtype: torch.dtype,
                 device: torch.device | str) -> None:
        super().__init__()
        self.tp = tp
        self.hidden = hidden
        self.intermediate = intermediate
        self.num_experts = num_experts
        self.top_k = top_k
        self.norm_topk_prob = norm_topk_prob
        self.local = divide(intermediate, tp.size, "moe_intermediate_size")
        self.gate = Router(num_experts, hidden, dtype, device)
        # Per expert: [gate rows; up rows] of this rank, and the down columns of this rank.
        self.w13 = nn.Parameter(torch.empty(num_experts, 2 * self.local, hidden, dtype=dtype,
                                            device=device), requires_grad=False)
        self.w2 = nn.Parameter(torch.empty(num_experts, hidden, self.local, dtype=dtype,
                                           device=device), requires_grad=False)

    def full_shape(self, part: int, is_bias: bool = False) -> tuple[int, ...]:
        if part % 3 == DOWN:
            return (self.hidden, self.intermediate)
        return (self.intermediate, self.hidden)

    def load(self, src: Any, part: int, is_bias: bool = False) -> None:
        expert, which = divmod(part, 3)
        n, start = self.local, self.tp.rank * self.local
        if which == DOWN:
            copy_cols(self.w2.data[expert], src, start, n)
        else:
            copy_rows(self.w13.data[expert, which * n:(which + 1) * n], src, start, n)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        probs = torch.softmax(F.linear(h, self.gate.weight), dim=-1, dtype=torch.float32)
        weights, experts = torch.topk(probs, self.top_k, dim=-1)
        if self.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        weights = weights.to(h.dtype)
        flat = experts.flatten()
        order = flat.argsort(stable=True)  # (token, slot) pairs grouped by expert
        tokens = order // self.top_k
        scales = weights.flatten()[order].unsqueeze(1)
        counts = torch.bincount(flat, minlength=self.num_experts).tolist()
        out = torch.zeros_like(h)
        start = 0
        for expert, n in enumerate(counts):
            if n == 0:
                continue
            rows = tokens[start:start + n]
            x = silu_and_mul(F.linear(h.index_select(0, rows), self.w13[expert]))
            y = F.linear(x, self.w2[expert]) * scales[start:start + n]
            out.index_add_(0, rows, y)
            start += n
        return all_reduce(out, self.tp)
