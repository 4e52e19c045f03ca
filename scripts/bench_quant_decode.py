"""Batch-1 decode step time of a real model with float32 weights against the same model with
its weights kept quantized (our kernels), at 1 and 2 threads, alternating A/B rounds in one
process (the kernels suite's own step driver: ModelRunner.execute with greedy sampling).

    flock /tmp/bench.lock python scripts/bench_quant_decode.py FILE.gguf [gguf gguf:float32 ...]

(``MODE:ACT[:rows]`` names the activation precision, default int16; env THREADS=1,2, BATCH=1,
SPIN_US=200: the pool's spin before sleeping.)

Prints the median step time per round and the best round's tokens/s; with ``weight GB/s``
(bytes of every weight a step reads / step time), and the time of the linears alone (one pass
over every weight at batch 1) with its GB/s, to set against the machine's read bandwidth.
"""

from __future__ import annotations

import os
import sys
import time

import torch

from aioengine.bench.kernels import _OurModel
from aioengine.config import EngineConfig
from aioengine.worker.model_runner import ModelRunner

PROMPT = 32
WARMUP, STEPS, ROUNDS = 3, 24, 3


def weight_bytes(model: torch.nn.Module) -> int:
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    if model.lm_head is None and model.embed_tokens.qhead is None:
        return total  # tied float head: the table is read once, as the head
    if model.embed_tokens.weight is not None:  # a GGUF table is looked up from its blocks
        total -= model.embed_tokens.weight.numel() * 4  # lookups read one row
    for m in model.modules():
        for attr in ("qweight", "qhead"):
            qw = getattr(m, attr, None)
            if qw is not None:
                total += qw.nbytes
    return total


def linears_ms(model: torch.nn.Module, rounds: int = 20) -> float:
    """Best time of one pass over every linear weight of the model at batch 1 (the matmuls of
    a decode step without attention, norms and Python around them)."""
    calls = []
    for m in model.modules():
        qw = getattr(m, "qweight", None) or getattr(m, "qhead", None)
        if qw is not None:
            calls.append((qw, torch.randn(1, qw.in_features)))
        elif isinstance(getattr(m, "weight", None), torch.Tensor) and m.weight.dim() == 2 \
                and hasattr(m, "tp"):
            if m is model.embed_tokens and model.lm_head is not None:
                continue  # an untied input embedding is only looked up
            w = m.weight
            calls.append((lambda a, w=w: torch.nn.functional.linear(a, w),
                          torch.randn(1, w.shape[1])))
    best = 1e9
    for _ in range(rounds):
        t0 = time.perf_counter()
        for fn, x in calls:
            fn(x)
        best = min(best, time.perf_counter() - t0)
    return best * 1000


def _row_layout(model: torch.nn.Module) -> None:
    """Every quantized weight of ``model`` keeps the file's row layout (no x8 repack)."""
    import dataclasses

    for mod in model.modules():
        for attr in ("qweight", "qhead"):
            qw = getattr(mod, attr, None)
            if qw is not None:
                qw.policy = dataclasses.replace(qw.policy, x8=False)


def main() -> None:
    # a mode: QUANT[:ACTIVATIONS[:rows]] (rows: the file's row layout instead of x8); FLOAT=0
    # leaves the float32 model out (the first mode is then the baseline)
    path, modes = sys.argv[1], [None, *(sys.argv[2:] or ["gguf"])]
    if os.environ.get("FLOAT", "1") == "0":
        modes = modes[1:]
    batch = int(os.environ.get("BATCH", "1"))
    if "SPIN_US" in os.environ:  # how long idle pool threads spin before sleeping
        from aioengine.worker.quant import load_quant_kernel

        load_quant_kernel().set_spin_ns(int(float(os.environ["SPIN_US"]) * 1000))
    per_seq = -(-(PROMPT + WARMUP + STEPS * ROUNDS + 2) // 16)
    for threads in [int(t) for t in os.environ.get("THREADS", "1,2").split(",")]:
        runs = {}
        for mode in modes:
            q, _, act = (mode or "").partition(":")
            act, _, layout = act.partition(":")
            cfg = EngineConfig(model=path, quantization=q or None, quant_activations=act or "int16",
                               num_threads=threads, block_size=16,
                               num_kv_blocks=per_seq * batch, max_num_seqs=batch)
            runner = ModelRunner(cfg)
            runner.allocate_kv_cache(per_seq * batch)
            if layout == "rows":
                _row_layout(runner.model)
            runs[mode] = (_OurModel(runner, per_seq), weight_bytes(runner.model), runner.model)
        prompt = torch.randint(0, 1000, (batch, PROMPT)).tolist()
        times: dict[str | None, list[float]] = {m: [] for m in modes}
        for _ in range(ROUNDS):
            for mode in modes:
                times[mode].append(runs[mode][0].decode_ms(prompt, WARMUP, STEPS))
        base = min(times[modes[0]])
        for mode in modes:
            best = min(times[mode])
            gbs = runs[mode][1] / (best / 1000) / 1e9
            lin = linears_ms(runs[mode][2])
            print(f"threads={threads} {mode or 'float32':8s} linears only: {lin:.2f} ms, "
                  f"{runs[mode][1] / (lin / 1000) / 1e9:.1f} GB/s")
            print(f"batch={batch} threads={threads} {mode or 'float32':8s} step ms (per round) "
                  f"{' '.join(f'{t:.2f}' for t in times[mode])} best {best:.2f} = "
                  f"{batch * 1000 / best:.1f} tok/s, x{base / best:.2f} vs "
                  f"{modes[0] or 'float32'}, weights "
                  f"{runs[mode][1] / 1e6:.0f} MB, {gbs:.1f} GB/s", flush=True)
        del runs


if __name__ == "__main__":
    main()
