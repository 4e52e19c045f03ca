"""Capacity planning on one rank: how many KV blocks to allocate, and the longest context.

Order of precedence for the block count (``EngineConfig``):

1. ``num_kv_blocks``: taken as is;
2. ``kv_cache_memory`` (bytes per rank) or ``kv_cache_tokens``: as many blocks as fit / as
   the tokens need;
3. CPU: by need: ``max_num_seqs`` sequences of the full context length, plus a prefix-cache
   share of ``PREFIX_CACHE_PERCENT`` % of that, capped at ``kv_cache_memory_fraction`` (default
   ``CPU_RAM_FRACTION``) of the RAM available at start;
4. GPU: ``kv_cache_memory_fraction`` (default ``GPU_MEMORY_FRACTION``) of the free device
   memory after the weights are loaded, minus the activation peak of a profiling forward of
   ``max_num_batched_tokens`` tokens, capped at what ``max_num_seqs`` full sequences can use.

On CPU an explicit size larger than the available RAM is an error at start (the cache is
written at allocation, so it would be an out-of-memory kill later). With tensor parallelism
every rank plans on its own; the worker takes the minimum over ranks.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import psutil
import torch

from aioengine.config import EngineConfig
from aioengine.units import format_bytes
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


PREFIX_CACHE_PERCENT = 10
"""CPU, sized by need: blocks beyond ``max_num_seqs`` full sequences, for prompt prefixes the
prefix cache keeps after their requests finish (a tenth: llama.cpp's server, which keeps none,
stays within the issue's +25% of it)."""
CPU_RAM_FRACTION = 0.25
"""CPU: the default cap on the pool sized by need, of the RAM available at start. RAM is shared
with the program that embeds the engine, the page cache of memory-mapped weights, a prefill's
activations and other engines; running out means an out-of-memory kill, not a clean error."""
GPU_MEMORY_FRACTION = 0.5
"""GPU: the default fraction of the free device memory the KV cache takes."""


@dataclass(frozen=True)
class KvPlan:
    """The block count of one rank and why."""

    num_blocks: int
    bytes_per_block: int
    sized_by: str  # what decided the size, for the start-up log line
    profile: MemoryProfile | None = None  # None when the config fixed the size


def plan_kv_cache(config: EngineConfig, spec: ModelSpec, dtype: torch.dtype,
                  device: torch.device, tp_size: int = 1,
                  profile_forward: Callable[[], None] | None = None) -> KvPlan:
    """The number of KV blocks this rank should allocate, and what decided it. Raises
    ValueError, naming the setting that lowers the size, when it cannot fit."""
    per_block = kv_cache_bytes_per_block(spec, config.block_size, dtype, tp_size)
    per_seq = -(-max_context_len(config, spec) // config.block_size)
    if config.num_kv_blocks is not None:
        plan = KvPlan(config.num_kv_blocks, per_block, f"num_kv_blocks={config.num_kv_blocks}")
        setting = "num_kv_blocks"
    elif config.kv_cache_memory is not None:
        memory = int(config.kv_cache_memory)
        plan = KvPlan(num_blocks_for_bytes(spec, memory, config.block_size, dtype, tp_size),
                      per_block, f"kv_cache_memory={format_bytes(memory)}")
        setting = "kv_cache_memory"
    elif config.kv_cache_tokens is not None:
        plan = KvPlan(-(-config.kv_cache_tokens // config.block_size), per_block,
                      f"kv_cache_tokens={config.kv_cache_tokens}")
        setting = "kv_cache_tokens"
    elif device.type == "cpu":
        return _by_need(config, per_block, per_seq)
    else:
        return _gpu_fraction(config, device, per_block, per_seq, profile_forward)
    if setting != "num_kv_blocks" and config.max_model_len is not None \
            and plan.num_blocks < per_seq:
        raise ValueError(
            f"{setting}: {plan.sized_by} holds {plan.num_blocks * config.block_size} tokens, "
            f"less than one sequence of max_model_len={config.max_model_len}; the minimum is "
            f"{per_seq * config.block_size} tokens ({format_bytes(per_seq * per_block)})")
    if device.type == "cpu":
        available = int(psutil.virtual_memory().available)
        if plan.num_blocks * per_block > available:
            raise ValueError(
                f"the KV cache of {plan.num_blocks} blocks needs "
                f"{format_bytes(plan.num_blocks * per_block)} ({plan.sized_by}), more than the "
                f"{format_bytes(available)} of RAM available; lower {setting}")
    return plan


def prefix_cache_share(need_blocks: int) -> int:
    """The blocks added for the prefix cache to ``need_blocks`` (rounded up)."""
    return -(-need_blocks * PREFIX_CACHE_PERCENT // 100)


def _by_need(config: EngineConfig, per_block: int, per_seq: int) -> KvPlan:
    """CPU default: ``max_num_seqs`` full sequences plus the prefix-cache share, capped."""
    need = config.max_num_seqs * per_seq
    want = need + (prefix_cache_share(need) if config.enable_prefix_caching else 0)
    available = int(psutil.virtual_memory().available)
    fraction = config.kv_cache_memory_fraction or CPU_RAM_FRACTION
    cap = int(available * fraction) // per_block
    profile = MemoryProfile(available, 0, per_block)
    ctx = per_seq * config.block_size
    share = f" + {PREFIX_CACHE_PERCENT}% prefix-cache share" \
        if config.enable_prefix_caching else ""
    if want <= cap:
        return KvPlan(want, per_block, f"need: max_num_seqs={config.max_num_seqs} x "
                      f"{ctx} tokens{share}", profile)
    cap_text = (f"kv_cache_memory_fraction={fraction} of {format_bytes(available)} available "
                f"RAM = {format_bytes(cap * per_block)}")
    if cap < 1 or (config.max_model_len is not None and cap < per_seq):
        raise ValueError(
            f"one sequence of max_model_len={ctx} tokens needs "
            f"{format_bytes(per_seq * per_block)} of KV cache, more than the cap ({cap_text}); "
            "lower max_model_len, or set kv_cache_memory / kv_cache_tokens")
    return KvPlan(cap, per_block, f"cap: {cap_text} (need: max_num_seqs="
                  f"{config.max_num_seqs} x {ctx} tokens{share} = "
                  f"{format_bytes(want * per_block)})", profile)


def _gpu_fraction(config: EngineConfig, device: torch.device, per_block: int, per_seq: int,
                  profile_forward: Callable[[], None] | None) -> KvPlan:
    fraction = config.kv_cache_memory_fraction or GPU_MEMORY_FRACTION
    free, peak = profile_free_memory(device, profile_forward)
    budget = int(free * fraction) - peak
    if budget < per_block:
        raise ValueError(
            f"no memory left for the KV cache on {device}: {format_bytes(free)} free, "
            f"kv_cache_memory_fraction={fraction}, activation peak {format_bytes(peak)}, one "
            f"block needs {per_block} bytes; lower max_num_batched_tokens or set "
            "kv_cache_memory / kv_cache_tokens / num_kv_blocks")
    blocks = budget // per_block
    useful = config.max_num_seqs * per_seq
    profile = MemoryProfile(free, peak, per_block)
    sized_by = f"kv_cache_memory_fraction={fraction} of {format_bytes(free)} free on {device}"
    if blocks > useful:
        return KvPlan(useful, per_block, f"need: max_num_seqs={config.max_num_seqs} x "
                      f"{per_seq * config.block_size} tokens (less than {sized_by})", profile)
    return KvPlan(int(blocks), per_block, sized_by, profile)
