"""A/B of the CPU float32 GEMV: batch-1 decode ms/token of one model with the compiled GEMV
(default) and with torch's ``F.linear`` (``CpuKernelConfig(cpu_gemv=False)``), alternated, at
each thread count. Each measurement is a fresh interpreter.

    .venv/bin/python scripts/ab_cpu_gemv.py MODEL [--threads 1,2] [--rounds 2]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys

CHILD = """
import sys
from aioengine.bench.kernels import _OurModel
from aioengine.config import CpuKernelConfig, EngineConfig
from aioengine.worker.model_runner import ModelRunner
cfg = EngineConfig(model=sys.argv[1], block_size=16, num_kv_blocks=64, max_num_seqs=1,
                   num_threads=int(sys.argv[2]), dtype="float32",
                   cpu_kernels=CpuKernelConfig(cpu_gemv=sys.argv[3] == "1"))
r = ModelRunner(cfg)
r.allocate_kv_cache(64)
print("MS", _OurModel(r, 32).decode_ms([list(range(100, 356))], 5, 40))
"""


def one(model: str, threads: int, gemv: bool) -> float:
    out = subprocess.run([sys.executable, "-c", CHILD, model, str(threads), "1" if gemv else "0"],
                         capture_output=True, text=True, check=True).stdout
    return float(next(ln for ln in out.splitlines() if ln.startswith("MS")).split()[1])


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("--threads", default="1,2")
    p.add_argument("--rounds", type=int, default=2)
    a = p.parse_args()
    for t in (int(x) for x in a.threads.split(",")):
        got: dict[bool, list[float]] = {True: [], False: []}
        for _ in range(a.rounds):
            for gemv in (False, True):
                got[gemv].append(one(a.model, t, gemv))
        off, on = statistics.median(got[False]), statistics.median(got[True])
        print(f"threads={t}: torch F.linear {off:.1f} ms/token, GEMV kernel {on:.1f} ms/token "
              f"({off / on:.2f}x)  [{got[False]} / {got[True]}]")


if __name__ == "__main__":
    main()
