"""Vocab-parallel embedding and LM head: each rank holds a contiguous range of vocab rows."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from aioengine.worker import gemv
from aioengine.worker.parallel.distributed import all_gather, all_reduce
from aioengine.worker.parallel.state import TPInfo
from aioengine.worker.parallel.weights import copy_rows


class VocabParallelEmbedding(nn.Module):
    """Rows ``[rank*per_rank, (rank+1)*per_rank)`` of the table, padded with zero rows when the
    vocab does not split evenly. Tokens outside the range look up zeros; an all-reduce sums."""

    def __init__(self, vocab_size: int, hidden_size: int, tp: TPInfo, dtype: torch.dtype,
                 device: torch.device | str) -> None:
        super().__init__()
        self.tp = tp
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.per_rank = -(-vocab_size // tp.size)
        self.start = tp.rank * self.per_rank
        self.end = min(self.start + self.per_rank, vocab_size)
        self.weight = nn.Parameter(
            torch.zeros((self.per_rank, hidden_size), dtype=dtype, device=device),
            requires_grad=False)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.tp.size == 1:
            return F.embedding(input_ids, self.weight)
        outside = (input_ids < self.start) | (input_ids >= self.end)
        local = torch.where(outside, 0, input_ids - self.start)
        out = F.embedding(local, self.weight)
        out.masked_fill_(outside.unsqueeze(-1), 0)
        return all_reduce(out, self.tp)

    def full_shape(self, part: int = 0, is_bias: bool = False) -> tuple[int, ...]:
        return (self.vocab_size, self.hidden_size)

    def load(self, src: Any, part: int = 0, is_bias: bool = False) -> None:
        copy_rows(self.weight.data, src, self.start, self.end - self.start)


class ParallelLMHead(VocabParallelEmbedding):
    """The output projection; shares its layout with the embedding so the two can be tied."""

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Full-vocab float32 logits ``[N, vocab]`` on every rank."""
        return lm_logits(hidden, self.weight, self.tp, self.vocab_size)


def lm_logits(hidden: torch.Tensor, weight: torch.Tensor, tp: TPInfo,
              vocab_size: int) -> torch.Tensor:
    logits = gemv.linear(hidden, weight)
    if tp.size > 1:
        logits = all_gather(logits, tp, dim=-1)
    if logits.shape[-1] != vocab_size:
        logits = logits[..., :vocab_size]
    return logits.float()
