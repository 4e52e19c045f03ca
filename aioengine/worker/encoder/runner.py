"""EncoderRunner: ``ModelRunner``'s interface for an encoder: an embedding model, or a
reranker (an encoder with a classifier head).

Every chunk of a step is one whole input (the scheduler never splits a pooling request); the
step's inputs run bidirectionally in padded batches of similar lengths, and each answers its
pooled vector (a reranker: its logits). There is no KV cache: the engine's blocks are kept
only as its count of tokens in flight, and take no memory.
"""

from __future__ import annotations

import json
import logging
import os

import torch
import torch.nn.functional as F

from aioengine.config import EngineConfig
from aioengine.hub import read_model_info, resolve_model
from aioengine.hub.pooling import PoolingConfig, read_pooling_config
from aioengine.messages.worker_io import PooledOutput, ScheduledChunk, StepInput, StepResult
from aioengine.worker.encoder.bert import load_bert
from aioengine.worker.loader import resolve_device
from aioengine.worker.threads import apply_thread_policy

logger = logging.getLogger(__name__)

PADDING_SLACK = 1.25
"""A batch grows while its padded size stays within this factor of its real tokens; longer
inputs start the next batch (inputs are taken shortest first)."""


class EncoderRunner:
    def __init__(self, config: EngineConfig, *, rank: int = 0, world_size: int = 1,
                 device: str | None = None) -> None:
        if world_size != 1:
            raise ValueError("an encoder model runs on one rank: tensor_parallel_size must be 1 "
                             f"(got {world_size})")
        self.config = config
        self.rank = rank
        self.threads = apply_thread_policy(config, world_size)
        resolved = resolve_model(config.model, config.tokenizer)
        with open(os.path.join(resolved.model_path, "config.json"), encoding="utf-8") as f:
            model_config = json.load(f)
        self.device = resolve_device(device or config.device)
        self.dtype = torch.float32
        self.scores = read_model_info(resolved.model_path).task == "score"
        self.model = load_bert(resolved.model_path, model_config, self.device,
                               classifier=self.scores)
        self.pooling: PoolingConfig = read_pooling_config(resolved.model_path)
        limit = self.model.max_positions
        if config.max_model_len is not None and config.max_model_len > limit:
            raise ValueError(f"max_model_len {config.max_model_len} exceeds the model's "
                             f"{limit} positions (max_position_embeddings)")
        self.max_model_len = config.max_model_len or limit
        self.kv_window = None
        self.kv_dtype = self.dtype
        self.kv_bytes_per_block = 0
        self.kv_sized_by = "an encoder: its blocks only count the tokens in flight (no KV)"
        self.memory_profile = None
        self.num_kv_blocks = 0
        logger.info("encoder %s: %d layers, hidden %d, %s, on %s",
                    ", ".join(model_config.get("architectures") or ["?"]),
                    len(self.model.layers), self.model.hidden_size,
                    "a classifier's logits" if self.scores else f"{self.pooling.mode} pooling"
                    + (", normalized" if self.pooling.normalize else ""), self.device)

    def plan_kv_blocks(self) -> int:
        """Enough to admit a full step of inputs, each in its own partial block."""
        cfg = self.config
        tokens = max(cfg.max_num_batched_tokens, self.max_model_len)
        return -(-tokens // cfg.block_size) + min(cfg.max_num_seqs, tokens)

    def allocate_kv_cache(self, num_blocks: int) -> None:
        self.num_kv_blocks = num_blocks

    @torch.inference_mode()
    def execute(self, step: StepInput) -> StepResult:
        chunks = step.chunks
        for c in chunks:
            if not c.pool or c.start_pos != 0:
                raise ValueError(f"step {step.step_id}: an encoder runs whole inputs for "
                                 f"pooling; chunk of {c.request_id!r} is not one (pool="
                                 f"{c.pool}, start {c.start_pos})")
        vectors: dict[str, list[float]] = {}
        for batch in _batches(chunks):
            for c, v in zip(batch, self._embed(batch), strict=True):
                vectors[c.request_id] = v
        return StepResult(step.step_id, [], [PooledOutput(c.request_id, vectors[c.request_id])
                                             for c in chunks])

    def _embed(self, batch: list[ScheduledChunk]) -> list[list[float]]:
        vocab = self.model.word.num_embeddings
        longest = max(len(c.token_ids) for c in batch)
        ids = torch.zeros(len(batch), longest, dtype=torch.long)
        types = torch.zeros(len(batch), longest, dtype=torch.long)
        valid = torch.zeros(len(batch), longest, dtype=torch.bool)
        for i, c in enumerate(batch):
            if min(c.token_ids) < 0 or max(c.token_ids) >= vocab:
                raise ValueError(f"request {c.request_id!r}: a token id is outside the "
                                 f"vocabulary [0, {vocab})")
            ids[i, :len(c.token_ids)] = torch.tensor(c.token_ids)
            valid[i, :len(c.token_ids)] = True
            if c.pair_start:
                types[i, c.pair_start:len(c.token_ids)] = 1
        ids, types, valid = ids.to(self.device), types.to(self.device), valid.to(self.device)
        states = self.model(ids, types, valid)
        if self.model.head is not None:
            return self.model.head(states).float().cpu().tolist()
        pooled = pool(states, valid, self.pooling.mode)
        if self.pooling.normalize:
            pooled = F.normalize(pooled, dim=-1)
        return pooled.float().cpu().tolist()

    def release(self) -> None:
        self.model = None


def pool_states(states: torch.Tensor, mode: str) -> torch.Tensor:
    """``[seq, hidden]`` states of one input -> ``[hidden]``."""
    if mode == "cls":
        return states[0]
    if mode == "mean":
        return states.mean(0)
    if mode == "last":
        return states[-1]
    raise ValueError(f"unknown pooling mode {mode!r}")


def pool(states: torch.Tensor, valid: torch.Tensor, mode: str) -> torch.Tensor:
    """``[batch, seq, hidden]`` states of padded inputs -> ``[batch, hidden]``."""
    if mode == "cls":
        return states[:, 0]
    if mode == "mean":
        weights = valid.unsqueeze(-1).to(states.dtype)
        return (states * weights).sum(1) / weights.sum(1).clamp(min=1)
    if mode == "last":
        last = valid.sum(1) - 1
        return states[torch.arange(states.shape[0], device=states.device), last]
    raise ValueError(f"unknown pooling mode {mode!r}")


def _batches(chunks: list[ScheduledChunk]) -> list[list[ScheduledChunk]]:
    """Inputs shortest first, cut where padding to the longest would exceed the slack."""
    batches: list[list[ScheduledChunk]] = []
    current: list[ScheduledChunk] = []
    tokens = 0
    for c in sorted(chunks, key=lambda c: len(c.token_ids)):
        n = len(c.token_ids)
        if current and (len(current) + 1) * n > PADDING_SLACK * (tokens + n):
            batches.append(current)
            current, tokens = [], 0
        current.append(c)
        tokens += n
    if current:
        batches.append(current)
    return batches
