"""One decoder implementation for the Llama, Qwen2 and Qwen3 families (differences are flags
in ``ModelSpec``): fused QKV and gate/up GEMMs, paged attention, tensor-parallel layers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import nn

from aioengine.worker.attention import AttentionMetadata, paged_attention
from aioengine.worker.models.layers import RMSNorm, gelu_tanh_and_mul, silu_and_mul
from aioengine.worker.models.moe import DOWN, GATE, UP, SparseMoE
from aioengine.worker.models.rope import RotaryEmbedding, apply_rope
from aioengine.worker.models.spec import ModelSpec
from aioengine.worker.parallel import (
    MergedColumnParallelLinear,
    ParallelLMHead,
    QKVParallelLinear,
    RowParallelLinear,
    TPInfo,
    VocabParallelEmbedding,
)
from aioengine.worker.parallel.distributed import check_distributed
from aioengine.worker.parallel.embedding import lm_logits


class FastPath(Protocol):
    """Another way to run ``CausalLM.forward`` and its decode steps, installed by the worker's
    CPU backend (``aioengine.worker.cpu.backend``): the model keeps the math, the backend
    decides how it executes."""

    def forward(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                local: tuple[torch.Tensor, torch.Tensor], meta: AttentionMetadata,
                windowed: AttentionMetadata | None,
                kv_caches: list[torch.Tensor]) -> torch.Tensor: ...

    def decode_logits(self, ids: list[int], chunks: list[tuple[int, int, list[int]]],
                      block_size: int, kernel: Any, kv_caches: list[torch.Tensor],
                      greedy: bool = False) -> tuple[torch.Tensor, list[int] | None] | None: ...


class Loadable(Protocol):
    def full_shape(self, part: int, is_bias: bool) -> tuple[int, ...]: ...
    def load(self, src: Any, part: int, is_bias: bool) -> None: ...


@dataclass(frozen=True)
class WeightTarget:
    """Where one checkpoint tensor goes: part ``part`` of ``module``'s weight (or bias)."""

    module: Loadable
    part: int = 0
    is_bias: bool = False
    # A checkpoint tensor holding several parts one after another (Phi-3's qkv_proj and
    # gate_up_proj): these parts, loaded from consecutive row ranges.
    fused: tuple[int, ...] = ()

    @property
    def full_shape(self) -> tuple[int, ...]:
        if self.fused:
            shapes = [self.module.full_shape(p, self.is_bias) for p in self.fused]
            return (sum(s[0] for s in shapes), *shapes[0][1:])
        return self.module.full_shape(self.part, self.is_bias)

    @property
    def is_norm(self) -> bool:
        return isinstance(self.module, RMSNorm)

    def load(self, src: Any) -> None:
        offset = 0
        for part in self.fused:
            rows = self.module.full_shape(part, self.is_bias)[0]
            self.module.load(_Rows(src, offset, rows), part, self.is_bias)
            offset += rows
        if not self.fused:
            self.module.load(src, self.part, self.is_bias)


class _Rows:
    """Rows ``[offset, offset + rows)`` of a source, sliced lazily (only what a rank needs is
    read from a safetensors file)."""

    def __init__(self, src: Any, offset: int, rows: int) -> None:
        self.src, self.offset, self.rows = src, offset, rows

    def get_shape(self) -> list[int]:
        shape = list(self.src.shape if isinstance(self.src, torch.Tensor)
                     else self.src.get_shape())
        return [self.rows, *shape[1:]]

    def note_kept(self, *args: Any) -> None:
        """Forwarded to the source (a GGUF tensor's start-up log entry), where it has one."""
        note = getattr(self.src, "note_kept", None)
        if note is not None:
            note(*args)

    def __getitem__(self, key: Any) -> Any:
        first, rest = (key[0], key[1:]) if isinstance(key, tuple) else (key, ())
        if not isinstance(first, slice) or first.step not in (None, 1):
            raise TypeError(f"fused rows take a plain row slice, got {key!r}")
        start, stop, _ = first.indices(self.rows)
        return self.src[(slice(self.offset + start, self.offset + stop), *rest)]


class Attention(nn.Module):
    def __init__(self, spec: ModelSpec, tp: TPInfo, dtype: torch.dtype,
                 device: torch.device | str, rope: bool = True) -> None:
        super().__init__()
        self.rope = rope  # False: a NoPE layer (SmolLM3), q and k are not rotated
        d = spec.head_dim
        self.qkv_proj = QKVParallelLinear(spec.hidden_size, d, spec.num_heads, spec.num_kv_heads,
                                          spec.qkv_bias, tp, dtype, device)
        self.o_proj = RowParallelLinear(spec.num_heads * d, spec.hidden_size, spec.o_bias, tp,
                                        dtype, device, "num_attention_heads * head_dim")
        self.num_heads = self.qkv_proj.num_heads
        self.num_kv_heads = self.qkv_proj.num_kv_heads
        self.head_dim = d
        self.scale = spec.attn_scale or d ** -0.5
        eps, offset = spec.rms_norm_eps, spec.norm_offset
        self.q_norm = RMSNorm(d, eps, dtype, device, offset) if spec.qk_norm else None
        self.k_norm = RMSNorm(d, eps, dtype, device, offset) if spec.qk_norm else None

    def forward(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                meta: AttentionMetadata, kv_cache: torch.Tensor) -> torch.Tensor:
        t, d, hq, hkv = h.shape[0], self.head_dim, self.num_heads, self.num_kv_heads
        qkv = self.qkv_proj(h)
        v = qkv[:, (hq + hkv) * d:].view(t, hkv, d)
        if not self.rope:
            q = qkv[:, :hq * d].view(t, hq, d)
            k = qkv[:, hq * d:(hq + hkv) * d].view(t, hkv, d)
        elif self.q_norm is not None and self.k_norm is not None:
            q = apply_rope(self.q_norm(qkv[:, :hq * d].view(t, hq, d)), cos, sin)
            k = apply_rope(self.k_norm(qkv[:, hq * d:(hq + hkv) * d].view(t, hkv, d)), cos, sin)
        else:  # q and k are adjacent in the fused output: rotate both in one go
            qk = apply_rope(qkv[:, :(hq + hkv) * d].view(t, hq + hkv, d), cos, sin)
            q, k = qk[:, :hq], qk[:, hq:]
        out = paged_attention(q, k, v, kv_cache, meta, self.scale)
        return self.o_proj(out.reshape(t, hq * d))


class MLP(nn.Module):
    def __init__(self, spec: ModelSpec, tp: TPInfo, dtype: torch.dtype,
                 device: torch.device | str) -> None:
        super().__init__()
        size = spec.intermediate_size
        self.gate_up_proj = MergedColumnParallelLinear(
            spec.hidden_size, [size, size], spec.mlp_bias, tp, dtype, device,
            ["intermediate_size", "intermediate_size"])
        self.down_proj = RowParallelLinear(size, spec.hidden_size, spec.mlp_bias, tp, dtype,
                                           device, "intermediate_size")
        self.act = gelu_tanh_and_mul if spec.hidden_act == "gelu_pytorch_tanh" else silu_and_mul

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_up_proj(h)))


class DecoderLayer(nn.Module):
    def __init__(self, spec: ModelSpec, tp: TPInfo, dtype: torch.dtype,
                 device: torch.device | str, index: int) -> None:
        super().__init__()

        def norm() -> RMSNorm:
            return RMSNorm(spec.hidden_size, spec.rms_norm_eps, dtype, device, spec.norm_offset)

        self.input_layernorm = norm()
        self.self_attn = Attention(spec, tp, dtype, device, index not in spec.nope_layers)
        self.post_attention_layernorm = norm()
        # Gemma 3: post_attention_layernorm normalises the attention output; these two wrap
        # the MLP.
        self.pre_feedforward_layernorm = norm() if spec.sandwich_norms else None
        self.post_feedforward_layernorm = norm() if spec.sandwich_norms else None
        self.windowed = index in spec.window_layers  # attends with meta.windowed
        self.mlp: MLP | SparseMoE = MLP(spec, tp, dtype, device)
        if index in spec.moe_layers:
            self.mlp = SparseMoE(spec.hidden_size, spec.moe_intermediate_size, spec.num_experts,
                                 spec.num_experts_per_tok, spec.norm_topk_prob, tp, dtype,
                                 device)

    def forward(self, h: torch.Tensor, residual: torch.Tensor | None, cos: torch.Tensor,
                sin: torch.Tensor, meta: AttentionMetadata,
                kv_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h, residual = self.input_layernorm.add_forward(h, residual)
        h = self.self_attn(h, cos, sin, meta, kv_cache)
        if self.pre_feedforward_layernorm is not None and \
                self.post_feedforward_layernorm is not None:
            h = self.post_attention_layernorm(h)
            h, residual = self.pre_feedforward_layernorm.add_forward(h, residual)
            return self.post_feedforward_layernorm(self.mlp(h)), residual
        h, residual = self.post_attention_layernorm.add_forward(h, residual)
        return self.mlp(h), residual


class CausalLM(nn.Module):
    """``forward(input_ids[T], positions[T], meta, kv_caches) -> hidden[T, H]``;
    ``compute_logits(hidden[N, H]) -> float32 [N, vocab]`` (full vocab on every rank)."""

    def __init__(self, spec: ModelSpec, tp: TPInfo, dtype: torch.dtype,
                 device: torch.device | str) -> None:
        super().__init__()
        spec.check_tp(tp.size)
        check_distributed(tp)
        self.spec = spec
        self.tp = tp
        self.dtype = dtype
        self.device = torch.device(device)
        self.embed_tokens = VocabParallelEmbedding(spec.vocab_size, spec.hidden_size, tp, dtype,
                                                   device)
        self.layers = nn.ModuleList(DecoderLayer(spec, tp, dtype, device, i)
                                    for i in range(spec.num_layers))
        self.norm = RMSNorm(spec.hidden_size, spec.rms_norm_eps, dtype, device, spec.norm_offset)
        self.lm_head = None if spec.tie_word_embeddings else ParallelLMHead(
            spec.vocab_size, spec.hidden_size, tp, dtype, device)
        self.rotary = RotaryEmbedding(spec.rope, spec.head_dim, spec.max_position_embeddings,
                                      dtype, device)
        # Gemma 3: windowed (local) layers rotate with their own base.
        self.local_rotary = None if spec.local_rope is None else RotaryEmbedding(
            spec.local_rope, spec.head_dim, spec.max_position_embeddings, dtype, device)
        # None: the modules below run the forward; else what the CPU backend installed
        self.cpu_path: FastPath | None = None

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                attn_metadata: AttentionMetadata,
                kv_caches: list[torch.Tensor]) -> torch.Tensor:
        if len(kv_caches) != len(self.layers):
            raise ValueError(f"expected {len(self.layers)} KV cache tensors (one per layer), "
                             f"got {len(kv_caches)}")
        heads = self.layers[0].self_attn.num_kv_heads
        if kv_caches[0].dim() != 5 or kv_caches[0].shape[1] != heads:
            raise ValueError(f"KV cache of shape {tuple(kv_caches[0].shape)} does not fit this "
                             f"rank's {heads} kv heads: allocate it with tp_size="
                             f"{self.tp.size}")
        h = self.embed_tokens(input_ids)
        if self.spec.embed_scale is not None:  # in the model dtype, as transformers does
            h = h * torch.tensor(self.spec.embed_scale, dtype=h.dtype)
        cos, sin = self.rotary.cos_sin(positions, attn_metadata)
        local = cos, sin
        if self.local_rotary is not None:
            local = self.local_rotary.cos_sin(positions, attn_metadata)
        windowed = attn_metadata.windowed
        if windowed is None and self.spec.window_layers:
            raise ValueError(f"this model has sliding-window layers (window "
                             f"{self.spec.sliding_window}): build the attention metadata with "
                             f"sliding_window={self.spec.sliding_window}")
        if self.cpu_path is not None:
            return self.cpu_path.forward(h, cos, sin, local, attn_metadata, windowed, kv_caches)
        residual: torch.Tensor | None = None
        for layer, cache in zip(self.layers, kv_caches, strict=True):
            if layer.windowed and windowed is not None:
                h, residual = layer(h, residual, *local, windowed, cache)
            else:
                h, residual = layer(h, residual, cos, sin, attn_metadata, cache)
        h, _ = self.norm.add_forward(h, residual)
        return h

    def decode_logits(self, input_ids: list[int], chunks: list[tuple[int, int, list[int]]],
                      block_size: int, kernel: Any, kv_caches: list[torch.Tensor],
                      greedy: bool = False) -> tuple[torch.Tensor, list[int] | None] | None:
        """``compute_logits(forward(...))`` of a step of decodes (chunk ``(start_pos, 1,
        block_table)`` per token of ``input_ids``), and with ``greedy`` each row's argmax, by
        the CPU path's decode lane: the same numbers in one compiled call. None where it does
        not run (other devices and dtypes, models and steps it does not take): build the
        metadata and call ``forward``."""
        if self.cpu_path is None:
            return None
        return self.cpu_path.decode_logits(input_ids, chunks, block_size, kernel, kv_caches,
                                           greedy)

    @torch.inference_mode()
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        head = self.embed_tokens if self.lm_head is None else self.lm_head
        logits = lm_logits(hidden, head.weight, self.tp, self.spec.vocab_size, head.qhead)
        cap = self.spec.final_logit_softcapping
        return logits if cap is None else torch.tanh(logits / cap) * cap

    def weight_targets(self) -> dict[str, WeightTarget]:
        """Hugging Face checkpoint name -> where it is loaded (q/k/v and gate/up fused)."""
        spec = self.spec
        targets = {"model.embed_tokens.weight": WeightTarget(self.embed_tokens),
                   "model.norm.weight": WeightTarget(self.norm)}
        if self.lm_head is not None:
            targets["lm_head.weight"] = WeightTarget(self.lm_head)
        for i, layer in enumerate(self.layers):
            pre = f"model.layers.{i}."
            attn, mlp = layer.self_attn, layer.mlp
            targets[pre + "input_layernorm.weight"] = WeightTarget(layer.input_layernorm)
            targets[pre + "post_attention_layernorm.weight"] = WeightTarget(
                layer.post_attention_layernorm)
            for name in ("pre_feedforward_layernorm", "post_feedforward_layernorm"):
                if getattr(layer, name) is not None:
                    targets[f"{pre}{name}.weight"] = WeightTarget(getattr(layer, name))
            if spec.family == "phi3":  # fused in the checkpoint too, no biases
                targets[pre + "self_attn.qkv_proj.weight"] = WeightTarget(
                    attn.qkv_proj, fused=(0, 1, 2))
                targets[pre + "self_attn.o_proj.weight"] = WeightTarget(attn.o_proj)
                targets[pre + "mlp.gate_up_proj.weight"] = WeightTarget(
                    mlp.gate_up_proj, fused=(0, 1))
                targets[pre + "mlp.down_proj.weight"] = WeightTarget(mlp.down_proj)
                continue
            for part, name in enumerate(("q_proj", "k_proj", "v_proj")):
                targets[f"{pre}self_attn.{name}.weight"] = WeightTarget(attn.qkv_proj, part)
                if spec.qkv_bias:
                    targets[f"{pre}self_attn.{name}.bias"] = WeightTarget(attn.qkv_proj, part,
                                                                          True)
            targets[pre + "self_attn.o_proj.weight"] = WeightTarget(attn.o_proj)
            if spec.o_bias:
                targets[pre + "self_attn.o_proj.bias"] = WeightTarget(attn.o_proj, 0, True)
            if attn.q_norm is not None and attn.k_norm is not None:
                targets[pre + "self_attn.q_norm.weight"] = WeightTarget(attn.q_norm)
                targets[pre + "self_attn.k_norm.weight"] = WeightTarget(attn.k_norm)
            if isinstance(mlp, SparseMoE):
                targets.update(_expert_targets(pre, mlp, spec.family))
                continue
            for part, name in enumerate(("gate_proj", "up_proj")):
                targets[f"{pre}mlp.{name}.weight"] = WeightTarget(mlp.gate_up_proj, part)
                if spec.mlp_bias:
                    targets[f"{pre}mlp.{name}.bias"] = WeightTarget(mlp.gate_up_proj, part, True)
            targets[pre + "mlp.down_proj.weight"] = WeightTarget(mlp.down_proj)
            if spec.mlp_bias:
                targets[pre + "mlp.down_proj.bias"] = WeightTarget(mlp.down_proj, 0, True)
        return targets

    def ignores_weight(self, name: str) -> bool:
        """Checkpoint tensors that are legitimately not loaded."""
        if name.endswith("rotary_emb.inv_freq"):  # old checkpoints saved the RoPE buffer
            return True
        return name == "lm_head.weight" and self.lm_head is None  # tied: same as embeddings


def _expert_targets(pre: str, moe: SparseMoE, family: str) -> dict[str, WeightTarget]:
    if family == "mixtral":
        pre, names = pre + "block_sparse_moe.", {GATE: "w1", UP: "w3", DOWN: "w2"}
    else:
        pre, names = pre + "mlp.", {GATE: "gate_proj", UP: "up_proj", DOWN: "down_proj"}
    targets = {pre + "gate.weight": WeightTarget(moe.gate)}
    for e in range(moe.num_experts):
        for which, name in names.items():
            targets[f"{pre}experts.{e}.{name}.weight"] = WeightTarget(moe, e * 3 + which)
    return targets
