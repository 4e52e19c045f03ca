"""Make a freshly built model keep its linear weights quantized (before its weights load)."""

from __future__ import annotations

import logging

from aioengine.worker.models import CausalLM
from aioengine.worker.quant.weight import QuantPolicy

logger = logging.getLogger(__name__)


def quantize_model(model: CausalLM, mode: str, activations: str = "int16") -> QuantPolicy:
    """Every decoder linear (fused q/k/v, o, fused gate/up, down) and the LM head keep their
    weights quantized under ``mode`` (``QuantPolicy``); a tied embedding keeps its float table
    for lookups beside the head's quantized copy. ValueError for an unknown mode or a model not
    on CPU."""
    policy = QuantPolicy(mode, activations)
    for layer in model.layers:
        for linear in (layer.self_attn.qkv_proj, layer.self_attn.o_proj,
                       layer.mlp.gate_up_proj, layer.mlp.down_proj):
            linear.quantize(policy)
    if model.lm_head is not None:
        model.lm_head.quantize_head(policy, keep_float=False)
    else:
        model.embed_tokens.quantize_head(policy, keep_float=True)
    logger.info("linear weights kept quantized: %s (%s activations)", mode, activations)
    return policy
