"""The ``overhead`` suite: what the multiprocess stack costs on batch-1 greedy decoding.

Rows ``aioengine_{uniproc,mp}_{zmq,shm,uds}``: one request at a time through ``AsyncMPClient``
with that executor and transport; ``bare_loop`` (the baseline): the same ``ModelRunner`` and
sampler called directly in one process (see ``bare_loop``). Metrics:

- ``decode_tokens_per_s``: output tokens after the first, per second after the first arrived
  (prefill and start-up excluded), the median over repeats;
- ``host_cpu_ms_per_token`` (engines only): CPU time of the host process (every thread: the
  event loop, transport I/O, the supervisor) while streaming, per output token;
- ``vs_bare_paired`` (engines only, with the baseline): each engine request's rate over the mean
  of the bare loop's rates measured right before and right after it, the median over repeats.

Every engine starts at once (start-up is mostly single-threaded imports, so this uses the
cores), then the repeats go round-robin over the rows, with a bare-loop request between any two
engine requests. The box's speed drifts by tens of percent within seconds (a shared VM): a
ratio of medians taken seconds apart mostly measures that drift, a ratio to the bare loop's
neighbouring requests much less so.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from aioengine.bench.bare_loop import BLOCK_SIZE, BareLoopChild, DecodeTiming
from aioengine.bench.options import BenchOptions
from aioengine.bench.progress import Progress
from aioengine.bench.results import Result
from aioengine.bench.workload import TokenSpace

if TYPE_CHECKING:
    from aioengine import AsyncMPClient, EngineConfig

SUITE = "overhead"
BASELINE = "bare_loop"
EXECUTORS = ("uniproc", "mp")
TRANSPORTS = ("zmq", "shm", "uds")
SEED = 0
START_TIMEOUT = 600.0  # many engines importing torch at once on a small, busy box
STEP_TIMEOUT = 300.0


@dataclass(frozen=True)
class Sizes:
    prompt_len: int
    new_tokens: int
    repeats: int


# On a shared VM the bare loop against itself (each request over the mean of its two
# neighbours) spreads more the longer the request: the box drifts within a long request
# (docs/benchmarks.md). So the full run takes many short repeats (a few seconds each) rather
# than a few long ones; the quick run is the same with fewer.
FULL = Sizes(prompt_len=32, new_tokens=64, repeats=24)
QUICK = Sizes(prompt_len=32, new_tokens=64, repeats=5)

def engine_names() -> list[str]:
    return [f"aioengine_{ex}_{tr}" for ex in EXECUTORS for tr in TRANSPORTS]


def run(options: BenchOptions, sizes: Sizes | None = None) -> list[Result]:
    sizes = sizes or (QUICK if options.quick else FULL)
    space = TokenSpace.of_model(options.model)
    prompt = space.draw(random.Random(SEED), sizes.prompt_len)
    return asyncio.run(_run(options, sizes, prompt))


async def _run(options: BenchOptions, sizes: Sizes, prompt: list[int]) -> list[Result]:
    from aioengine import AsyncMPClient

    names = [n for n in engine_names() if options.wants(n)]
    clients = {n: AsyncMPClient(_config(options, n, sizes)) for n in names}
    bare = None
    try:
        if options.wants(BASELINE):
            bare = await BareLoopChild.start(options.model, prompt, sizes.new_tokens,
                                             options.threads)
        async with asyncio.timeout(START_TIMEOUT), asyncio.TaskGroup() as tg:
            # A task group: one failed start cancels the others instead of leaving them.
            for c in clients.values():
                tg.create_task(c.start())
            if bare is not None:
                tg.create_task(bare.ready(START_TIMEOUT))
        for c in clients.values():  # warm-up: one short request each
            await _one(c, prompt, 4)
        timings: dict[str, list[DecodeTiming]] = {n: [] for n in names}
        cpu: dict[str, list[float]] = {n: [] for n in names}
        # Per engine request: the bare loop's rate right before it and right after it.
        around: dict[str, list[tuple[float, float]]] = {n: [] for n in names}
        bare_runs = sizes.repeats * len(names) + 1 if bare is not None else 0
        with Progress(sizes.repeats * len(names) + bare_runs, SUITE, options.progress) as bar:

            async def measure_bare() -> float:
                assert bare is not None
                bar.label(BASELINE)
                t = await bare.measure(STEP_TIMEOUT)
                timings.setdefault(BASELINE, []).append(t)
                bar.advance()
                return t.decode_tokens_per_s

            before = await measure_bare() if bare is not None else None
            for _ in range(sizes.repeats):
                for n, c in clients.items():
                    bar.label(n)
                    c0 = time.process_time()
                    t = await asyncio.wait_for(_one(c, prompt, sizes.new_tokens), STEP_TIMEOUT)
                    cpu[n].append((time.process_time() - c0) * 1000 / t.tokens)
                    timings[n].append(t)
                    bar.advance()
                    if before is not None:
                        after = await measure_bare()
                        around[n].append((before, after))
                        before = after
    finally:
        await asyncio.gather(*(c.shutdown() for c in clients.values()),
                             *([bare.close()] if bare is not None else []))
    results = []
    for n, ts in timings.items():
        rate = statistics.median(t.decode_tokens_per_s for t in ts)
        results.append(Result(SUITE, n, "decode_tokens_per_s", rate, "tok/s"))
        if n in cpu:
            results.append(Result(SUITE, n, "host_cpu_ms_per_token", statistics.median(cpu[n]),
                                  "ms"))
        if around.get(n):
            ratios = paired_ratios([t.decode_tokens_per_s for t in ts], around[n])
            results.append(Result(SUITE, n, "vs_bare_paired", statistics.median(ratios), "x",
                                  samples=tuple(ratios)))
    return results


def paired_ratios(rates: list[float], around: list[tuple[float, float]]) -> list[float]:
    """Each rate over the mean of the baseline's rates (before, after) measured around it."""
    if len(rates) != len(around):
        raise ValueError(f"{len(rates)} rates but {len(around)} baseline pairs around them")
    if any(b <= 0 or a <= 0 for b, a in around):
        raise ValueError(f"baseline rates must be positive, got {around}")
    return [r * 2 / (b + a) for r, (b, a) in zip(rates, around, strict=True)]


def _config(options: BenchOptions, name: str, sizes: Sizes) -> EngineConfig:
    from aioengine import EngineConfig

    _, executor, transport = name.split("_")
    context = sizes.prompt_len + sizes.new_tokens
    blocks = 2 * -(-context // BLOCK_SIZE)  # room for the warm-up and one timed request
    # A small KV cache and batch: no memory profiling at start-up, one request at a time.
    return EngineConfig(model=options.model, executor=executor, transport=transport,
                        block_size=BLOCK_SIZE, num_kv_blocks=blocks, max_num_seqs=4,
                        max_model_len=context, max_num_batched_tokens=max(256, context),
                        num_threads=options.threads)


async def _one(client: AsyncMPClient, prompt: list[int], new_tokens: int) -> DecodeTiming:
    from aioengine import SamplingParams

    params = SamplingParams(max_tokens=new_tokens, temperature=0.0, ignore_eos=True)
    first: float | None = None
    last: float | None = None
    tokens = first_count = 0
    async for out in client.generate(prompt, params):
        now = time.perf_counter()
        if first is None and out.token_ids:
            first = now
            first_count = len(out.token_ids)
        last = now
        tokens = len(out.token_ids)
    if first is None or last is None:
        raise RuntimeError("the engine finished a request without output tokens")
    return DecodeTiming(tokens, first_count, first, last)
