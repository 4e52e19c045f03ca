"""The CPU fast path's decode steps as one C call (``aioengine.worker.ops.plan``).

``DecodePlan.build`` records a model's layers once per KV cache (weight pointers, norm weights,
caches, read by ``plan_inputs``; None when a linear is one the plan does not run: a bias, tensor
parallelism, float rows inside a quantized weight, the F32 GEMV off); ``DecodePlan.run`` checks
a step's inputs in Python (the attention kernel's own checks, the activations' sizes) and makes
one ``plan_run`` call for every layer, or returns None when the step is not one it covers
(prefill or mixed steps, too many rows for the linears' decode kernels), leaving it to
``CpuLayerPath``'s loop (``aioengine.worker.cpu.layer_path``). Models that mix sliding-window
and full layers (two metadata, two rope tables) have no plan.

The decode lane (``DecodePlan.step_logits``) runs a whole decode step in that call: the
embedding rows, the rotary rows, the layers and the LM head, from the step's token ids,
positions and block tables (Python ints) to the logits, without the attention metadata, the
embedding and rotary modules or ``compute_logits``. At batch 1 the Python around the plan was a
noticeable share of a step, most of it cache misses: the kernels stream the whole model's
weights through every cache level each step, so the Python's data is evicted and it ran much
slower than when the kernels did not run (docs/benchmarks.md). Models with sliding windows,
longrope, an embedding scale or logit soft-capping, and heads or tables the lane cannot read,
keep the module path.
"""

from __future__ import annotations

import ctypes
import logging
from typing import Any

import torch

from aioengine.worker import gemv
from aioengine.worker.attention import AttentionMetadata
from aioengine.worker.cpu import plan_inputs
from aioengine.worker.cpu.kernels.build import KernelBuildError
from aioengine.worker.ops import CpuOps
from aioengine.worker.ops import plan as cplan
from aioengine.worker.quant.kernel import load_quant_kernel
from aioengine.worker.quant.weight import layout_epoch
from aioengine.worker.threads import kernel_threads

logger = logging.getLogger(__name__)


class DecodePlan:
    """One model's layers for ``plan_run``, valid for one set of KV cache tensors."""

    def __init__(self, lib: cplan.PlanLib, step: cplan.PlanStep, layers: Any,
                 states: list[tuple[Any, ...]], caches: tuple[int, ...],
                 cache_dtype: torch.dtype, max_rows: int, windowed: bool,
                 keep: tuple[Any, ...], lane: dict[str, Any] | str = "not built",
                 split: bool = True) -> None:
        self.lib = lib
        self.split = split  # each layer's attention split over the kernels' pool by kv head
        self.step = step
        self.layers = layers  # the ctypes array the step points at
        self.states = states
        self.caches = caches
        self.max_rows = max_rows
        self.windowed = windowed  # every layer attends with the step's windowed metadata
        self.runs = 0  # steps run (tests)
        self.cache_dtype = cache_dtype  # picked the rope_store function
        self.keep = keep
        self._scratch: tuple[torch.Tensor, ...] = ()  # for the most rows seen
        self._where = ctypes.c_int64(-1)
        self._op_ns: Any = None
        # the decode lane's parts, or why it has none (``step_logits``)
        self.lane = lane
        self.lane_reason = lane if isinstance(lane, str) else None
        self.lane_runs = 0  # steps run by the lane (tests)
        # its PlanStep per (attention kernel, cache dtype), and scratch for the most rows seen
        self._lane_steps: dict[tuple[int, torch.dtype], tuple[Any, Any]] = {}
        self._lane_bufs: tuple[torch.Tensor, ...] = ()
        self._lane_rows = 0
        self.epoch = layout_epoch()  # the quantized weights' layouts as recorded
        # float weights (a layer's, the lane's head or table: pointers, no epoch) every step
        self.checks_states = any(len(st) == 2 for st in (*states, *self._lane_states()))

    def _lane_states(self) -> tuple[tuple[Any, ...], ...]:
        lane = self.lane
        if not isinstance(lane, dict):
            return ()
        return tuple(st for st in (lane["head_state"], lane["table_state"]) if st)

    @classmethod
    def build(cls, model: Any, ops: CpuOps, kv_caches: list[torch.Tensor],
              split: bool = True) -> DecodePlan | str:
        """The plan for ``model``'s layers over ``kv_caches`` (``split``: each layer's
        attention split over the kernels' pool), or why there is none."""
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
                got = plan_inputs.describe(module, getattr(pl, name))
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
        max_rows = min(plan_inputs.max_rows(st) for st in states)
        f16 = kv_caches[0].dtype == torch.float16
        step = cplan.PlanStep()
        step.matmul_segs = cplan.fn_address(qk.raw_matmul_segs)
        step.gemv_f32 = cplan.fn_address(qk._lib.qk_gemv_f32)
        step.add_rms_norm = cplan.fn_address(ops.fn_add_rms_norm)
        step.rope_store = cplan.fn_address(ops.fn_rope_store_f16 if f16 else ops.fn_rope_store)
        step.silu_mul = cplan.fn_address(ops.fn_silu_mul)
        step.pool_run = cplan.fn_address(qk._lib.qk_pool_run)
        step.layers = ctypes.addressof(arr)
        step.nlayers, step.hidden, step.hq, step.hkv, step.d = len(arr), hidden, hq, hkv, d
        step.inter = inter
        step.final_w = model.norm.weight.data_ptr()
        step.eps, step.scale = float(model.spec.rms_norm_eps), float(attn0.scale)
        step.norm_offset = int(model.spec.norm_offset)
        # no reference to the caches: a step checks their pointers (caches freed and others
        # allocated at the same addresses are the same memory; their shapes are checked per step)
        keep = (qk, ops, model.norm.weight)
        no_lane = plan_inputs.lane_caches(kv_caches, hkv, d)
        lane = plan_inputs.lane_parts(model, qk) if no_lane is None else no_lane
        if isinstance(lane, dict):
            lane["max_rows"] = min(max_rows, plan_inputs.max_rows(lane["head_state"]))
        return cls(lib, step, arr, states, tuple(c.data_ptr() for c in kv_caches),
                   kv_caches[0].dtype, max_rows, all(windowed), keep, lane, split)

    def profile(self, on: bool = True) -> None:
        """Time every op of the steps that follow (``op_times``); off: no clock reads."""
        self._op_ns = (ctypes.c_int64 * len(cplan.OPS))() if on else None
        self.step.op_ns = ctypes.addressof(self._op_ns) if on else None

    def op_times(self) -> dict[str, float]:
        """Seconds spent per op (summed over layers and steps) since ``profile``."""
        if self._op_ns is None:
            raise RuntimeError("op_times() without profile(): no op was timed")
        return {name: ns / 1e9 for name, ns in zip(cplan.OPS, self._op_ns, strict=True)}

    def current(self, kv_caches: list[torch.Tensor]) -> bool:
        """Still valid: the same caches, every weight as recorded (checked one by one only
        when a quantized weight's layout changed since, or where weights are float)."""
        if len(kv_caches) != len(self.caches) or kv_caches[0].dtype != self.cache_dtype \
                or tuple(map(torch.Tensor.data_ptr, kv_caches)) != self.caches:
            return False
        epoch = layout_epoch()
        if epoch == self.epoch and not self.checks_states:
            return True
        if not all(plan_inputs.current(s) for s in (*self.states, *self._lane_states())):
            return False
        self.epoch = epoch
        return True

    def _buffers(self, t: int) -> tuple[torch.Tensor, ...]:
        """``run``'s scratch for ``t`` rows: the first rows of one set sized for the most rows
        seen (one set per batch size grew with every size a server's batches took)."""
        if not self._scratch or self._scratch[0].shape[0] < t:
            s = self.step
            width = (s.hq + 2 * s.hkv) * s.d
            self._scratch = (torch.empty(t, width), torch.empty(t, s.hq, s.d),
                             torch.empty(t, s.hidden), torch.empty(t, 2 * s.inter),
                             torch.empty(t, s.inter))
        return tuple(b[:t] for b in self._scratch)

    def _lane_step(self, t: int, kernel: Any, cache: torch.Tensor) -> tuple[Any, torch.Tensor]:
        """The lane's ``PlanStep`` for this attention kernel and cache dtype (a copy of the
        plan's with what does not change from step to step filled in once) pointing at scratch
        for ``t`` rows, and the argmax row buffer. The scratch is sized for the most rows seen
        (the C reads rows at fixed strides: the first ``t`` rows of a larger buffer are a ``[t,
        ...]`` one), so a batch size that drifts keeps one set."""
        lane = self.lane
        assert isinstance(lane, dict)
        key = (id(kernel), cache.dtype)  # the entry holds the kernel: its id stays its own
        got = self._lane_steps.get(key)
        s = None if got is None else got[0]
        if s is None:
            s = cplan.PlanStep.from_buffer_copy(self.step)
            f16 = cache.dtype == torch.float16
            s.attention = cplan.fn_address(kernel.fn_for(cache))
            s.attention_heads = cplan.fn_address(kernel.heads_fn16 if f16
                                                 else kernel.heads_fn) \
                if self.split else None
            s.half = lane["cos"].shape[1]
            s.rows = s.window_starts = None
            s.embed_rows, s.embed_w, s.embed_n = lane["embed_rows"], lane["embed_w"], \
                lane["embed_n"]
            s.embed_qtype = lane["embed_qtype"]
            s.cos_table, s.sin_table = lane["cos"].data_ptr(), lane["sin"].data_ptr()
            s.table_rows = lane["cos"].shape[0]
            s.head, s.vocab = lane["head"], lane["vocab"]
            self._lane_steps[key] = (s, kernel)
            self._lane_rows = 0  # point the new step at the scratch below
        if t > self._lane_rows:
            half, st = lane["cos"].shape[1], self.step
            self._lane_bufs = (torch.empty(t, (st.hq + 2 * st.hkv) * st.d),
                               torch.empty(t, st.hq, st.d), torch.empty(t, st.hidden),
                               torch.empty(t, 2 * st.inter), torch.empty(t, st.inter),
                               torch.empty(t, st.hidden), torch.empty(t, st.hidden),
                               torch.empty(t, half), torch.empty(t, half),
                               torch.empty(t, dtype=torch.long))
            self._lane_rows = t
            qkv, attn, y, gu, act, residual, x, cos, sin, _ = self._lane_bufs
            for step, _ in self._lane_steps.values():
                step.residual, step.x, step.qkv, step.attn = residual.data_ptr(), \
                    x.data_ptr(), qkv.data_ptr(), attn.data_ptr()
                step.y, step.gu, step.act = y.data_ptr(), gu.data_ptr(), act.data_ptr()
                step.cos, step.sin = cos.data_ptr(), sin.data_ptr()
        return s, self._lane_bufs[-1]

    def step_logits(self, ids: list[int], chunks: list[tuple[int, int, list[int]]],
                    block_size: int, kernel: Any, kv_caches: list[torch.Tensor],
                    greedy: bool = False) -> tuple[torch.Tensor, list[int] | None] | None:
        """The decode lane: float32 logits ``[T, vocab]`` of a step of ``T`` decodes (token
        ``ids[i]`` at position ``chunks[i][0]`` of a sequence whose blocks are
        ``chunks[i][2]``, each chunk ``(start_pos, 1, block_table)``) over ``kv_caches``
        (which the plan must be ``current`` for), the module path's numbers in one C call, and
        with ``greedy`` each row's argmax (the first largest, as numpy's; else None); None
        when the lane does not take the step (no lane for this model, a chunk of other than
        one token, more rows than its linears' decode kernels take, another block size, a
        negative position or block id, a block table too short: the module path runs it and
        says what is wrong)."""
        lane = self.lane
        t = len(ids)
        cache = kv_caches[0]
        if not isinstance(lane, dict) or t > lane["max_rows"] or kernel is None \
                or len(chunks) != t or cache.shape[3] != block_size \
                or lane["rotary"].cos_cache is not lane["cos"] \
                or lane["rotary"].sin_cache is not lane["sin"]:
            return None
        starts = []
        tables = []
        max_blocks = 1
        for start, num, table in chunks:
            needed = start // block_size + 1
            if num != 1 or start < 0 or len(table) < needed:
                return None
            starts.append(start)
            tables.append(table[:needed])
            max_blocks = max(max_blocks, needed)
        flat: list[int] = []
        for table in tables:
            flat += table
            flat += [0] * (max_blocks - len(table))
        if min(flat) < 0:
            return None
        slots = [tb[p // block_size] * block_size + p % block_size
                 for p, tb in zip(starts, tables, strict=True)]
        ints = torch.tensor(ids + starts + slots + [p + 1 for p in starts] + flat,
                            dtype=torch.long)
        base = ints.data_ptr()
        s, argmax = self._lane_step(t, kernel, cache)
        logits = torch.empty(t, lane["head"].n)
        s.t = s.b = t
        s.ids, s.positions, s.slots = base, base + 8 * t, base + 16 * t
        s.context_lens, s.block_tables = base + 24 * t, base + 32 * t
        s.slots_per_head, s.num_blocks = cache.shape[2] * cache.shape[3], cache.shape[2]
        s.max_blocks, s.block_size = max_blocks, block_size
        s.logits, s.argmax = logits.data_ptr(), argmax.data_ptr() if greedy else None
        s.qthreads, s.fthreads = kernel_threads(), gemv.threads()
        s.op_ns = self.step.op_ns
        code = self.lib.run(ctypes.byref(s), ctypes.byref(self._where))
        if code:
            raise cplan.PlanError(cplan.error_text(code, self._where.value))
        self.lane_runs += 1
        vocab = lane["vocab"]
        tokens = argmax[:t].tolist() if greedy else None
        return (logits if logits.shape[1] == vocab else logits[:, :vocab]), tokens

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
        s.attention_heads = cplan.fn_address(
            dec.kernel.heads_fn16 if cache.dtype == torch.float16 else dec.kernel.heads_fn) \
            if self.split else None
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
