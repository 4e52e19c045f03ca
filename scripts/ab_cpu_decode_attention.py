"""A/B of CPU decode attention: torch SDPA (spans + buckets) against the compiled kernel.

Replays one decode step of B sequences (context lengths drawn like the offline bench's, mean
~330) through ``ModelRunner.execute`` on the same model and KV cache, switching only the
runner's decode kernel, in alternating rounds. Blocks are laid out as the engine's block
manager prefers (one run of adjacent ids per sequence: SDPA's best case, its spans), or
scattered (``--scattered``). Run it under the bench lock::

    flock /tmp/aioengine-bench.lock .venv/bin/python scripts/ab_cpu_decode_attention.py
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import torch

from aioengine.config import EngineConfig
from aioengine.messages.sampling_params import SamplingParams
from aioengine.messages.worker_io import NewSequence, ScheduledChunk, StepInput
from aioengine.worker.model_runner import ModelRunner


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=30, help="timed steps per mode per round")
    ap.add_argument("--scattered", action="store_true", help="shuffle every block id")
    args = ap.parse_args()
    rng = random.Random(0)
    bs = 16
    lens = [rng.randint(16, 512) + rng.randint(0, 256) // 2 for _ in range(args.batch)]
    per_seq = [-(-(n + 1) // bs) for n in lens]
    total = sum(per_seq)
    ids = list(range(total))
    if args.scattered:
        rng.shuffle(ids)
    tables, at = [], 0
    for n in per_seq:
        tables.append(ids[at:at + n])
        at += n
    config = EngineConfig(model=args.model, block_size=bs, num_kv_blocks=total,
                          max_num_seqs=args.batch, cpu_decode_attention="kernel", num_threads=1)
    runner = ModelRunner(config)
    runner.allocate_kv_cache(total)
    kernel = runner.decode_kernel
    vocab = runner.spec.vocab_size
    greedy = SamplingParams(temperature=0.0)
    rids = [f"r{i}" for i in range(args.batch)]
    prompts = [[rng.randrange(vocab) for _ in range(n)] for n in lens]
    for rid, p, t in zip(rids, prompts, tables, strict=True):  # prefill one at a time
        runner.execute(StepInput(0, [NewSequence(rid, p, [], greedy)],
                                 [ScheduledChunk(rid, p, 0, t, True)], []))
    step = StepInput(1, [], [ScheduledChunk(rid, [1], n, t, True)
                             for rid, n, t in zip(rids, lens, tables, strict=True)], [])
    print(f"batch {args.batch}, mean context {statistics.mean(lens) + 1:.0f}, "
          f"{'scattered' if args.scattered else 'one run per sequence'}, "
          f"torch threads {torch.get_num_threads()}")
    ratios = []
    for r in range(args.rounds):
        ms = {}
        for name, k in (("sdpa", None), ("kernel", kernel)):
            runner.decode_kernel = k
            for _ in range(3):
                runner.execute(step)
            times = []
            for _ in range(args.steps):
                t0 = time.perf_counter()
                runner.execute(step)
                times.append(time.perf_counter() - t0)
            ms[name] = statistics.median(times) * 1000
        ratios.append(ms["sdpa"] / ms["kernel"])
        print(f"round {r}: sdpa {ms['sdpa']:.2f} ms/step, kernel {ms['kernel']:.2f} ms/step, "
              f"speed-up {ratios[-1]:.2f}x")
    print(f"median speed-up {statistics.median(ratios):.2f}x")


if __name__ == "__main__":
    main()
