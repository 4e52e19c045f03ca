"""Make a freshly built model keep its linear weights quantized (before its weights load)."""

from __future__ import annotations

import logging

from aioengine.worker.models import CausalLM
from aioengine.worker.parallel import MergedColumnParallelLinear, RowParallelLinear
from aioengine.worker.quant.weight import QuantPolicy

logger = logging.getLogger(__name__)


def quantize_model(model: CausalLM, mode: str, activations: str = "int16", *, x8: bool = True,
                   x8_prefill: bool = True) -> QuantPolicy:
    """Every column- and row-parallel linear (fused q/k/v, o, fused gate/up, down) and the LM
    head keep their weights quantized under ``mode`` (``QuantPolicy``); a tied embedding keeps
    its float table for lookups beside the head's quantized copy. Mixture-of-experts weights
    (stacked expert tensors) stay float. ValueError for an unknown mode or a model not on
    CPU. ``x8``, ``x8_prefill``: the policy's layout switches (``CpuKernelConfig``)."""
    policy = QuantPolicy(mode, activations, x8=x8, x8_prefill=x8_prefill)
    linears = [m for m in model.modules()
               if isinstance(m, (MergedColumnParallelLinear, RowParallelLinear))]
    for linear in linears:
        linear.quantize(policy)
    if model.lm_head is not None:
        model.lm_head.quantize_head(policy, keep_float=False)
    else:
        model.embed_tokens.quantize_head(policy, keep_float=True)
    logger.info("%d linear weights and the LM head kept quantized: %s (%s activations)",
                len(linears), mode, activations)
    return policy
