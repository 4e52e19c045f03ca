"""Body of one tensor-parallel rank in the TP tests (runs in a spawned process): join the gloo
group, load each model's shard, run a mixed step schedule, rank 0 writes the logits; and
``tp2_logits``, which starts two such ranks from the test."""

from __future__ import annotations

import multiprocessing as mp
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from aioengine.worker.parallel import default_init_addr, destroy_distributed, init_distributed
from tests.worker.cpu_load import load_model
from tests.worker.driver import Driver
from tests.worker.hf_models import make_hf_model


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


Logits = Callable[[str, int, int], dict[str, torch.Tensor]]  # (model dir, rank, world)


def run_rank(rank: int, world: int, addr: str, model_dirs: list[str], out_files: list[str],
             logits: Logits) -> None:
    torch.set_num_threads(1)
    init_distributed(rank, world, addr, "gloo")
    try:
        for model_dir, out_file in zip(model_dirs, out_files, strict=True):
            results = logits(model_dir, rank, world)
            if rank == 0:
                save_file(results, out_file)
    finally:
        destroy_distributed()


def tp2_logits(tmp_path: Path, variants: list[tuple[str, dict[str, Any]]],
               logits: Logits) -> list[tuple[str, dict[str, torch.Tensor]]]:
    """In the test process: each variant's HF model (seed 11) written under ``tmp_path``, then
    two spawned gloo ranks run ``logits`` (a module-level function or a partial of one) on
    every model; (model dir, rank 0's logits) per variant."""
    dirs = [str(tmp_path / variant) for variant, _ in variants]
    outs = [str(tmp_path / f"{variant}-tp2.safetensors") for variant, _ in variants]
    for (variant, overrides), model_dir in zip(variants, dirs, strict=True):
        make_hf_model(variant, model_dir, seed=11, **overrides)
    ctx = mp.get_context("spawn")
    addr = default_init_addr()
    procs = [ctx.Process(target=run_rank, args=(r, 2, addr, dirs, outs, logits))
             for r in range(2)]
    for p in procs:
        p.start()
    try:
        for p in procs:
            p.join(timeout=240)
        assert [p.exitcode for p in procs] == [0, 0]
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
    return [(model_dir, load_file(out)) for model_dir, out in zip(dirs, outs, strict=True)]
