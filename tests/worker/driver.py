"""A scheduler-like driver that runs our model over explicit mixed prefill/decode steps
(no transformers import: it also runs inside spawned tensor-parallel ranks)."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

import torch

from aioengine.worker.attention import build_attention_metadata
from aioengine.worker.kv_cache import allocate_kv_cache


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
                 seed: int = 0, decode_kernel: Any = None, kv_dtype: Any = None) -> None:
        self.model = model
        self.decode_kernel = decode_kernel
        self.block_size = block_size
        self.caches = allocate_kv_cache(hf_config, num_blocks, block_size,
                                        kv_dtype or model.dtype, "cpu",
                                        tp_size=model.tp.size)
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
        meta = build_attention_metadata(chunks, self.block_size,
                                        sliding_window=self.model.spec.sliding_window,
                                        window_only=self.model.spec.all_layers_windowed,
                                        decode_kernel=self.decode_kernel)
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
