"""The ``scale`` suite: data-parallel replicas against one engine, on the same host.

``dp1`` (the baseline: one engine, the engine's thread policy) and ``dp2`` (two replicas, the
threads split between them, the same total ``max_num_seqs``; ``dp1_all_threads``, one engine
with every CPU's thread, only with ``--only``) run the offline suite's seeded workload
through ``LLM.generate``; both are started once and their timed repeats alternate, so a change
of load on the box hits both alike. Metric: output tokens/s, the median repeat.

``local_dp2_b1``, ``ray_dp2_b1`` and ``ray_dp2_tcp_b1``: batch-1 decode (one request at a time,
tokens/s between its first and last token) through two local replicas, through two replicas
that Ray placed (a local Ray instance started for the suite; the host's own node, so the
configured transport) and the same forced over ``zmq+tcp://``; also ``ray_vs_local_decode``,
the Ray path's rate over the local one (the goal is >= 0.9). Alternating, median of 5.

``round_robin`` and ``prefix_affinity``: two replicas serve a shared-prefix workload (a few
long system prompts, many short questions each, a few in flight at a time); the metric is the
fraction of prompt tokens found in a replica's prefix cache (``num_cached_tokens``).
"""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import os
import random
import statistics
import time
from typing import Any

from aioengine.bench.options import BenchOptions
from aioengine.bench.progress import Progress
from aioengine.bench.results import Result
from aioengine.bench.workload import TokenSpace, Workload, synthetic

logger = logging.getLogger(__name__)

SUITE = "scale"
BASELINE = "dp1"
# name -> (replicas, every CPU in one engine's pool?). Otherwise threads per replica are the
# engine's policy, (CPUs - 1) // replicas, or --threads split over the replicas.
SIDES = {"dp1": (1, False), "dp1_all_threads": (1, True), "dp2": (2, False)}
# dp1_all_threads only when named (--only): on 2 busy cores its spinning pool runs many times
# slower than dp1 (docs/benchmarks.md) and alone holds the bench lock for minutes.
DEFAULT = ("dp1", "dp2")
SEED = 0
REPEATS = 3
QUICK = {"requests": 32, "prompt_lens": (16, 128), "output_lens": (16, 64), "batch": 16}
FULL = {"requests": 128, "prompt_lens": (16, 512), "output_lens": (16, 256), "batch": 32}
# shared-prefix workload: groups x questions, prefix and question lengths in tokens
PREFIX_GROUPS, PREFIX_QUESTIONS, PREFIX_LEN, QUESTION_LEN, IN_FLIGHT = 5, 8, 128, 12, 4


def run(options: BenchOptions, sizes: dict[str, Any] | None = None) -> list[Result]:
    sizes = sizes or (QUICK if options.quick else FULL)
    space = TokenSpace.of_model(options.model)
    work = synthetic(space, sizes["requests"], sizes["prompt_lens"], sizes["output_lens"], SEED)
    total = options.threads or _usable_cpus()
    sides = [n for n in SIDES if options.wants(n) and (n in options.only or n in DEFAULT)]
    policies = [n for n in ("round_robin", "prefix_affinity") if options.wants(n)]
    decode = [n for n in DECODE_SIDES if options.wants(n)]
    if importlib.util.find_spec("ray") is None and any("ray" in n for n in decode):
        logger.warning("scale: ray is not installed (pip install 'aioengine[ray]'): the Ray "
                       "rows are left out")
        decode = [n for n in decode if "ray" not in n]
    results: list[Result] = []
    steps = len(sides) * REPEATS + len(decode) * DECODE_REPEATS + len(policies)
    with Progress(steps, SUITE, options.progress) as bar:
        if sides:
            results += _throughput(options, work, sides, total, sizes["batch"], bar)
        if decode:
            started_ray = _start_ray() if any("ray" in s for s in decode) else None
            try:
                results += asyncio.run(_decode(options, decode, bar))
            finally:
                if started_ray is not None:
                    started_ray.shutdown()
        for name in policies:
            bar.label(name)
            rate = asyncio.run(_prefix_hit_rate(options, space, name,
                                                sizes.get("in_flight", IN_FLIGHT),
                                                sizes.get("kv_blocks")))
            results.append(Result(SUITE, name, "prefix_hit_rate", rate, "fraction"))
            bar.advance()
    return results


DECODE_SIDES = {"local_dp2_b1": {}, "ray_dp2_b1": {"distributed_backend": "ray"},
                "ray_dp2_tcp_b1": {"distributed_backend": "ray", "ray_force_tcp": True}}
DECODE_TOKENS = 128
DECODE_REPEATS = 5


async def _decode(options: BenchOptions, sides: list[str], bar: Progress) -> list[Result]:
    from contextlib import AsyncExitStack

    from aioengine import AsyncMPClient, SamplingParams

    params = SamplingParams(max_tokens=DECODE_TOKENS, temperature=0.0, ignore_eos=True)
    rates: dict[str, list[float]] = {s: [] for s in sides}
    async with AsyncExitStack() as stack:
        clients = {s: await stack.enter_async_context(AsyncMPClient(
            _config(options, 2, None, 2, DECODE_TOKENS + 32, **DECODE_SIDES[s])))
            for s in sides}
        for s in sides:  # warm-up
            _ = [o async for o in clients[s].generate([1, 2, 3], params)]
        for i in range(DECODE_REPEATS):
            for s in sides:
                bar.label(s)
                stamps = [time.perf_counter() async for _ in
                          clients[s].generate([7, 8, 9, 10 + i], params)]
                rates[s].append((DECODE_TOKENS - 1) / (stamps[-1] - stamps[0]))
                bar.advance()
    results = [Result(SUITE, s, "batch1_decode_tok_s", statistics.median(r), "tok/s")
               for s, r in rates.items()]
    if "local_dp2_b1" in rates:
        local = statistics.median(rates["local_dp2_b1"])
        results += [Result(SUITE, s, "ray_vs_local_decode", statistics.median(rates[s]) / local,
                           "ratio") for s in rates if s != "local_dp2_b1"]
    return results


def _start_ray() -> Any:
    """A local Ray instance for the Ray rows (the module, to shut it down after), or None when
    one is running already (``RAY_ADDRESS`` or the caller's own)."""
    import ray
    if ray.is_initialized():
        return None
    # Logical CPUs: one per replica of each Ray side (the host's cores are shared anyway).
    ray.init(num_cpus=4, include_dashboard=False, logging_level="warning", log_to_driver=False)
    return ray


def _usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def _config(options: BenchOptions, dp: int, threads: int | None, seqs: int, longest: int,
            **kw: Any) -> Any:
    """``threads`` None: ``--threads`` split over the replicas, else the engine's policy."""
    from aioengine import EngineConfig
    if threads is None and options.threads is not None:
        threads = max(1, options.threads // dp)
    return EngineConfig(model=options.model, data_parallel_size=dp, num_threads=threads,
                        max_num_seqs=max(1, seqs // dp), max_model_len=longest, **kw)


def _throughput(options: BenchOptions, work: Workload, sides: list[str], threads: int,
                batch: int, bar: Progress) -> list[Result]:
    from contextlib import ExitStack

    from aioengine import LLM, SamplingParams

    params = [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
              for n in work.output_lens]
    warm = work.prompts[:batch]
    times: dict[str, list[float]] = {s: [] for s in sides}
    counts: dict[str, set[int]] = {s: set() for s in sides}
    with ExitStack() as stack:
        llms = {}
        for s in sides:
            dp, every_cpu = SIDES[s]
            config = _config(options, dp, threads if every_cpu else None, batch, work.longest)
            llms[s] = stack.enter_context(LLM(config))
        for s in sides:
            llms[s].generate(warm, params[:batch], use_tqdm=False)
        for _ in range(REPEATS):
            for s in sides:  # alternate: both sides see the same box
                bar.label(s)
                client = llms[s].client
                client.call_async(client.async_client.reset_prefix_cache)  # type: ignore
                t0 = time.perf_counter()
                outs = llms[s].generate(work.prompts, params, use_tqdm=False)
                times[s].append(time.perf_counter() - t0)
                counts[s].add(sum(len(o.token_ids) for o in outs))
                bar.advance()
    results = []
    for s in sides:
        if len(counts[s]) != 1:
            raise RuntimeError(f"{s}: repeats of one greedy workload produced different token "
                               f"counts: {counts[s]}")
        seconds = statistics.median(times[s])
        results.append(Result(SUITE, s, "output_tokens_per_s", counts[s].pop() / seconds,
                              "tok/s"))
    return results


async def _prefix_hit_rate(options: BenchOptions, space: TokenSpace, name: str,
                           in_flight: int, kv_blocks: int | None) -> float:
    """``kv_blocks`` None: each replica's KV cache is what its ``max_num_seqs`` can use (about
    ``in_flight`` contexts, so it holds few prefixes: where to send one matters)."""
    from aioengine import AsyncMPClient, SamplingParams

    rng = random.Random(SEED)
    ids = [i for i in range(space.vocab_size) if i not in space.special_ids]
    prefixes = [[rng.choice(ids) for _ in range(PREFIX_LEN)] for _ in range(PREFIX_GROUPS)]
    prompts = [prefixes[g] + [rng.choice(ids) for _ in range(QUESTION_LEN)]
               for _ in range(PREFIX_QUESTIONS) for g in range(PREFIX_GROUPS)]
    rng.shuffle(prompts)  # the groups arrive mixed, as users of several apps would
    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    policy = "prefix" if name == "prefix_affinity" else "round_robin"
    config = _config(options, 2, None, 2 * in_flight, PREFIX_LEN + QUESTION_LEN + 8,
                     data_parallel_routing=policy, num_kv_blocks=kv_blocks)
    gate = asyncio.Semaphore(in_flight)
    cached: list[int] = []
    async with AsyncMPClient(config) as client:
        async def one(prompt: list[int]) -> None:
            async with gate:
                outs = [o async for o in client.generate(prompt, params)]
                cached.append(outs[-1].num_cached_tokens)

        await asyncio.gather(*(one(p) for p in prompts))
    return sum(cached) / sum(len(p) for p in prompts)
