"""A hash of every compiled CPU kernel's outputs over fixed random inputs: every tensor type,
code path this CPU runs, activation precision, layout and a range of row counts and thread
counts, plus the float32 GEMV, the layer ops and the decode attention. Run it before and after a
change to the C side that must not change results (a move, a split): the two hashes must match.

    python scripts/kernels_fingerprint.py [-v]     # -v: one hash per case, to find a difference
"""

from __future__ import annotations

import hashlib
import sys

import numpy as np
import torch

from aioengine.worker import gemv
from aioengine.worker.attention.cpu_kernel import load_decode_kernel
from aioengine.worker.ops import load_cpu_ops
from aioengine.worker.quant import QTYPES, load_quant_kernel, quantize
from aioengine.worker.quant.kernel import X8_TYPES

VERBOSE = "-v" in sys.argv
total = hashlib.sha256()


def record(name: str, *tensors: torch.Tensor) -> None:
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.contiguous().numpy().tobytes())
    total.update(name.encode() + h.digest())
    if VERBOSE:
        print(f"{h.hexdigest()[:16]} {name}")


def main() -> None:
    torch.manual_seed(0)
    kern = load_quant_kernel()
    levels = list(range(kern.best_level + 1))
    for name, qt in QTYPES.items():
        for n, k in ((40, 512), (13, 256)):
            w32 = np.random.default_rng(n * k).standard_normal((n, k)).astype(np.float32)
            w = torch.from_numpy(quantize(w32, qt))
            for level in levels:
                record(f"{name} deq {n}x{k} L{level}", kern.dequantize(qt, w, k, level=level))
                for act in ("float32", "int16", "int8"):
                    if act == "int8" and name not in ("q8_0", "q4_0", "q4_1"):
                        continue
                    for m in (1, 2, 3, 4, 5, 9):
                        for th in (1, 2):
                            x = torch.randn(m, k)
                            out = torch.empty(m, n)
                            kern.matmul(qt, x, w, out, threads=th, level=level, activations=act)
                            record(f"{name} {act} {n}x{k} M{m} t{th} L{level}", out)
            if name not in X8_TYPES:
                continue
            w8 = kern.repack_x8(qt, w, k)
            record(f"{name} x8 repack {n}x{k}", w8, kern.unpack_x8(qt, w8, n, k))
            ids = torch.tensor([0, n - 1, 7, 8, 3], dtype=torch.int64)
            record(f"{name} x8 rows {n}x{k}", kern.rows_x8(qt, w8, n, k, ids))
            for level in levels:
                record(f"{name} x8 deq {n}x{k} L{level}",
                       kern.dequantize_x8(qt, w8, n, k, level=level))
                for tile in (3, 1 << 30):
                    kern.set_x8_tile(tile)
                    for m in (1, 2, 3, 4, 5, 9, 40):
                        for th in (1, 2):
                            x = torch.randn(m, k)
                            out = torch.empty(m, n)
                            kern.matmul_x8(qt, x, w8, out, threads=th, level=level)
                            record(f"{name} x8 {n}x{k} M{m} t{th} L{level} tile{tile}", out)
                kern.set_x8_tile(3)
    g = gemv.GemvKernel(str(gemv.ensure_built()))
    for n, k in ((100, 300), (64, 576)):
        w = torch.randn(n, k)
        for level in levels:
            for m in (1, 2, 7, 9, 20):
                for th in (1, 2):
                    record(f"f32 {n}x{k} M{m} t{th} L{level}",
                           g(torch.randn(m, k), w, threads=th, level=level))
    ops = load_cpu_ops()
    x, res, wn = torch.randn(5, 96), torch.randn(5, 96), torch.randn(96)
    record("rms_norm", ops.rms_norm(x, wn, 1e-5, residual=res), res)
    record("silu_mul", ops.silu_mul(torch.randn(5, 192)))
    hq, hkv, d, bs, blocks = 4, 2, 64, 4, 16
    for dtype in (torch.float32, torch.float16):
        qkv = torch.randn(3, (hq + 2 * hkv) * d)
        cache = torch.zeros(2, hkv, blocks, bs, d, dtype=dtype)
        cos, sin = torch.randn(3, d // 2), torch.randn(3, d // 2)
        ops.rope_store(qkv, hq, hkv, d, cos, sin, cache, torch.tensor([0, 5, 9]))
        record(f"rope {dtype}", qkv, cache.float())
        attn = load_decode_kernel()
        cache = torch.randn(2, hkv, blocks, bs, d).to(dtype)
        q = torch.randn(3, hq, d)
        out = torch.empty_like(q)
        tables = torch.tensor([[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]])
        attn(q, cache, tables, torch.tensor([3, 9, 16]), 0.125, out)
        record(f"attention {dtype}", out)
    print(f"levels {levels}: {total.hexdigest()}")


if __name__ == "__main__":
    main()
