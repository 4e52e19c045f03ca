"""Body of one tensor-parallel rank in the TP tests (runs in a spawned process): join the gloo
group, load each model's shard, run a mixed step schedule, rank 0 writes the logits."""

from __future__ import annotations

import torch
from safetensors.torch import save_file

from aioengine.worker.loader import load_model
from aioengine.worker.parallel import destroy_distributed, init_distributed
from tests.worker.driver import Driver


def schedule_logits(model, cfg) -> dict[str, torch.Tensor]:
    """Logits of every token of a mixed schedule (prefill groups, chunk over prefix, decodes)."""
    d = Driver(model, cfg, block_size=4)
    for n in (9, 17, 1):
        d.add([(7 * i + n) % cfg.vocab_size for i in range(n)])
    d.step([(0, 9), (1, 6), (2, 1)])
    d.step([(1, 11), (0, 1), (2, 1)])
    d.decode_all(4)
    return {f"seq{i}": torch.stack([s.logits[p] for p in sorted(s.logits)]).contiguous()
            for i, s in enumerate(d.seqs)}


def all_logits(model_dir: str, rank: int, world: int) -> dict[str, torch.Tensor]:
    results = {}
    for fmt in ("safetensors", "dummy"):
        model, cfg = load_model(model_dir, dtype="float32", device="cpu", load_format=fmt,
                                tp_rank=rank, tp_size=world, seed=3)
        for key, value in schedule_logits(model, cfg).items():
            results[f"{fmt}.{key}"] = value
    return results


def run_rank(rank: int, world: int, addr: str, model_dirs: list[str],
             out_files: list[str]) -> None:
    torch.set_num_threads(1)
    init_distributed(rank, world, addr, "gloo")
    try:
        for model_dir, out_file in zip(model_dirs, out_files, strict=True):
            results = all_logits(model_dir, rank, world)
            if rank == 0:
                save_file(results, out_file)
    finally:
        destroy_distributed()
