"""Decoder-only models (Llama 2/3, Qwen2, Qwen3) over a paged KV cache.

``build_model(hf_config, dtype=..., device=...)`` gives a ``CausalLM`` with uninitialised
weights; ``aioengine.worker.loader.load_model`` builds and fills one from a directory.
"""

from __future__ import annotations

from typing import Any

import torch

from aioengine.worker.models.decoder import CausalLM, WeightTarget
from aioengine.worker.models.spec import SUPPORTED_ARCHITECTURES, ModelSpec
from aioengine.worker.parallel.state import TPInfo


def build_model(hf_config: Any, *, dtype: torch.dtype, device: torch.device | str,
                tp_rank: int = 0, tp_size: int = 1) -> CausalLM:
    """A ``CausalLM`` for this Hugging Face config (weights uninitialised: load them next).

    Raises ValueError for an unsupported architecture (naming the supported ones) or heads
    that do not split over ``tp_size``; RuntimeError if ``tp_size > 1`` without
    torch.distributed initialised.
    """
    spec = hf_config if isinstance(hf_config, ModelSpec) else ModelSpec.from_hf(hf_config)
    return CausalLM(spec, TPInfo(tp_rank, tp_size), dtype, device)


__all__ = ["SUPPORTED_ARCHITECTURES", "CausalLM", "ModelSpec", "WeightTarget", "build_model"]
