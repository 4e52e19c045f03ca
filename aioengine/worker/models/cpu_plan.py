"""The CPU fast path's decode steps as one C call (``aioengine.worker.ops.plan``).

``DecodePlan.build`` records a model's layers once per KV cache (weight pointers, norm weights,
caches; None when a linear is one the plan does not run: a bias, tensor parallelism, float rows
inside a quantized weight, the F32 GEMV off); ``DecodePlan.run`` checks a step's inputs in
Python (the attention kernel's own checks, the activations' sizes) and makes one ``plan_run``
call for every layer, or returns None when the step is not one it covers (prefill or mixed
steps, too many rows for the linears' decode kernels), leaving it to ``CpuLayerPath``'s loop.
Models that mix sliding-window and full layers (two metadata, two rope tables) have no plan.
"""

from __future__ import annotations

import ctypes
import logging
from typing import Any

import torch

from aioengine.worker import gemv
from aioengine.worker.attention import AttentionMetadata
from aioengine.worker.cbuild import KernelBuildError
from aioengine.worker.ops import CpuOps
from aioengine.worker.ops import plan as cplan
from aioengine.worker.quant.kernel import load_quant_kernel
from aioengine.worker.threads import kernel_threads

logger = logging.getLogger(__name__)


def _describe(module: Any, out: cplan.PlanLinear) -> tuple[Any, ...] | str:
    """Fill ``out`` for ``module``; returns what to re-check per step (the weight and its
    recorded state), or why the plan cannot run it."""
    if getattr(module, "bias", None) is not None or module.tp.size != 1:
        return f"{type(module).__name__} with a bias or tensor parallelism"
    q = module.qweight
    if q is not None:
        if q._plan is None or q._plan.policy is not q.policy:
            q.prepare()
        p = q._plan
        if p is None:
            return "a quantized weight with float rows"
        out.kind, out.nseg, out.w = cplan.KIND_SEGS, p.nseg, ctypes.addressof(p.segs)
        out.n, out.k = q.out_features, q.in_features
        return (q, p, p.policy)
    w = module.weight
    if gemv._kernel is None:
        return "the F32 GEMV is off"
    if w.dtype != torch.float32 or w.dim() != 2 or not w.is_contiguous():
        return f"a {w.dtype} {tuple(w.shape)} weight"
    out.kind, out.nseg, out.w = cplan.KIND_F32, 0, w.data_ptr()
    out.n, out.k = w.shape
    return (w, w.data_ptr())


def _max_rows(state: tuple[Any, ...]) -> int:
    """The most rows ``state``'s module computes as the plan does: a quantized weight's plan
    below its sgemm threshold (any M when every segment is x8), the F32 GEMV up to its
    ``MAX_ROWS``."""
    if len(state) == 3:
        return 1 << 30 if state[1].any_m else state[2].sgemm_min_rows - 1
    return gemv.MAX_ROWS


def _current(state: tuple[Any, ...]) -> bool:
    if len(state) == 3:  # quantized: the same plan (layout) under the same policy
        q, p, policy = state
        return q._plan is p and q.policy is policy
    w, ptr = state
    return w.data_ptr() == ptr


class DecodePlan:
    """One model's layers for ``plan_run``, valid for one set of KV cache tensors."""

    def __init__(self, lib: cplan.PlanLib, step: cplan.PlanStep, layers: Any,
                 states: list[tuple[Any, ...]], caches: tuple[int, ...], max_rows: int,
                 windowed: bool, keep: tuple[Any, ...]) -> None:
        self.lib = lib
        self.step = step
        self.layers = layers  # the ctypes array the step points at
        self.states = states
        self.caches = caches
        self.max_rows = max_rows
        self.windowed = windowed  # every layer attends with the step's windowed metadata
        self.runs = 0  # steps run (tests)
        self.keep = keep
        self._scratch: dict[int, tuple[torch.Tensor, ...]] = {}
        self._where = ctypes.c_int64(-1)

    @classmethod
    def build(cls, model: Any, ops: CpuOps,
              kv_caches: list[torch.Tensor]) -> DecodePlan | str:
        """The plan for ``model``'s layers over ``kv_caches``, or why there is none."""
        if not cplan.enabled():
            return f"{cplan.DISABLE_ENV}=0"
        windowed = [bool(layer.windowed) for layer in model.layers]
        if any(windowed) and not all(windowed):
            return "a mix of sliding-window and full layers"
        try:
            lib = cplan.load_plan_lib()
            qk = load_quant_kernel()
        except KernelBuildError as e:
            logger.warning("CPU decode plan unavailable, the per-layer loop instead: %s", e)
            return f"not built: {e}"
        attn0 = model.layers[0].self_attn
        hq, hkv, d = attn0.num_heads, attn0.num_kv_heads, attn0.head_dim
        hidden = model.spec.hidden_size
        arr = (cplan.PlanLayer * len(model.layers))()
        states: list[tuple[Any, ...]] = []
        inter = None
        for i, (layer, pl, cache) in enumerate(zip(model.layers, arr, kv_caches, strict=True)):
            attn, mlp = layer.self_attn, layer.mlp
            for name, module in (("qkv", attn.qkv_proj), ("o", attn.o_proj),
                                 ("gate_up", mlp.gate_up_proj), ("down", mlp.down_proj)):
                got = _describe(module, getattr(pl, name))
                if isinstance(got, str):
                    return f"layer {i} {name}: {got}"
                states.append(got)
            if pl.gate_up.n % 2 or (inter is not None and pl.gate_up.n // 2 != inter):
                return f"layer {i}: gate_up of {pl.gate_up.n} rows"
            inter = pl.gate_up.n // 2
            pl.in_w = layer.input_layernorm.weight.data_ptr()
            pl.post_w = layer.post_attention_layernorm.weight.data_ptr()
            pl.cache = cache.data_ptr()
        # quantized weights take the kernels below their sgemm threshold, float ones up to the
        # GEMV's MAX_ROWS: the plan runs a step only where every linear does what its module
        # would (the smallest of the limits)
        max_rows = min(_max_rows(st) for st in states)
        f16 = kv_caches[0].dtype == torch.float16
        step = cplan.PlanStep()
        step.matmul_segs = cplan.fn_address(qk.raw_matmul_segs)
        step.gemv_f32 = cplan.fn_address(qk._lib.qk_gemv_f32)
        step.add_rms_norm = cplan.fn_address(ops.fn_add_rms_norm)
        step.rope_store = cplan.fn_address(ops.fn_rope_store_f16 if f16 else ops.fn_rope_store)
        step.silu_mul = cplan.fn_address(ops.fn_silu_mul)
        step.layers = ctypes.addressof(arr)
        step.nlayers, step.hidden, step.hq, step.hkv, step.d = len(arr), hidden, hq, hkv, d
        step.inter = inter
        step.final_w = model.norm.weight.data_ptr()
        step.eps, step.scale = float(model.spec.rms_norm_eps), float(attn0.scale)
        step.norm_offset = int(model.spec.norm_offset)
        keep = (qk, ops, tuple(kv_caches), model.norm.weight)
        return cls(lib, step, arr, states, tuple(c.data_ptr() for c in kv_caches), max_rows,
                   all(windowed), keep)

    def current(self, kv_caches: list[torch.Tensor]) -> bool:
        """Still valid: the same caches, every weight as recorded."""
        return (len(kv_caches) == len(self.caches)
                and all(c.data_ptr() == p for c, p in zip(kv_caches, self.caches, strict=True))
                and all(_current(s) for s in self.states))

    def _buffers(self, t: int) -> tuple[torch.Tensor, ...]:
        bufs = self._scratch.get(t)
        if bufs is None:
            s = self.step
            width = (s.hq + 2 * s.hkv) * s.d
            bufs = (torch.empty(t, width), torch.empty(t, s.hq, s.d), torch.empty(t, s.hidden),
                    torch.empty(t, 2 * s.inter), torch.empty(t, s.inter))
            self._scratch[t] = bufs
        return bufs

    def run(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
            meta: AttentionMetadata, windowed: AttentionMetadata | None,
            kv_caches: list[torch.Tensor]) -> torch.Tensor | None:
        """The final-normed hidden ``[T, H]`` of a decode step (``h`` the embeddings, owned:
        it becomes the residual stream), or None when the plan does not cover the step.
        ``h`` contiguous float32, cos/sin contiguous ``[T, R/2]``, slots checked by the
        caller."""
        slots = meta.slot_mapping
        if self.windowed and windowed is not None:
            meta = windowed  # as the loop picks it for a windowed layer
        dec = meta.decode
        t = h.shape[0]
        if dec is None or dec.kernel is None or dec.token_index is not None or meta.prefills \
                or t > self.max_rows:
            return None
        s = self.step
        if h.shape[1] != s.hidden:
            raise cplan.PlanError(f"hidden states of {h.shape[1]} values, the model's are "
                                  f"{s.hidden}")
        qkv, attn, y, gu, act = self._buffers(t)
        q = qkv[:, :s.hq * s.d].view(t, s.hq, s.d)
        assert dec.block_tables is not None and dec.context_lens is not None
        bound = dec.kernel.prepare(q, kv_caches[0], dec.block_tables, dec.context_lens,
                                   s.scale, attn, None, dec.window_starts)
        (_, rows, _, tables, lens, windows, b, _, _, _, bs, num_blocks, max_blocks,
         _) = bound.args
        x = torch.empty(t, s.hidden)
        cache = kv_caches[0]
        s.attention = cplan.fn_address(bound.fn)
        s.t, s.half = t, cos.shape[1]
        s.slots_per_head = cache.shape[2] * cache.shape[3]
        s.residual, s.x, s.qkv, s.attn = h.data_ptr(), x.data_ptr(), qkv.data_ptr(), \
            attn.data_ptr()
        s.y, s.gu, s.act = y.data_ptr(), gu.data_ptr(), act.data_ptr()
        s.cos, s.sin, s.slots = cos.data_ptr(), sin.data_ptr(), slots.data_ptr()
        s.rows, s.block_tables, s.context_lens, s.window_starts = rows, tables, lens, windows
        s.b, s.block_size, s.num_blocks, s.max_blocks = b, bs, num_blocks, max_blocks
        s.qthreads, s.fthreads = kernel_threads(), gemv.threads()
        code = self.lib.run(ctypes.byref(s), ctypes.byref(self._where))
        if code:
            raise cplan.PlanError(cplan.error_text(code, self._where.value))
        self.runs += 1
        return x
