"""How many CPU threads torch may use in one rank's process."""

from __future__ import annotations

import logging
import os

import torch

from aioengine.config import EngineConfig

logger = logging.getLogger(__name__)


def usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def threads_per_rank(config: EngineConfig, world_size: int) -> int:
    """``config.num_threads``, else the usable CPUs less one (kept for the host process and the
    engine's I/O threads), shared among the ranks; at least 1."""
    if config.num_threads is not None:
        return config.num_threads
    return max(1, (usable_cpus() - 1) // world_size)


def apply_thread_policy(config: EngineConfig, world_size: int) -> int:
    n = threads_per_rank(config, world_size)
    if torch.get_num_threads() != n:
        torch.set_num_threads(n)
    logger.debug("torch uses %d intra-op threads in this rank", n)
    return n
