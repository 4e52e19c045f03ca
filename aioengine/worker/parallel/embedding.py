"""Vocab-parallel embedding and LM head: each rank holds a contiguous range of vocab rows."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn

from aioengine.worker import gemv
from aioengine.worker.parallel.distributed import all_gather, all_reduce
from aioengine.worker.parallel.state import TPInfo
from aioengine.worker.parallel.weights import copy_rows

if TYPE_CHECKING:
    from aioengine.worker.quant.weight import QuantizedWeight, QuantPolicy


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
        # Only the padding rows are zeroed: the load writes the others, and a quantized head
        # drops this table before it (torch.zeros wrote a whole vocabulary-sized table on every
        # start-up, a visible share of it; docs/benchmarks.md).
        weight = torch.empty((self.per_rank, hidden_size), dtype=dtype, device=device)
        weight[max(0, self.end - self.start):].zero_()
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.qhead: QuantizedWeight | None = None

    def quantize_head(self, policy: QuantPolicy, keep_float: bool) -> None:
        """Compute logits from a quantized copy of this table (call before loading);
        ``keep_float``: keep the float table too (an embedding tied to the head looks rows up
        in it), else free it."""
        from aioengine.worker.quant.weight import QuantizedWeight

        if self.weight.device.type != "cpu":
            raise ValueError(f"quantized weights run on CPU only, the LM head is on "
                             f"{self.weight.device}")
        self.qhead = QuantizedWeight(self.per_rank, self.hidden_size, policy)
        if not keep_float:
            self.weight = None

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.tp.size == 1:
            return self._lookup(input_ids)
        outside = (input_ids < self.start) | (input_ids >= self.end)
        local = torch.where(outside, 0, input_ids - self.start)
        out = self._lookup(local)
        out.masked_fill_(outside.unsqueeze(-1), 0)
        return all_reduce(out, self.tp)

    def _lookup(self, ids: torch.Tensor) -> torch.Tensor:
        if self.weight is not None:
            return F.embedding(ids, self.weight)
        assert self.qhead is not None
        return _quantized_rows(self.qhead, ids)

    def full_shape(self, part: int = 0, is_bias: bool = False) -> tuple[int, ...]:
        return (self.vocab_size, self.hidden_size)

    def load(self, src: Any, part: int = 0, is_bias: bool = False) -> None:
        n = self.end - self.start
        if self.qhead is not None:
            from aioengine.worker.quant.weight import source_rows

            qtype, rows = source_rows(src, self.start, n, self.qhead.policy)
            self.qhead.set_rows(0, qtype, rows)
            if n < self.per_rank:  # the last rank's padding rows give logits of 0
                self.qhead.set_rows(n, None, torch.zeros(self.per_rank - n, self.hidden_size))
            stored = getattr(getattr(src, "qtype", None), "name", None)
            if qtype is not None and hasattr(src, "raw_rows") and isinstance(stored, str) \
                    and stored.lower() == qtype.name.lower():
                # The file's own blocks (a GGUF table kept quantized): lookups dequantize the
                # rows they need from them, the same values a float copy would hold; no float
                # table (SmolLM2's tied 49152 x 576 table: 113 MB).
                self.weight = None
            elif qtype is None and n == self.per_rank and self.weight is not None \
                    and self.weight.dtype == torch.float32:
                # Float rows in the head (an F32/F16 file): the tied table is the same matrix;
                # share it instead of holding a second float copy (SmolLM2: 108 MB).
                self.weight.data = self.qhead.segments[0].data
                return
        if self.weight is not None:
            copy_rows(self.weight.data, src, self.start, n)


def _quantized_rows(qhead: QuantizedWeight, ids: torch.Tensor) -> torch.Tensor:
    """Rows ``ids`` of a quantized table as float32 ``[*ids.shape, K]``: only those rows'
    blocks are dequantized (for a head in the x8 layout, the 8-row groups holding them)."""
    flat = ids.reshape(-1)
    k = qhead.in_features
    segments = qhead.segments
    if len(segments) == 1 and segments[0].qtype is not None:  # the common case: one pass
        seg = segments[0]
        local = flat if seg.offset == 0 else flat - seg.offset
        return _segment_rows(qhead, seg, local).view(*ids.shape, k)
    out = torch.empty(flat.shape[0], k)
    for seg in segments:
        rows = ((flat >= seg.offset) & (flat < seg.offset + seg.n)).nonzero().squeeze(1)
        local = flat.index_select(0, rows) - seg.offset
        data = _segment_rows(qhead, seg, local) if seg.qtype is not None \
            else seg.data.index_select(0, local)
        out.index_copy_(0, rows, data)
    return out.view(*ids.shape, k)


def _segment_rows(qhead: QuantizedWeight, seg: Any, local: torch.Tensor) -> torch.Tensor:
    """Float32 rows ``local`` of one quantized segment, in either of its layouts."""
    k, kernel = qhead.in_features, qhead.kernel
    if not seg.x8:
        return kernel.dequantize(seg.qtype, seg.data.index_select(0, local), k)
    # x8: each id's lane of its 8-row group, in one call (the gather of groups, their
    # dequantization and the gather of lanes in torch were several ops and temporaries a
    # decode step; docs/benchmarks.md)
    return kernel.rows_x8(seg.qtype, seg.data, seg.n, k, local.contiguous())


class ParallelLMHead(VocabParallelEmbedding):
    """The output projection; shares its layout with the embedding so the two can be tied."""

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Full-vocab float32 logits ``[N, vocab]`` on every rank."""
        return lm_logits(hidden, self.weight, self.tp, self.vocab_size, self.qhead)


def lm_logits(hidden: torch.Tensor, weight: torch.Tensor | None, tp: TPInfo, vocab_size: int,
              qhead: QuantizedWeight | None = None) -> torch.Tensor:
    if qhead is not None:
        logits = qhead(hidden)
    else:
        assert weight is not None
        logits = gemv.linear(hidden, weight)
    if tp.size > 1:
        logits = all_gather(logits, tp, dim=-1)
    if logits.shape[-1] != vocab_size:
        logits = logits[..., :vocab_size]
    return logits.float()
