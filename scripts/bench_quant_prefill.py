"""Prefill-sized products (M = 8..512 rows) of the x8 kernels against a dequantized copy and
torch's sgemm (what ``QuantizedWeight`` ran from ``SGEMM_MIN_ROWS`` rows on before the x8
prefill path), and the two-group tile against the one-group kernel, on SmolLM2-135M's shapes.
All three alternate in every round (A/B/C in one process); best of ``--repeats``.

    flock /tmp/bench.lock python scripts/bench_quant_prefill.py [--m 8,64,512] [--threads 1,2]
        [--isa avx2]  (the AVX2 kernels on an AVX-512 machine; ``CpuKernelConfig.quant_isa``)
"""

from __future__ import annotations

import argparse
import time

import torch

from aioengine.worker.quant import QTYPES, load_quant_kernel, quantize
from aioengine.worker.quant.kernel import X8_TILE_MIN_M

SHAPES = [(3072, 576), (960, 576), (576, 576), (576, 1536)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--types", default="q8_0,q4_1,q4_0,q5_0")
    ap.add_argument("--m", default="8,64,512")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--isa", default="best", choices=("best", "scalar", "avx2", "avx512"))
    a = ap.parse_args()
    kern = load_quant_kernel()
    kern.set_max_isa(a.isa)
    print("threads type shape M: tile ms (GMAC/s) | one-group ms | dequantize+sgemm ms | "
          "tile vs one-group, vs sgemm")
    for th in (int(v) for v in a.threads.split(",")):
        torch.set_num_threads(th)
        for name in a.types.split(","):
            qt = QTYPES[name]
            for n, k in SHAPES:
                q = torch.from_numpy(quantize((torch.randn(n, k) * 0.05).numpy(), qt))
                x8 = kern.repack_x8(qt, q, k)
                for m in (int(v) for v in a.m.split(",")):
                    x, out = torch.randn(m, k), torch.empty(m, n)

                    def tile(x=x, out=out, x8=x8, qt=qt, th=th):
                        kern.set_x8_tile(2)
                        kern.matmul_x8(qt, x, x8, out, threads=th)

                    def one(x=x, out=out, x8=x8, qt=qt, th=th):
                        kern.set_x8_tile(1 << 30)
                        kern.matmul_x8(qt, x, x8, out, threads=th)

                    def sgemm(x=x, out=out, q=q, qt=qt, k=k, th=th):
                        torch.mm(x, kern.dequantize(qt, q, k, threads=th).t(), out=out)

                    best = {f: float("inf") for f in (tile, one, sgemm)}
                    for _ in range(a.repeats + 1):
                        for f in best:
                            t0 = time.perf_counter()
                            f()
                            best[f] = min(best[f], time.perf_counter() - t0)
                    kern.set_x8_tile(X8_TILE_MIN_M)
                    t, o, s = best[tile], best[one], best[sgemm]
                    print(f"t{th} {name} {n}x{k} M={m}: {t * 1e3:.3f} ms "
                          f"({m * n * k / t / 1e9:.0f}) | {o * 1e3:.3f} | {s * 1e3:.3f} | "
                          f"{o / t:.2f}x, {s / t:.2f}x", flush=True)


if __name__ == "__main__":
    main()
