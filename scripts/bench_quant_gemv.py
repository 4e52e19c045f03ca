"""GEMV (and small-M) timings of the quantized kernels against torch float32 ``F.linear`` on
SmolLM2-135M shapes, at 1 and 2 threads, with the weight bytes read per second next to the
machine's measured read bandwidth. Weights are cycled through enough copies (> 4x the L3) that
every call reads them from memory, as a decode step over 30 layers does.

    flock /tmp/bench.lock python scripts/bench_quant_gemv.py [--types q8_0,q4_0] [--m 1]
    flock /tmp/bench.lock python scripts/bench_quant_gemv.py --small-m   # tiled vs sgemm
    flock /tmp/bench.lock python scripts/bench_quant_gemv.py --decode-pass --types q4_1

Each row alternates ours and torch in the same loop (A/B), best of ``--repeats`` rounds;
every activation precision of ours (int16 default, float32, int8) runs in the same rounds.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
import torch.nn.functional as F

from aioengine.worker.quant import QTYPES, load_quant_kernel, quantize
from aioengine.worker.quant.kernel import ACTIVATIONS, X8_TYPES

SHAPES = [("qkv/o 576x576", 576, 576), ("k/v 192x576", 192, 576), ("gate/up 1536x576", 1536, 576),
          ("down 576x1536", 576, 1536), ("lm_head 49152x576", 49152, 576)]
WORKING_SET = 256 << 20


def read_bandwidth(threads: int) -> float:
    """GB/s of a torch sum over 1 GiB of float32 (torch splits it over ``threads``)."""
    torch.set_num_threads(threads)
    a = torch.ones(1 << 28, dtype=torch.float32)
    a.sum()
    best = 1e9
    for _ in range(5):
        t = time.perf_counter()
        a.sum()
        best = min(best, time.perf_counter() - t)
    return a.numel() * 4 / best / 1e9


def timeit(fn, copies: int, iters: int) -> float:
    for i in range(copies):
        fn(i)
    t = time.perf_counter()
    for i in range(iters):
        fn(i % copies)
    return (time.perf_counter() - t) / iters


def ab(kern, qt, x, qws, fws, out, th, level, iters, repeats, xws=None) -> dict[str, float]:
    """Best seconds per call of ours with each activation precision, of the x8 layout
    (``x8``, int16 activations, when ``xws`` holds its copies) and of torch fp32 (``torch``),
    alternating in every round."""
    acts = [a for a in ACTIVATIONS if a != "int8" or qt.name in ("q8_0", "q4_0", "q4_1")]
    best = {a: 1e9 for a in [*acts, "torch", "x8"]}
    for _ in range(repeats):
        if xws:
            best["x8"] = min(best["x8"], timeit(
                lambda i: kern.matmul_x8(qt, x, xws[i], out, threads=th, level=level),
                len(xws), iters))
        for a in acts:
            best[a] = min(best[a], timeit(
                lambda i, a=a: kern.matmul(qt, x, qws[i], out, threads=th, level=level,
                                           activations=a), len(qws), iters))
        best["torch"] = min(best["torch"], timeit(lambda i: F.linear(x, fws[i]), len(fws),
                                                  iters))
    return best


def small_m(kern, args) -> None:
    """M rows at once: the kernel's tiled path vs dequantize + torch sgemm vs fp32 F.linear."""
    from aioengine.worker.quant.weight import QuantizedWeight, QuantPolicy

    rng = np.random.default_rng(0)
    print(f"{'shape':20s} {'type':5s} {'M':>3s} {'thr':>3s} {'tiled us':>9s} {'sgemm us':>9s} "
          f"{'fp32 us':>9s}")
    for label, n, k in SHAPES[2:4]:
        w32 = rng.standard_normal((n, k)).astype(np.float32) * 0.05
        fw = torch.from_numpy(w32)
        for name in args.types.split(","):
            ws = []
            for rows in (1 << 30, 1):
                qw = QuantizedWeight(n, k, QuantPolicy(name, sgemm_min_rows=rows), kern)
                qw.set_rows(0, QTYPES[name], torch.from_numpy(quantize(w32, name)))
                ws.append(qw)
            for th in [int(t) for t in args.threads.split(",")]:
                torch.set_num_threads(th)
                for m in (2, 4, 8, 16, 32, 64):
                    x = torch.randn(m, k)
                    best = [1e9, 1e9, 1e9]
                    for _ in range(args.repeats):
                        for j, fn in enumerate((ws[0], ws[1], lambda a, w=fw: F.linear(a, w))):
                            best[j] = min(best[j], timeit(lambda i, f=fn, a=x: f(a), 1, 50))
                    print(f"{label:20s} {name:5s} {m:3d} {th:3d} {best[0] * 1e6:9.1f} "
                          f"{best[1] * 1e6:9.1f} {best[2] * 1e6:9.1f}", flush=True)


def decode_pass(kern, args) -> None:
    """One batch-1 decode step's linears on SmolLM2-135M shapes (30 layers of q/k/v 960x576,
    o 576x576, gate/up 3072x576, down 576x1536 in ``--types``' first type, and a 49152x576 Q8_0
    head), each layer its own weights (97 MB: every pass reads from memory): the row layout's
    int16 kernel against the x8 layout, whole passes alternated, best and median of rounds."""
    from aioengine.worker.quant.weight import QuantizedWeight, QuantPolicy

    rng = np.random.default_rng(0)
    name = args.types.split(",")[0]
    shapes = [(960, 576), (576, 576), (3072, 576), (576, 1536)] * 30 + [(49152, 576)]
    layers = {False: [], True: []}
    nbytes = 0
    for i, (n, k) in enumerate(shapes):
        t = "q8_0" if i == len(shapes) - 1 else name
        w = quantize((rng.standard_normal((n, k)) * 0.05).astype(np.float32), t)
        nbytes += w.nbytes
        for x8 in (False, True):
            qw = QuantizedWeight(n, k, QuantPolicy(t, x8=x8), kern)
            qw.set_rows(0, QTYPES[t], torch.from_numpy(w.copy()))
            qw.prepare()
            layers[x8].append((qw, torch.randn(args.m, k)))
    for th in [int(t) for t in args.threads.split(",")]:
        torch.set_num_threads(th)
        times = {False: [], True: []}
        for _ in range(args.repeats * 10):
            for x8 in (False, True):
                t0 = time.perf_counter()
                for qw, x in layers[x8]:
                    qw(x)
                times[x8].append(time.perf_counter() - t0)
        for x8 in (False, True):
            b, med = min(times[x8]), float(np.median(times[x8]))
            print(f"decode pass {name} M={args.m} threads={th} {'x8  ' if x8 else 'rows'}: best "
                  f"{b * 1e3:.2f} ms ({nbytes / b / 1e9:.1f} GB/s), median {med * 1e3:.2f} ms; "
                  f"x8/rows best {min(times[False]) / min(times[True]):.2f}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--types", default=",".join(QTYPES))
    ap.add_argument("--m", type=int, default=1)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--level", type=int, default=-1)
    ap.add_argument("--small-m", action="store_true")
    ap.add_argument("--shapes", default="")
    ap.add_argument("--decode-pass", action="store_true")
    args = ap.parse_args()
    kern = load_quant_kernel()
    if args.decode_pass:
        decode_pass(kern, args)
        return
    if args.small_m:
        small_m(kern, args)
        return
    rng = np.random.default_rng(0)
    threads = [int(t) for t in args.threads.split(",")]
    for th in threads:
        print(f"read bandwidth, torch sum over 1 GiB, {th} thread(s): "
              f"{read_bandwidth(th):.1f} GB/s")
    print(f"M={args.m}; time per call in us; GB/s = weight bytes / time")
    print("us per call: ours with int16 (default) / float32 / int8 activations, torch F.linear "
          "on float32 weights; GB/s: weight bytes / time")
    print(f"{'shape':20s} {'type':5s} {'thr':>3s} {'int16':>7s} {'f32':>7s} {'int8':>7s} "
          f"{'torch':>7s} {'x torch':>7s} {'GB/s':>6s} {'torchGB/s':>9s} {'x8':>7s} "
          f"{'x8 GB/s':>7s} {'x8/int16':>8s}")
    for label, n, k in SHAPES:
        if args.shapes and label.split()[0] not in args.shapes.split(","):
            continue
        w32 = rng.standard_normal((n, k)).astype(np.float32) * 0.05
        x = torch.from_numpy(rng.standard_normal((args.m, k)).astype(np.float32))
        fp_copies = max(2, WORKING_SET // w32.nbytes)
        fws = [torch.from_numpy(w32.copy()) for _ in range(fp_copies)]
        for name in args.types.split(","):
            qt = QTYPES[name]
            blocks = torch.from_numpy(quantize(w32, qt))
            copies = max(2, WORKING_SET // blocks.numel())
            qws = [blocks.clone() for _ in range(copies)]
            xws = [kern.repack_x8(qt, q, k) for q in qws] if name in X8_TYPES else None
            out = torch.empty(args.m, n)
            for th in threads:
                torch.set_num_threads(th)
                iters = max(20, min(2000, int(2e8 / (n * k))))
                b = ab(kern, qt, x, qws, fws, out, th, args.level, iters, args.repeats, xws)
                i8 = f"{b['int8'] * 1e6:7.1f}" if "int8" in b else f"{'-':>7s}"
                x8 = (f"{b['x8'] * 1e6:7.1f} {blocks.numel() / b['x8'] / 1e9:7.1f} "
                      f"{b['int16'] / b['x8']:8.2f}") if xws else ""
                print(f"{label:20s} {name:5s} {th:3d} {b['int16'] * 1e6:7.1f} "
                      f"{b['float32'] * 1e6:7.1f} {i8} {b['torch'] * 1e6:7.1f} "
                      f"{b['torch'] / b['int16']:7.2f} {blocks.numel() / b['int16'] / 1e9:6.1f} "
                      f"{w32.nbytes / b['torch'] / 1e9:9.1f} {x8}", flush=True)
            del qws, xws


if __name__ == "__main__":
    main()
