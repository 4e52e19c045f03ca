"""The logits one rank computes in the quantized tensor-parallel test (run in a spawned process
by ``tests.worker.tp_child.run_rank``)."""

from __future__ import annotations

import torch

from aioengine.worker.loader import load_model
from tests.worker.tp_child import schedule_logits


def quantized_logits(model_dir: str, rank: int, world: int, mode: str) -> dict[str, torch.Tensor]:
    model, cfg = load_model(model_dir, dtype="float32", device="cpu", tp_rank=rank,
                            tp_size=world, quantization=mode)
    return schedule_logits(model, cfg)
