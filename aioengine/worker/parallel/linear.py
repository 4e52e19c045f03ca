"""Column- and row-parallel linears (Megatron style) with shard-aware weight loading.

Column-parallel splits the output features (no communication); row-parallel splits the input
features and sums the partial products with one all-reduce. An attention block or an MLP is one
column-parallel linear followed by one row-parallel linear: one all-reduce per block.

``quantize(policy)`` (before loading) makes a layer keep its weight quantized
(``aioengine.worker.quant``): column-parallel ranks take their rows' blocks unchanged,
row-parallel ranks cut every row at a block boundary.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from aioengine.worker import gemv
from aioengine.worker.parallel.distributed import all_reduce
from aioengine.worker.parallel.state import TPInfo, divide
from aioengine.worker.parallel.weights import copy_cols, copy_rows

if TYPE_CHECKING:
    from aioengine.worker.quant.weight import QuantizedWeight, QuantPolicy


def _quantized(module: nn.Module, out_features: int, in_features: int,
               policy: QuantPolicy) -> QuantizedWeight:
    from aioengine.worker.quant.weight import QuantizedWeight

    if module.weight.device.type != "cpu":
        raise ValueError(f"quantized weights run on CPU only, this layer is on "
                         f"{module.weight.device}")
    module.weight = None  # the float weight is never allocated for real: freed here
    return QuantizedWeight(out_features, in_features, policy)


def _param(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str) -> nn.Parameter:
    return nn.Parameter(torch.empty(shape, dtype=dtype, device=device), requires_grad=False)


class MergedColumnParallelLinear(nn.Module):
    """Several column-parallel linears fused into one GEMM (e.g. gate+up, or q+k+v).

    Each rank holds its slice of every part, parts laid out one after another, so the output
    splits back into parts with the per-rank sizes in ``local_sizes``.
    """

    def __init__(self, in_features: int, output_sizes: list[int], bias: bool, tp: TPInfo,
                 dtype: torch.dtype, device: torch.device | str,
                 what: list[str] | None = None) -> None:
        super().__init__()
        self.tp = tp
        self.in_features = in_features
        self.output_sizes = list(output_sizes)
        names = what or [f"output part {i}" for i in range(len(output_sizes))]
        self.local_sizes = [divide(s, tp.size, n) for s, n in zip(output_sizes, names, strict=True)]
        self.offsets = [sum(self.local_sizes[:i]) for i in range(len(self.local_sizes))]
        local_out = sum(self.local_sizes)
        self.weight = _param((local_out, in_features), dtype, device)
        self.bias = _param((local_out,), dtype, device) if bias else None
        self.qweight: QuantizedWeight | None = None

    def quantize(self, policy: QuantPolicy) -> None:
        """Keep the weight quantized under ``policy`` (call before loading)."""
        self.qweight = _quantized(self, sum(self.local_sizes), self.in_features, policy)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.qweight is not None:
            out = self.qweight(x).to(x.dtype)
            return out if self.bias is None else out + self.bias
        return gemv.linear(x, self.weight, self.bias)

    def full_shape(self, part: int, is_bias: bool) -> tuple[int, ...]:
        """The unsharded checkpoint shape of one part."""
        size = self.output_sizes[part]
        return (size,) if is_bias else (size, self.in_features)

    def load(self, src: Any, part: int, is_bias: bool = False) -> None:
        n = self.local_sizes[part]
        if self.qweight is not None and not is_bias:
            from aioengine.worker.quant.weight import source_rows

            qtype, rows = source_rows(src, self.tp.rank * n, n, self.qweight.policy)
            self.qweight.set_rows(self.offsets[part], qtype, rows)
            return
        dst = self.bias if is_bias else self.weight
        assert dst is not None
        copy_rows(dst.data[self.offsets[part]:self.offsets[part] + n], src, self.tp.rank * n, n)


class ColumnParallelLinear(MergedColumnParallelLinear):
    """``y = x W^T + b`` with W's rows (output features) split across ranks."""

    def __init__(self, in_features: int, out_features: int, bias: bool, tp: TPInfo,
                 dtype: torch.dtype, device: torch.device | str, what: str = "output size"):
        super().__init__(in_features, [out_features], bias, tp, dtype, device, [what])


class QKVParallelLinear(MergedColumnParallelLinear):
    """q, k and v projections as one GEMM; each rank gets whole heads of each."""

    PARTS = {"q": 0, "k": 1, "v": 2}

    def __init__(self, hidden_size: int, head_dim: int, num_heads: int, num_kv_heads: int,
                 bias: bool, tp: TPInfo, dtype: torch.dtype, device: torch.device | str):
        self.num_heads = divide(num_heads, tp.size, "num_attention_heads")
        self.num_kv_heads = divide(num_kv_heads, tp.size, "num_key_value_heads")
        super().__init__(hidden_size,
                         [num_heads * head_dim, num_kv_heads * head_dim,
                          num_kv_heads * head_dim],
                         bias, tp, dtype, device, ["q size", "k size", "v size"])


class RowParallelLinear(nn.Module):
    """``y = x W^T + b`` with W's columns (input features) split; partial sums all-reduced."""

    def __init__(self, in_features: int, out_features: int, bias: bool, tp: TPInfo,
                 dtype: torch.dtype, device: torch.device | str, what: str = "input size"):
        super().__init__()
        self.tp = tp
        self.in_features = in_features
        self.out_features = out_features
        self.local_in = divide(in_features, tp.size, what)
        self.weight = _param((out_features, self.local_in), dtype, device)
        self.bias = _param((out_features,), dtype, device) if bias else None
        self.qweight: QuantizedWeight | None = None

    def quantize(self, policy: QuantPolicy) -> None:
        """Keep the weight quantized under ``policy`` (call before loading)."""
        self.qweight = _quantized(self, self.out_features, self.local_in, policy)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        partial = (gemv.linear(x, self.weight) if self.qweight is None
                   else self.qweight(x).to(x.dtype))
        out = all_reduce(partial, self.tp)
        if self.bias is not None:  # added once, after the sum
            out = out + self.bias
        return out

    def full_shape(self, part: int, is_bias: bool) -> tuple[int, ...]:
        return (self.out_features,) if is_bias else (self.out_features, self.in_features)

    def load(self, src: Any, part: int = 0, is_bias: bool = False) -> None:
        if is_bias:
            assert self.bias is not None
            self.bias.data.copy_(src[:])
            return
        if self.qweight is not None:
            from aioengine.worker.quant.weight import source_cols

            qtype, rows = source_cols(src, self.tp.rank * self.local_in, self.local_in,
                                      self.qweight.policy)
            self.qweight.set_rows(0, qtype, rows)
            return
        copy_cols(self.weight.data, src, self.tp.rank * self.local_in, self.local_in)
