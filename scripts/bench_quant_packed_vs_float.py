"""A GGUF type's packed kernels against the float32 rows the loader made of it before they
existed (the tensor dequantized at load, then torch's ``F.linear``), on weight-sized linears:
``QuantizedWeight.forward`` both ways, the same rows, alternated in every round (A/B), best of
``--repeats``. Weights are cycled through enough copies (> ``WORKING_SET``) that each call reads
them from memory, as a decode step over many layers does.

    flock /tmp/bench.lock python scripts/bench_quant_packed_vs_float.py --types q5_1,q5_k
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from aioengine.worker.quant import QTYPES, load_quant_kernel, quantize
from aioengine.worker.quant.weight import QuantizedWeight, QuantPolicy

WORKING_SET = 192 << 20


def weights(kern, name: str, n: int, k: int) -> tuple[list, list]:
    """Copies of one weight as packed blocks and as the float rows of the same values."""
    rng = np.random.default_rng(0)
    blocks = quantize(rng.standard_normal((n, k)).astype(np.float32) * 0.05, name)
    qt = QTYPES[name]
    packed, floats = [], []
    for _ in range(max(2, -(-WORKING_SET // blocks.nbytes))):
        qw = QuantizedWeight(n, k, QuantPolicy("gguf"), kern)
        qw.set_rows(0, qt, torch.from_numpy(blocks.copy()))
        qw.prepare()
        packed.append(qw)
    values = packed[0].dequantize()
    for _ in range(max(2, -(-WORKING_SET // (values.numel() * 4)))):
        fw = QuantizedWeight(n, k, QuantPolicy("gguf"), kern)
        fw.set_rows(0, None, values.clone())
        floats.append(fw)
    return packed, floats


def best_us(ws: list, x: torch.Tensor, iters: int) -> float:
    for w in ws:
        w(x)
    t = time.perf_counter()
    for i in range(iters):
        ws[i % len(ws)](x)
    return (time.perf_counter() - t) / iters * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--types", default="q5_1,q5_k")
    ap.add_argument("--shapes", default="2048x2048,8192x2048", help="N x K, comma-separated")
    ap.add_argument("--m", default="1,32", help="batch rows")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--iters", type=int, default=20)
    args = ap.parse_args()
    kern = load_quant_kernel()
    print(f"{'type':5s} {'N x K':>10s} {'M':>3s} {'thr':>3s} {'packed us':>10s} {'float us':>10s} "
          f"{'speedup':>7s} {'packed MiB':>10s} {'float MiB':>9s}")
    for shape in args.shapes.split(","):
        n, k = (int(v) for v in shape.split("x"))
        for name in args.types.split(","):
            packed, floats = weights(kern, name, n, k)
            for m in (int(v) for v in args.m.split(",")):
                x = torch.randn(m, k)
                for th in (int(v) for v in args.threads.split(",")):
                    torch.set_num_threads(th)
                    p = f = 1e12
                    for _ in range(args.repeats):
                        p = min(p, best_us(packed, x, args.iters))
                        f = min(f, best_us(floats, x, args.iters))
                    print(f"{name:5s} {shape:>10s} {m:3d} {th:3d} {p:10.1f} {f:10.1f} "
                          f"{f / p:6.2f}x {packed[0].nbytes / 2**20:10.2f} "
                          f"{floats[0].nbytes / 2**20:9.2f}", flush=True)


if __name__ == "__main__":
    main()
