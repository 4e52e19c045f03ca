"""Where a batch-1 decode step of a real model goes, at 1 and 2 threads: the step time, the
decode plan's per-op times (``DecodePlan.profile``) and the LM head's GEMV alone, after a
256-token prompt as the peers decode runs. Reads of each linear in GB/s follow from the op
times and the model's shapes.

    flock /tmp/bench.lock python scripts/profile_decode_plan.py FILE.gguf [QUANTIZATION]

(QUANTIZATION: unset for a float file, ``gguf`` to keep a quantized file's blocks.)
"""

from __future__ import annotations

import sys
import time

import torch

from aioengine.bench.kernels import _OurModel
from aioengine.config import EngineConfig
from aioengine.worker import gemv
from aioengine.worker.cpu.decode_plan import DecodePlan
from aioengine.worker.model_runner import ModelRunner

PROMPT, WARMUP, STEPS = 256, 3, 40


def _plan(model: torch.nn.Module) -> DecodePlan | None:
    """The decode plan the model's CPU fast path built (None: it runs the per-layer loop)."""
    for module in (model, *model.children()):
        for value in vars(module).values():
            plan = getattr(value, "_plan", None)
            if isinstance(plan, DecodePlan):
                return plan
    return None


def main() -> None:
    path = sys.argv[1]
    quantization = sys.argv[2] if len(sys.argv) > 2 else None
    per_seq = -(-(PROMPT + WARMUP + 4 * STEPS + 8) // 16)
    for threads in (1, 2):
        cfg = EngineConfig(model=path, quantization=quantization, num_threads=threads,
                           block_size=16, num_kv_blocks=per_seq, max_num_seqs=1)
        runner = ModelRunner(cfg)
        runner.allocate_kv_cache(per_seq)
        driver = _OurModel(runner, per_seq)
        prompt = torch.randint(0, 1000, (1, PROMPT)).tolist()
        steps = [driver.decode_ms(prompt, WARMUP, STEPS) for _ in range(2)]
        print(f"threads={threads} step ms: {' '.join(f'{s:.2f}' for s in steps)}")
        plan = _plan(runner.model)
        if plan is None:
            print("  no decode plan: the per-layer loop ran")
        else:
            plan.profile(True)
            driver.decode_ms(prompt, WARMUP, STEPS)
            per_step = {k: v * 1000 / (WARMUP + STEPS) for k, v in plan.op_times().items()}
            plan.profile(False)
            print("  plan ms per step: " + ", ".join(f"{k} {v:.3f}" for k, v in per_step.items())
                  + f" (sum {sum(per_step.values()):.2f})")
        head = runner.model.lm_head or runner.model.embed_tokens
        if head.weight is not None and head.weight.dtype == torch.float32:
            x = torch.randn(1, head.weight.shape[1])
            gemv.linear(x, head.weight)
            t0 = time.perf_counter()
            for _ in range(20):
                gemv.linear(x, head.weight)
            ms = (time.perf_counter() - t0) / 20 * 1000
            gbs = head.weight.numel() * 4 / ms / 1e6
            print(f"  LM head {tuple(head.weight.shape)} alone: {ms:.2f} ms, {gbs:.1f} GB/s")
        del runner, driver


if __name__ == "__main__":
    main()
