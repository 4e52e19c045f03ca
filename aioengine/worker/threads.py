"""How many CPU threads torch may use in one rank's process."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from aioengine.config import EngineConfig
from aioengine.runtime.cpu_info import cpu_model

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


# ---- the compiled kernels' thread count, picked by measurement ----------------------------------

MAX_THREADS = 256  # the kernels' pool refuses more
BEAT = 0.95
"""A count must run the linears in under this fraction of every smaller count's time."""
CACHE_VERSION = 3  # 2: counts measured in turns; 3: keyed by the loaded layout alone
BUSY_LOAD = 1.0
"""1-minute load average per usable CPU from which a measured count is not cached."""

_kernel_threads: int | None = None


def kernel_threads() -> int:
    """The threads the compiled kernels split a decode-sized quantized linear over: the count
    ``set_kernel_threads`` gave (picked by measurement at load when ``num_threads`` is unset),
    else torch's intra-op count (``num_threads``, or the usable CPUs less one)."""
    return _kernel_threads if _kernel_threads is not None else torch.get_num_threads()


def _check_count(n: object, what: str) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_THREADS:
        raise ValueError(f"{what} must be an int in 1..{MAX_THREADS}, got {n!r}")
    return n


def set_kernel_threads(n: int | None) -> None:
    """``None``: follow torch's count again (``kernel_threads``)."""
    global _kernel_threads
    _kernel_threads = None if n is None else _check_count(n, "the kernels' thread count")


def fastest_count(run: Callable[[int], object], budget: int,
                  reps: int = 5) -> tuple[int, dict[int, float]]:
    """The count in ``1..budget`` whose ``run(count)`` has the lowest median time over ``reps``
    (after one warm-up call each, which starts the pool's threads), where a count must beat
    every smaller one by 5% (``BEAT``) to be chosen; and each count's median seconds. The
    counts take turns (1, 2, ..., 1, 2, ...): measured one after the other, a burst of other
    work during one count's turn once made the wrong count win, and since the choice is cached
    every later start decoded slower (docs/benchmarks.md)."""
    _check_count(budget, "the thread budget")
    counts = range(1, budget + 1)
    for n in counts:
        run(n)
    samples: dict[int, list[float]] = {n: [] for n in counts}
    for _ in range(reps):
        for n in counts:
            t0 = time.perf_counter()
            run(n)
            samples[n].append(time.perf_counter() - t0)
    times = {n: statistics.median(s) for n, s in samples.items()}
    return pick_count(times), times


def pick_count(times: dict[int, float]) -> int:
    """The count (from 1 up) whose time beats every smaller count's by ``BEAT``."""
    best, best_s = 1, float("inf")
    for n in sorted(times):
        if times[n] < best_s * BEAT:
            best, best_s = n, times[n]
    return best


def machine_key() -> dict[str, object]:
    """What makes another machine for a measured thread count: the CPU model, the CPUs this
    process may use, the kernel (Linux: its release)."""
    return {"cpu": cpu_model(), "cpus": usable_cpus(), "os": platform.release()}


def threads_cache_path(key: dict[str, object]) -> Path:
    from aioengine.config import cache_dir

    digest = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()
    return Path(cache_dir()) / "threads" / f"{digest[:24]}.json"


def cached_fastest_count(key: dict[str, object], budget: int,
                         run: Callable[[int], object]) -> tuple[int, bool]:
    """``fastest_count(run, budget)``, measured once per ``key`` (the model, its weight
    layout, the kernels' build, the rank's share of the machine: ``machine_key`` is added) and
    read back from ``$AIOENGINE_CACHE/threads/`` afterwards, so a warm start measures nothing.
    A cache file that cannot be read or holds a count outside ``1..budget`` is measured again
    (and rewritten). A count measured while the machine was busy (1-minute load average at
    least ``BUSY_LOAD`` per usable CPU: other work shared the cores) is used but not cached,
    so it is measured again at the next start rather than kept. Returns ``(count,
    measured_now)``. Delete the file to measure again."""
    key = {**key, **machine_key(), "budget": budget, "version": CACHE_VERSION}
    path = threads_cache_path(key)
    try:
        got = json.loads(path.read_text())["threads"]
        if isinstance(got, int) and not isinstance(got, bool) and 1 <= got <= budget:
            return got, False
        raise ValueError(f"{path} holds the thread count {got!r}, not one in 1..{budget}")
    except FileNotFoundError:
        pass
    except (OSError, ValueError, KeyError, TypeError) as e:
        logger.warning("measuring the thread count again: %s", e)
    t0 = time.perf_counter()
    n, times = fastest_count(run, budget)
    load = os.getloadavg()[0]
    record = {"threads": n, "median_ms": {str(c): s * 1e3 for c, s in times.items()},
              "measure_s": time.perf_counter() - t0, "loadavg_1m": load, "key": key}
    logger.info("kernel threads %d (median ms per count %s, %.0f ms to measure, load %.1f)", n,
                record["median_ms"], record["measure_s"] * 1e3, load)
    if load >= BUSY_LOAD * usable_cpus():
        logger.info("thread count not cached: measured on a busy machine (load %.1f)", load)
        return n, True
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(record, default=str))
        os.replace(tmp, path)
    except OSError as e:
        logger.warning("thread count not cached (%s): measured again next start", e)
    return n, True
