"""Error of each activation precision against float64, per block type: y = x @ W^T with W the
dequantized weights (so only the activation rounding and the float32 sums differ), x standard
normal with a few outlier channels (x20, as LLM hidden states have). Deterministic: no lock.

    python scripts/quant_activation_error.py
"""

from __future__ import annotations

import gguf
import numpy as np
import torch
from gguf.quants import dequantize

from aioengine.worker.quant import QTYPES, load_quant_kernel, quantize
from aioengine.worker.quant.kernel import ACTIVATIONS


def main() -> None:
    kern = load_quant_kernel()
    rng = np.random.default_rng(0)
    n, k = 576, 1536
    w = (rng.standard_normal((n, k)) * 0.05).astype(np.float32)
    x = rng.standard_normal((16, k)).astype(np.float32)
    x[:, rng.choice(k, 8, replace=False)] *= 20.0
    print(f"N={n} K={k}, 16 rows of x; relative RMS and max error vs float64 "
          "(of the same quantized weights)")
    for name, qt in QTYPES.items():
        b = quantize(w, name)
        wref = dequantize(b, getattr(gguf.GGMLQuantizationType, name.upper())).astype(np.float64)
        ref = x.astype(np.float64) @ wref.T
        row = []
        for act in ACTIVATIONS:
            if act == "int8" and name not in ("q8_0", "q4_0", "q4_1"):
                continue
            out = torch.empty(16, n)
            kern.matmul(qt, torch.from_numpy(x), torch.from_numpy(b), out, activations=act)
            err = out.numpy() - ref
            rms = np.sqrt((err ** 2).mean() / (ref ** 2).mean())
            row.append(f"{act}: rms {rms:.1e} max {np.abs(err).max() / np.abs(ref).max():.1e}")
        print(f"{name:5s} " + " | ".join(row))


if __name__ == "__main__":
    main()
