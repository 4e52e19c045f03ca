"""The decoder's forward on CPU float32 with the work between the linears in compiled ops.

At batch 1 the linears are most of a step, but the rest was a large share (docs/benchmarks.md):
torch's RMSNorm (a composite of six ops, twice a layer), rope, the KV write, SiLU, the attention
kernel's per-call checks and the Python of ~10 module calls per layer, each a few dispatches
over a few KB. Here each layer is its four linears plus four C calls (``aioengine.worker.ops``):

    add+RMSNorm -> qkv -> rope+KV write -> attention -> o_proj -> add+RMSNorm -> gate_up
    -> SiLU*up -> down -> (next layer's) add+RMSNorm

with the residual stream updated in place, the attention kernel's arguments checked once per
step (``PagedDecodeKernel.bind``), and each layer's modules looked up once. Models it does not
cover (q/k norms, Gemma's sandwich norms and GELU, MoE layers) and other devices and dtypes
keep the module path. Whether a model takes this path, the decode plan and the lane is the
CPU backend's decision (``aioengine.worker.cpu.backend``), made once at load.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

import torch
from torch import nn

from aioengine.worker.attention import AttentionMetadata, paged_attention
from aioengine.worker.cpu.decode_plan import DecodePlan
from aioengine.worker.models.layers import RMSNorm
from aioengine.worker.models.spec import ModelSpec
from aioengine.worker.ops import CpuOps

logger = logging.getLogger(__name__)


class DecoderModel(Protocol):
    """What this path reads of the model (``decoder.CausalLM``)."""

    spec: ModelSpec
    device: torch.device
    dtype: torch.dtype
    layers: nn.ModuleList
    norm: RMSNorm


def uncovered(model: DecoderModel) -> str | None:
    """None when this path can run ``model``, else why not."""
    spec = model.spec
    if model.device.type != "cpu" or model.dtype != torch.float32:
        return f"model on {model.device} in {model.dtype}"
    if spec.qk_norm or spec.sandwich_norms or spec.moe_layers:
        return "q/k norms, sandwich norms or MoE layers"
    if spec.hidden_act != "silu":
        return f"activation {spec.hidden_act}"
    if spec.nope_layers:
        return "NoPE layers (no rotary embedding)"
    return None


def _linear(module: Any) -> Any:
    """The call that computes ``module(x)``: a quantized weight's own forward when the layer
    adds nothing to it (no bias, one rank: no all-reduce; float32 out), else the module's."""
    q = getattr(module, "qweight", None)
    if q is not None and module.bias is None and module.tp.size == 1:
        return q.forward
    return module.forward


class _Layer:
    __slots__ = ("down", "gate_up", "in_w", "o", "post_w", "qkv", "windowed")

    def __init__(self, layer: Any) -> None:
        attn, mlp = layer.self_attn, layer.mlp
        self.qkv = _linear(attn.qkv_proj)
        self.o = _linear(attn.o_proj)
        self.gate_up = _linear(mlp.gate_up_proj)
        self.down = _linear(mlp.down_proj)
        self.in_w = layer.input_layernorm.weight.data_ptr()
        self.post_w = layer.post_attention_layernorm.weight.data_ptr()
        self.windowed = layer.windowed


class CpuLayerPath:
    """A model's forward through the compiled layer ops; with ``plan`` its decode steps in
    the decode plan's one call (``split``: attention split over the kernels' pool), with
    ``lane`` also the embedding, rotary rows and LM head (``decode_logits``). The flags are
    the backend's decision; tests flip ``plan`` to compare the plan with the loop."""

    def __init__(self, model: DecoderModel, ops: CpuOps, *, plan: bool = True,
                 split: bool = True, lane: bool = True) -> None:
        self.model = model
        self.ops = ops
        self.plan = plan
        self.split = split
        self.lane = lane
        self._layers: list[_Layer] | None = None
        # the decode plan, or why there is none for which caches
        self._plan: DecodePlan | tuple[str, tuple[int, ...]] | None = None

    def _prepare(self) -> list[_Layer]:
        """Per-layer bound methods and weight pointers, taken after loading (the loader fills
        the parameters in place, so the pointers stay valid)."""
        if self._layers is None:
            self._layers = [_Layer(layer) for layer in self.model.layers]
        return self._layers

    def forward(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                local: tuple[torch.Tensor, torch.Tensor], meta: AttentionMetadata,
                windowed: AttentionMetadata | None,
                kv_caches: list[torch.Tensor]) -> torch.Tensor:
        """``h`` ``[T, H]`` embeddings (owned: it becomes the residual stream), cos/sin
        ``[T, 1, R/2]`` -> final-normed hidden ``[T, H]``."""
        model, ops = self.model, self.ops
        layers = self._prepare()
        attn0 = model.layers[0].self_attn
        hq, hkv, d, scale = attn0.num_heads, attn0.num_kv_heads, attn0.head_dim, attn0.scale
        spec = model.spec
        t, hidden = h.shape
        eps, offset = float(spec.rms_norm_eps), int(spec.norm_offset)
        width = (hq + 2 * hkv) * d
        cache_shape = kv_caches[0].shape
        cache_dtype = kv_caches[0].dtype
        for c in kv_caches:
            if c.shape != cache_shape or not c.is_contiguous() or c.dtype != cache_dtype \
                    or cache_dtype not in (torch.float32, torch.float16):
                raise ValueError(f"every layer's KV cache must be a contiguous float32 (or "
                                 f"float16) {tuple(cache_shape)} tensor of one dtype, got "
                                 f"{c.dtype} {tuple(c.shape)}")
        if h.dtype != torch.float32 or not h.is_contiguous():
            h = h.float().contiguous()
        half = cos.shape[-1]
        if 2 * half > d:
            raise ValueError(f"rotary dims {2 * half} exceed head_dim {d}")
        tables = [(cos.reshape(t, half).contiguous(), sin.reshape(t, half).contiguous())]
        if local[0] is not cos:
            tables.append((local[0].reshape(t, half).contiguous(),
                           local[1].reshape(t, half).contiguous()))
        slots = meta.slot_mapping
        if slots.dtype != torch.int64 or slots.shape != (t,) or not slots.is_contiguous():
            raise ValueError(f"slot_mapping must be a contiguous int64 [{t}], got "
                             f"{slots.dtype} {tuple(slots.shape)}")
        plan = self._decode_plan(kv_caches) if len(tables) == 1 else None
        if plan is not None:
            out = plan.run(h, *tables[0], meta, windowed, kv_caches)
            if out is not None:
                return out
        slots_ptr = slots.data_ptr()
        slots_per_head = cache_shape[2] * cache_shape[3]
        norm, silu = ops.fn_add_rms_norm, ops.fn_silu_mul
        rope = ops.fn_rope_store_f16 if cache_dtype == torch.float16 else ops.fn_rope_store
        bound: dict[int, Any] = {}

        residual = h
        x = torch.empty(t, hidden)
        x_ptr = x.data_ptr()
        act: torch.Tensor | None = None
        code = norm(h.data_ptr(), hidden, None, hidden, layers[0].in_w, x_ptr, hidden, t,
                    hidden, eps, offset, 0)
        for i, (layer, cache) in enumerate(zip(layers, kv_caches, strict=True)):
            lmeta = windowed if layer.windowed and windowed is not None else meta
            c, s = tables[-1] if layer.windowed and len(tables) > 1 else tables[0]
            qkv = layer.qkv(x)
            if qkv.shape != (t, width) or not qkv.is_contiguous():
                raise ValueError(f"layer {i}: qkv output {tuple(qkv.shape)} is not a "
                                 f"contiguous [{t}, {width}]")
            code |= rope(qkv.data_ptr(), width, t, hq, hkv, d, c.data_ptr(), s.data_ptr(),
                         half, cache.data_ptr(), slots_per_head, slots_ptr)
            if code:
                raise ValueError(f"layer {i}: rope/KV write rejected its inputs (code {code}: "
                                 f"a slot outside the cache of {slots_per_head} slots per head, "
                                 "or bad sizes)")
            q = qkv[:, :hq * d].view(t, hq, d)
            out = self._attend(q, qkv, cache, lmeta, scale, bound, hq, hkv, d)
            o = layer.o(out.view(t, hq * d))
            code |= norm(o.data_ptr(), hidden, residual.data_ptr(), hidden, layer.post_w, x_ptr,
                         hidden, t, hidden, eps, offset, 1)
            gu = layer.gate_up(x)
            inter = gu.shape[1] // 2
            if act is None or act.shape[1] != inter:
                act = torch.empty(t, inter)
            code |= silu(gu.data_ptr(), 2 * inter, act.data_ptr(), inter, t, inter)
            dn = layer.down(act)
            next_w = layers[i + 1].in_w if i + 1 < len(layers) else model.norm.weight.data_ptr()
            code |= norm(dn.data_ptr(), hidden, residual.data_ptr(), hidden, next_w, x_ptr,
                         hidden, t, hidden, eps, offset, 1)
            if code:
                raise ValueError(f"layer {i}: a CPU layer op rejected its inputs (code {code}:"
                                 " bad sizes)")
        return x

    def decode_logits(self, ids: list[int], chunks: list[tuple[int, int, list[int]]],
                      block_size: int, kernel: Any, kv_caches: list[torch.Tensor],
                      greedy: bool = False) -> tuple[torch.Tensor, list[int] | None] | None:
        """A decode step from token ids to logits (and with ``greedy`` their argmax) in the
        plan's one call (``DecodePlan.step_logits``), or None: the module path runs it (the
        lane off, no plan or lane for this model, a step the lane does not take)."""
        if not self.lane:
            return None
        plan = self._decode_plan(kv_caches)
        if plan is None:
            return None
        return plan.step_logits(ids, chunks, block_size, kernel, kv_caches, greedy)

    def _decode_plan(self, kv_caches: list[torch.Tensor]) -> DecodePlan | None:
        """The model's decode plan over these caches (built on first use, rebuilt when the
        caches or a weight's layout change), or None (the plan off, or the model has none: the
        reason is logged once per set of caches)."""
        if not self.plan:
            return None
        plan = self._plan
        if isinstance(plan, DecodePlan):
            if plan.current(kv_caches):
                return plan
        elif plan is not None and plan[1] == tuple(c.data_ptr() for c in kv_caches):
            return None
        built = DecodePlan.build(self.model, self.ops, kv_caches, split=self.split)
        if isinstance(built, str):
            logger.debug("CPU decode plan off: %s", built)
            self._plan = (built, tuple(c.data_ptr() for c in kv_caches))
            return None
        self._plan = built
        return built

    @staticmethod
    def _attend(q: torch.Tensor, qkv: torch.Tensor, cache: torch.Tensor,
                meta: AttentionMetadata, scale: float, bound: dict[int, Any], hq: int,
                hkv: int, d: int) -> torch.Tensor:
        t = q.shape[0]
        dec = meta.decode
        if dec is not None and dec.kernel is not None and dec.token_index is None \
                and not meta.prefills:
            out = torch.empty(t, hq, d)
            call = bound.get(id(meta))
            if call is None:  # first layer of the step on this metadata: checked call
                assert dec.block_tables is not None and dec.context_lens is not None
                bound[id(meta)] = dec.kernel.bind(q, cache, dec.block_tables,
                                                  dec.context_lens, scale, out, None,
                                                  dec.window_starts)
            else:
                call(q.data_ptr(), cache.data_ptr(), out.data_ptr())
            return out
        k = qkv[:, hq * d:(hq + hkv) * d].view(t, hkv, d)
        v = qkv[:, (hq + hkv) * d:].view(t, hkv, d)
        return paged_attention(q, k, v, cache, meta, scale, write=False)
