"""What the decode plan (``decode_plan.DecodePlan``) reads of a model: each linear's weight as a
``PlanLinear`` (a quantized weight's segments or float32 rows) with the state a step re-checks,
and the decode lane's parts beyond the layers (the embedding table, rotary tables, LM head).
Each function returns what it found, or why the plan (or lane) cannot run it."""

from __future__ import annotations

import ctypes
from typing import Any

import torch

from aioengine.worker import gemv
from aioengine.worker.ops import plan as cplan


def describe(module: Any, out: cplan.PlanLinear) -> tuple[Any, ...] | str:
    """Fill ``out`` for ``module``; returns what to re-check per step (the weight and its
    recorded state), or why the plan cannot run it."""
    if getattr(module, "bias", None) is not None or module.tp.size != 1:
        return f"{type(module).__name__} with a bias or tensor parallelism"
    q = module.qweight
    if q is not None:
        return describe_weight(q, out)
    w = module.weight
    if gemv._kernel is None:
        return "the F32 GEMV is off"
    if w.dtype != torch.float32 or w.dim() != 2 or not w.is_contiguous():
        return f"a {w.dtype} {tuple(w.shape)} weight"
    out.kind, out.nseg, out.w = cplan.KIND_F32, 0, w.data_ptr()
    out.n, out.k = w.shape
    return (w, w.data_ptr())


def describe_weight(q: Any, out: cplan.PlanLinear) -> tuple[Any, ...] | str:
    """``describe`` for a ``QuantizedWeight``."""
    if q._plan is None or q._plan.policy is not q.policy:
        q.prepare()
    p = q._plan
    if p is None:
        return "a quantized weight with float rows"
    out.kind, out.nseg, out.w = cplan.KIND_SEGS, p.nseg, ctypes.addressof(p.segs)
    out.n, out.k = q.out_features, q.in_features
    return (q, p, p.policy)


def max_rows(state: tuple[Any, ...]) -> int:
    """The most rows ``state``'s module computes as the plan does: a quantized weight's plan
    below its sgemm threshold (any M when every segment is x8), the F32 GEMV up to its
    ``MAX_ROWS``."""
    if len(state) == 3:
        return 1 << 30 if state[1].any_m else state[2].sgemm_min_rows - 1
    return gemv.MAX_ROWS


def lane_caches(kv_caches: list[torch.Tensor], hkv: int, d: int) -> str | None:
    """Why the lane cannot write and read these caches, or None: every layer's one contiguous
    ``[2, hkv, num_blocks, block_size, d]`` float32 or float16 tensor (what the module path
    checks per step: the lane only compares the pointers, and the block size per step)."""
    shape, dtype = kv_caches[0].shape, kv_caches[0].dtype
    if len(shape) != 5 or shape[0] != 2 or shape[1] != hkv or shape[4] != d \
            or dtype not in (torch.float32, torch.float16):
        return (f"a {dtype} KV cache of shape {tuple(shape)}, not [2, {hkv}, blocks, "
                f"block_size, {d}] float32 or float16")
    if any(c.shape != shape or c.dtype != dtype or not c.is_contiguous() for c in kv_caches):
        return "KV caches of different shapes or dtypes"
    return None


def lane_parts(model: Any, qk: Any) -> dict[str, Any] | str:
    """What the decode lane reads of ``model`` beyond the layers (the embedding table, the
    rotary tables, the LM head), or why it cannot run it."""
    spec = model.spec
    if spec.sliding_window is not None or spec.window_layers:
        return "sliding-window attention"
    if spec.embed_scale is not None or spec.final_logit_softcapping is not None:
        return "an embedding scale or logit soft-capping"
    rotary = model.rotary
    if rotary.longrope or model.local_rotary is not None:
        return "longrope or a second rotary table"
    cos, sin = rotary.cos_cache, rotary.sin_cache
    if cos.dtype != torch.float32 or cos.dim() != 2 or not cos.is_contiguous() \
            or not sin.is_contiguous():
        return "rotary tables that are not contiguous float32"
    embed = model.embed_tokens
    head_module = embed if model.lm_head is None else model.lm_head
    if embed.tp.size != 1:
        return "tensor parallelism"
    head = cplan.PlanLinear()
    qhead = head_module.qhead
    if qhead is not None:
        head_state = describe_weight(qhead, head)
        if isinstance(head_state, str):
            return f"LM head: {head_state}"
    else:
        w = head_module.weight
        if gemv._kernel is None or w.dtype != torch.float32 or not w.is_contiguous():
            return "an LM head the F32 GEMV does not take"
        head.kind, head.nseg, head.w = cplan.KIND_F32, 0, w.data_ptr()
        head.n, head.k = w.shape
        head_state = (w, w.data_ptr())
    table = embed.weight
    if table is not None:
        if table.dtype != torch.float32 or not table.is_contiguous():
            return f"a {table.dtype} embedding table"
        rows = {"embed_rows": None, "embed_w": table.data_ptr(), "embed_n": table.shape[0],
                "embed_qtype": 0}
        table_state: tuple[Any, ...] = (table, table.data_ptr())
    else:  # looked up in the tied head's blocks (x8: one call, as the module does)
        segs = None if embed.qhead is None else embed.qhead.segments
        if embed.qhead is not qhead or segs is None or len(segs) != 1 or not segs[0].x8:
            return "an embedding table not in one x8 segment of the head"
        rows = {"embed_rows": cplan.fn_address(qk._lib.qk_rows_x8), "embed_w":
                segs[0].data.data_ptr(), "embed_n": segs[0].n,
                "embed_qtype": segs[0].qtype.ggml_id}
        table_state = ()  # the head's state covers its blocks
    return {"head": head, "head_state": head_state, "table_state": table_state,
            "rotary": rotary, "cos": cos, "sin": sin, "vocab": spec.vocab_size, **rows}


def current(state: tuple[Any, ...]) -> bool:
    if len(state) == 3:  # quantized: the same plan (layout) under the same policy
        q, p, policy = state
        return q._plan is p and q.policy is policy
    w, ptr = state
    return bool(w.data_ptr() == ptr)
