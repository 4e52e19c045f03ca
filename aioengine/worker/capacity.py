"""Capacity planning on one rank: how many KV blocks to allocate, and the longest context.

Order of precedence for the block count (``EngineConfig``):

1. ``num_kv_blocks``: taken as is;
2. ``kv_cache_memory`` (bytes per rank): as many blocks as fit;
3. ``kv_cache_memory_fraction`` of the free memory: available RAM (psutil) on CPU; on GPU the
   free device memory after the weights are loaded, minus the activation peak of a profiling
   forward of ``max_num_batched_tokens`` tokens. Capped at what ``max_num_seqs`` sequences of
   the full context length could ever use, so a small model does not claim gigabytes of RAM.

With tensor parallelism every rank plans on its own; the worker takes the minimum over ranks.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import psutil
import torch

from aioengine.config import EngineConfig
from aioengine.worker.kv_cache import kv_cache_bytes_per_block, num_blocks_for_bytes
from aioengine.worker.models.spec import ModelSpec

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class MemoryProfile:
    """What the planner measured (reported by the worker's ``profile_memory`` call)."""

    free_bytes: int  # free memory the fraction applies to
    activation_peak_bytes: int  # extra memory a full-size forward needs (0 on CPU)
    bytes_per_block: int


def max_context_len(config: EngineConfig, spec: ModelSpec) -> int:
    """``min(max_model_len, max_position_embeddings)``; a ``max_model_len`` above the model's
    positions is an error (RoPE past the trained range gives garbage, silently)."""
    limit = spec.max_position_embeddings
    if config.max_model_len is None:
        return limit
    if config.max_model_len > limit:
        raise ValueError(f"max_model_len {config.max_model_len} exceeds the model's context "
                         f"length {limit} (max_position_embeddings)")
    return config.max_model_len


def profile_free_memory(device: torch.device, profile_forward: Callable[[], None] | None
                        ) -> tuple[int, int]:
    """(free bytes, activation peak bytes) on ``device``. On CUDA ``profile_forward`` runs once
    (the largest step the engine may schedule) to measure the activation peak."""
    if device.type == "cpu":
        return int(psutil.virtual_memory().available), 0
    if device.type != "cuda":
        raise ValueError(f"cannot profile memory on device type {device.type!r}")
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    before = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    if profile_forward is not None:
        profile_forward()
        torch.cuda.synchronize(device)
    peak = max(0, torch.cuda.max_memory_allocated(device) - before)
    torch.cuda.empty_cache()
    free, _total = torch.cuda.mem_get_info(device)
    return int(free), int(peak)


def determine_num_kv_blocks(config: EngineConfig, spec: ModelSpec, dtype: torch.dtype,
                            device: torch.device, tp_size: int = 1,
                            profile_forward: Callable[[], None] | None = None
                            ) -> tuple[int, MemoryProfile | None]:
    """The number of KV blocks this rank should allocate, and the measurement behind it
    (None when the config fixed the size). Raises ValueError when not even one block fits."""
    per_block = kv_cache_bytes_per_block(spec, config.block_size, dtype, tp_size)
    if config.num_kv_blocks is not None:
        return config.num_kv_blocks, None
    if config.kv_cache_memory is not None:
        return num_blocks_for_bytes(spec, config.kv_cache_memory, config.block_size, dtype,
                                    tp_size), None
    free, peak = profile_free_memory(device, profile_forward)
    budget = int(free * config.kv_cache_memory_fraction) - peak
    if budget < per_block:
        raise ValueError(
            f"no memory left for the KV cache on {device}: {free} bytes free, "
            f"kv_cache_memory_fraction={config.kv_cache_memory_fraction}, activation peak "
            f"{peak} bytes, one block needs {per_block} bytes; lower max_num_batched_tokens "
            "or set kv_cache_memory / num_kv_blocks")
    blocks = budget // per_block
    per_seq = -(-max_context_len(config, spec) // config.block_size)
    useful = config.max_num_seqs * per_seq
    if blocks > useful:
        logger.info("KV cache: %d blocks would fit, %d can ever be used (max_num_seqs=%d x "
                    "%d blocks); allocating %d", blocks, useful, config.max_num_seqs, per_seq,
                    useful)
        blocks = useful
    return int(blocks), MemoryProfile(free, peak, per_block)
