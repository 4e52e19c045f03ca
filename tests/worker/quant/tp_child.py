"""Body of one rank in the quantized tensor-parallel test (runs in a spawned process)."""

from __future__ import annotations

import torch
from safetensors.torch import save_file

from aioengine.worker.loader import load_model
from aioengine.worker.parallel import destroy_distributed, init_distributed
from tests.worker.tp_child import schedule_logits


def quantized_logits(model_dir: str, rank: int, world: int, mode: str) -> dict[str, torch.Tensor]:
    model, cfg = load_model(model_dir, dtype="float32", device="cpu", tp_rank=rank,
                            tp_size=world, quantization=mode)
    return schedule_logits(model, cfg)


def run_rank(rank: int, world: int, addr: str, model_dirs: list[str], out_files: list[str],
             mode: str) -> None:
    torch.set_num_threads(1)
    init_distributed(rank, world, addr, "gloo")
    try:
        for model_dir, out_file in zip(model_dirs, out_files, strict=True):
            results = quantized_logits(model_dir, rank, world, mode)
            if rank == 0:
                save_file(results, out_file)
    finally:
        destroy_distributed()
