"""The logits one rank computes in the quantized tensor-parallel test (run in a spawned process
by ``tests.worker.tp_child.run_rank``)."""

from __future__ import annotations

import torch

from tests.worker.cpu_load import load_model
from tests.worker.tp_child import schedule_logits


def quantized_logits(model_dir: str, rank: int, world: int, mode: str) -> dict[str, torch.Tensor]:
    model, cfg = load_model(model_dir, dtype="float32", device="cpu", tp_rank=rank,
                            tp_size=world, quantization=mode)
    return schedule_logits(model, cfg)


MODES = ("q8_0", "q4_0", "q5_0")


def every_mode_logits(model_dir: str, rank: int, world: int) -> dict[str, torch.Tensor]:
    """``quantized_logits`` of each of MODES, keyed ``"<mode>.<key>"``: one pair of spawned
    ranks serves every mode."""
    return {f"{mode}.{key}": value for mode in MODES
            for key, value in quantized_logits(model_dir, rank, world, mode).items()}
