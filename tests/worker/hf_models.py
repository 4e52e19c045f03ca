"""Small random Hugging Face models saved to disk (safetensors), one per supported variant,
and a scheduler-like driver that runs our model over mixed prefill/decode steps."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config, Qwen3Config

from aioengine.worker.attention import build_attention_metadata
from aioengine.worker.kv_cache import allocate_kv_cache

_BASE = dict(vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
             rms_norm_eps=1e-5)

VARIANTS: dict[str, tuple[type, dict[str, Any]]] = {
    "llama": (LlamaConfig, dict(_BASE, architectures=["LlamaForCausalLM"],
                                tie_word_embeddings=False)),
    # Llama 3 style: llama3 rope scaling (original context 32, so it matters here), tied.
    "llama3-tied": (LlamaConfig, dict(
        _BASE, architectures=["LlamaForCausalLM"], tie_word_embeddings=True,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 32},
        rope_theta=500000.0)),
    "llama-linear-bias": (LlamaConfig, dict(
        _BASE, architectures=["LlamaForCausalLM"], tie_word_embeddings=False,
        rope_scaling={"rope_type": "linear", "factor": 2.0}, attention_bias=True,
        mlp_bias=True, num_key_value_heads=4)),
    "qwen2": (Qwen2Config, dict(_BASE, architectures=["Qwen2ForCausalLM"],
                                tie_word_embeddings=True, num_key_value_heads=1)),
    "qwen3": (Qwen3Config, dict(_BASE, architectures=["Qwen3ForCausalLM"], head_dim=32,
                                tie_word_embeddings=False)),
}


def make_hf_model(variant: str, path: str, seed: int = 0, **overrides: Any) -> Any:
    """A random (not default-initialised: every weight, bias and norm is random) model of the
    variant, saved with ``save_pretrained`` to ``path``; returns the HF model in eval mode."""
    cls, kwargs = VARIANTS[variant]
    config = cls(**{**kwargs, **overrides})
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32,
                                             attn_implementation="eager")
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.copy_(1.0 + 0.2 * torch.randn_like(param))
            else:
                param.normal_(0.0, 0.15)
    model.save_pretrained(path)
    return model.eval()


@dataclass
class Seq:
    tokens: list[int]
    prompt_len: int
    blocks: list[int] = field(default_factory=list)
    computed: int = 0
    logits: dict[int, torch.Tensor] = field(default_factory=dict)  # position -> our logits


class Driver:
    """Runs our model over explicit step plans, allocating shuffled (non-contiguous) blocks,
    greedily appending a token whenever a chunk reaches the end of a sequence."""

    def __init__(self, model: Any, hf_config: Any, block_size: int, num_blocks: int = 200,
                 seed: int = 0) -> None:
        self.model = model
        self.block_size = block_size
        self.caches = allocate_kv_cache(hf_config, num_blocks, block_size, model.dtype, "cpu")
        self.free = list(range(num_blocks))
        random.Random(seed).shuffle(self.free)
        self.seqs: list[Seq] = []

    def add(self, prompt: list[int]) -> int:
        self.seqs.append(Seq(list(prompt), len(prompt)))
        return len(self.seqs) - 1

    def step(self, plan: list[tuple[int, int]]) -> None:
        """``plan``: (sequence index, number of tokens) chunks, in batch order."""
        chunks, ids = [], []
        for idx, num in plan:
            seq = self.seqs[idx]
            start = seq.computed
            assert start + num <= len(seq.tokens), "chunk past the known tokens"
            while len(seq.blocks) * self.block_size < start + num:
                seq.blocks.append(self.free.pop())
            chunks.append((start, num, seq.blocks))
            ids.extend(seq.tokens[start:start + num])
        meta = build_attention_metadata(chunks, self.block_size)
        hidden = self.model(torch.tensor(ids), meta.positions, meta, self.caches)
        logits = self.model.compute_logits(hidden)
        row = 0
        for idx, num in plan:
            seq = self.seqs[idx]
            for i in range(num):
                seq.logits[seq.computed + i] = logits[row + i]
            row += num
            seq.computed += num
            if seq.computed == len(seq.tokens):
                seq.tokens.append(int(logits[row - 1].argmax()))

    def decode_all(self, steps: int) -> None:
        for _ in range(steps):
            self.step([(i, 1) for i, s in enumerate(self.seqs)
                       if s.computed == len(s.tokens) - 1])
