"""The decode plan: a step's decoder layers in one C call (``cpu/kernels/plan/decode_plan.c``).

``CpuLayerPath`` (``aioengine.worker.cpu.layer_path``) runs a layer as four linears and four
compiled ops called from Python, and at batch 1 that Python between the C calls was a sizeable
share of a step (docs/benchmarks.md, session 8). The plan records, once per model and KV cache,
every layer's weight pointers (the quantized weights' ``QkSeg`` arrays or the float32 rows),
norm weights and cache, and ``plan_run`` calls the same compiled functions in the same order for
every layer: the results are bit-equal to the loop's, the Python per step is a few field writes.

It covers decode steps (one token per sequence, the compiled attention kernel, no sliding-window
layers) whose every linear is a quantized weight with a decode plan or a float32 weight the F32
GEMV takes; anything else runs the loop. ``CpuKernelConfig.decode_plan`` off turns it off (A/B).
"""

from __future__ import annotations

import ctypes
from pathlib import Path

from aioengine.worker.cpu.kernels import library
from aioengine.worker.cpu.kernels.build import KernelBuildError
from aioengine.worker.cpu.kernels.library import fn_address

KIND_SEGS, KIND_F32 = 0, 1
_P, _I, _F, _I32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float, ctypes.c_int32
OPS = ("input norm", "qkv", "rope/KV write", "attention", "o_proj", "post-attention norm",
       "gate_up", "SiLU*up", "down", "next norm", "LM head")
"""``plan_run``'s op numbers (``where % 16``; the decode lane's embedding and rotary rows are
timed with the input norm)."""
LANE_OPS = {10: "embedding", 11: "rotary rows", 12: "LM head"}
"""The decode lane's parts in ``where`` (outside the layers)."""
_ERRORS = {-101: "bad sizes (a layer's linears do not fit the model's sizes)",
           -102: "unknown linear kind",
           -103: "a token id or position outside the table"}
_OPS_ERRORS = {-1: "bad sizes or leading dimensions", -2: "a KV slot is outside the cache"}


class PlanLinear(ctypes.Structure):
    _fields_ = [("kind", _I32), ("nseg", _I32), ("w", _P), ("n", _I), ("k", _I)]


class PlanLayer(ctypes.Structure):
    _fields_ = [("qkv", PlanLinear), ("o", PlanLinear), ("gate_up", PlanLinear),
                ("down", PlanLinear), ("in_w", _P), ("post_w", _P), ("cache", _P)]


class PlanStep(ctypes.Structure):
    _fields_ = [
        ("matmul_segs", _P), ("gemv_f32", _P), ("add_rms_norm", _P), ("rope_store", _P),
        ("silu_mul", _P), ("attention", _P),
        ("layers", _P), ("nlayers", _I), ("hidden", _I), ("hq", _I), ("hkv", _I), ("d", _I),
        ("inter", _I), ("final_w", _P), ("eps", _F), ("scale", _F), ("norm_offset", _I32),
        ("pad", _I32),
        ("t", _I), ("half", _I), ("slots_per_head", _I),
        ("residual", _P), ("x", _P), ("qkv", _P), ("attn", _P), ("y", _P), ("gu", _P),
        ("act", _P), ("cos", _P), ("sin", _P), ("slots", _P),
        ("rows", _P), ("block_tables", _P), ("context_lens", _P), ("window_starts", _P),
        ("b", _I), ("block_size", _I), ("num_blocks", _I), ("max_blocks", _I),
        ("qthreads", _I32), ("fthreads", _I32), ("op_ns", _P),
        ("pool_run", _P), ("attention_heads", _P),
        ("ids", _P), ("embed_rows", _P), ("embed_w", _P), ("embed_n", _I),
        ("embed_qtype", _I32), ("pad2", _I32), ("positions", _P), ("cos_table", _P),
        ("sin_table", _P), ("table_rows", _I), ("head", PlanLinear), ("logits", _P),
        ("argmax", _P), ("vocab", _I),
    ]


class PlanError(ValueError):
    """A plan step rejected its inputs: the message names the layer and op."""


def error_text(code: int, where: int) -> str:
    """``plan_run``'s error ``code`` at ``where`` (layer * 16 + op) in words."""
    if where < 0:
        return f"decode plan rejected its inputs: {_ERRORS.get(code, f'code {code}')}"
    layer, op = divmod(where, 16)
    name = OPS[op] if op < len(OPS) - 1 else LANE_OPS.get(op, f"op {op}")
    if code in _ERRORS:
        what = _ERRORS[code]
    elif op in (1, 4, 6, 8, 10, 12):  # the quantized kernels' or the F32 GEMV's codes
        from aioengine.worker.quant.kernel import error_text as quant_error

        what = quant_error(code)
    elif op == 3:
        from aioengine.worker.attention.cpu_kernel.kernel import _ERRORS as attn_errors

        what = attn_errors.get(code, f"code {code}")
    else:
        what = _OPS_ERRORS.get(code, f"code {code}")
    at = name if op in LANE_OPS else f"layer {layer}, {name}"
    return f"decode plan rejected its inputs at {at}: {what} (code {code})"


class PlanLib:
    def __init__(self, path: str) -> None:
        lib = library.open_library(library.PLAN, path)
        self.path = path
        self._lib = lib
        self.run = lib.plan_run
        for i, s in enumerate((PlanLinear, PlanLayer, PlanStep)):
            if lib.plan_sizeof(i) != ctypes.sizeof(s):
                raise KernelBuildError(f"decode plan struct {s.__name__} is "
                                       f"{lib.plan_sizeof(i)} bytes in C, "
                                       f"{ctypes.sizeof(s)} in Python")


def ensure_built(compiler_name: str | None = None) -> Path:
    return library.ensure_built(library.PLAN, compiler_name)


_lib: PlanLib | None = None


def load_plan_lib(compiler_name: str | None = None) -> PlanLib:
    """Build (once per machine) and load; ``KernelBuildError`` when that fails here."""
    global _lib
    if _lib is None:
        _lib = PlanLib(str(ensure_built(compiler_name)))
    return _lib


__all__ = ["KIND_F32", "KIND_SEGS", "LANE_OPS", "PlanError", "PlanLayer", "PlanLib",
           "PlanLinear", "PlanStep", "error_text", "fn_address", "load_plan_lib"]
