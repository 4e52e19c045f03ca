"""``get_stats()`` over replicas: the total, with every replica's own snapshot beside it."""

from __future__ import annotations

from collections.abc import Sequence

from aioengine.messages.engine_io import EngineStats, ProcessMemory

_SUMMED = ("num_running", "num_waiting", "num_preempted_total", "kv_blocks_used",
           "kv_blocks_total", "prompt_tokens_total", "generation_tokens_total",
           "num_requests_finished_total", "kv_bytes_reserved", "kv_bytes_used",
           "kv_bytes_prefix_cached")


def total_stats(per_replica: Sequence[EngineStats | None]) -> EngineStats:
    """Counts summed over the live replicas (a dead one is ``None`` in ``replicas``); the prefix
    hit rate weighted by each replica's prompt tokens."""
    live = [s for s in per_replica if s is not None]
    sums = {name: sum(getattr(s, name) for s in live) for name in _SUMMED}
    prompt = sums["prompt_tokens_total"]
    rate = (sum(s.prefix_cache_hit_rate * s.prompt_tokens_total for s in live) / prompt
            if prompt else 0.0)
    processes = [ProcessMemory(role=f"replica{i}/{p.role}", pid=p.pid, rss_bytes=p.rss_bytes)
                 for i, s in enumerate(per_replica) if s is not None for p in s.processes]
    return EngineStats(**sums, prefix_cache_hit_rate=rate, processes=processes,
                       data_parallel_size=len(per_replica), replicas_alive=len(live),
                       replicas=list(per_replica))
