"""The ``serve`` suite: online latency under Poisson arrivals.

Requests (seeded synthetic prompts and output lengths, greedy, eos ignored) arrive as a
Poisson process at a given rate, each streamed by its own task, either through an
``AsyncMPClient`` in this process or, with ``--endpoint URL``, over HTTP to any
OpenAI-compatible server (``python -m aioengine.serve`` included). One row per rate
(``client_4rps``, ``http_4rps``): TTFT, ITL, TPOT and E2E at p50/p90/p99 (see ``latency``),
achieved requests and output tokens per second, errors, and the offered rate. ``--rate R``
runs that rate only; otherwise quick runs one rate and full mode sweeps several, and both
add the overload rows (``aioengine.bench.overload``: admission control on vs off at twice the
sustainable rate).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from aioengine.bench.latency import RequestRecord, summarize
from aioengine.bench.options import BenchOptions
from aioengine.bench.progress import Progress
from aioengine.bench.results import Result
from aioengine.bench.workload import TokenSpace, Workload, poisson_arrivals, synthetic

if TYPE_CHECKING:
    from aioengine import AsyncMPClient

SUITE = "serve"
BASELINE = None  # rows are rates, not competitors
SEED = 0
START_TIMEOUT = 600.0
RATE_TIMEOUT = 1800.0  # a whole rate's requests; a stuck server fails the suite, never hangs

Send = Callable[[list[int], int], Awaitable[RequestRecord]]


@dataclass(frozen=True)
class Sizes:
    requests: int  # per rate
    prompt_lens: tuple[int, int]
    output_lens: tuple[int, int]
    rates: tuple[float, ...]  # requests per second
    warmup: int


FULL = Sizes(requests=48, prompt_lens=(16, 256), output_lens=(16, 128), rates=(1, 2, 4, 8),
             warmup=2)
QUICK = Sizes(requests=16, prompt_lens=(16, 128), output_lens=(16, 48), rates=(4,), warmup=1)


def run(options: BenchOptions, sizes: Sizes | None = None) -> list[Result]:
    sizes = sizes or (QUICK if options.quick else FULL)
    rates = (options.rate,) if options.rate is not None else sizes.rates
    space = TokenSpace.of_model(options.model)
    # A different seed per rate: the same prompts again would hit the prefix cache.
    works = [synthetic(space, sizes.requests, sizes.prompt_lens, sizes.output_lens, SEED + i)
             for i in range(len(rates))]
    warm = synthetic(space, sizes.warmup, sizes.prompt_lens, (4, 8), SEED + 1000)
    return asyncio.run(_run(options, sizes, rates, works, warm))


async def _run(options: BenchOptions, sizes: Sizes, rates: tuple[float, ...],
               works: list[Workload], warm: Workload) -> list[Result]:
    results: list[Result] = []
    with Progress(len(rates) * sizes.requests, SUITE, options.progress) as bar:
        if options.endpoint is not None:
            from aioengine.bench.http_driver import HTTPDriver

            async with HTTPDriver(options.endpoint) as http:
                results = await _sweep("http", http.one, rates, works, warm, bar)
        else:
            from aioengine import AsyncMPClient, EngineConfig

            longest = max(w.longest for w in [*works, warm])
            client = AsyncMPClient(EngineConfig(model=options.model, max_model_len=longest,
                                                num_threads=options.threads,
                                                data_parallel_size=options.data_parallel_size))
            try:
                await asyncio.wait_for(client.start(), START_TIMEOUT)
                results = await _sweep("client", lambda p, n: _client_one(client, p, n),
                                       rates, works, warm, bar)
            finally:
                await client.shutdown()
    if options.endpoint is None and options.rate is None and options.wants("overload"):
        from aioengine.bench.overload import run_overload

        results += await run_overload(options)
    return results


async def _sweep(kind: str, send: Send, rates: tuple[float, ...], works: list[Workload],
                 warm: Workload, bar: Progress) -> list[Result]:
    for prompt, n in zip(warm.prompts, warm.output_lens, strict=True):
        rec = await send(prompt, n)
        if not rec.ok:
            raise RuntimeError(f"the warm-up request failed: {rec.error}")
    results: list[Result] = []
    for i, (rate, work) in enumerate(zip(rates, works, strict=True)):
        name = f"{kind}_{rate:g}rps"
        bar.label(name)
        arrivals = poisson_arrivals(len(work), rate, SEED + i)
        records, wall = await asyncio.wait_for(_at_rate(send, work, arrivals, bar),
                                               RATE_TIMEOUT)
        results += summarize(SUITE, name, records, wall, rate)
    return results


async def _at_rate(send: Send, work: Workload, arrivals: list[float],
                   bar: Progress) -> tuple[list[RequestRecord], float]:
    """Fire each request at its arrival time; returns the records and the wall time from the
    first send to the last completion."""
    records: list[RequestRecord | None] = [None] * len(work)
    t0 = time.perf_counter()

    async def fire(i: int) -> None:
        await asyncio.sleep(max(0.0, t0 + arrivals[i] - time.perf_counter()))
        records[i] = await send(work.prompts[i], work.output_lens[i])
        bar.advance()

    async with asyncio.TaskGroup() as tg:
        for i in range(len(work)):
            tg.create_task(fire(i))
    wall = time.perf_counter() - t0
    assert all(r is not None for r in records)
    return records, wall  # type: ignore[return-value]


async def _client_one(client: AsyncMPClient, prompt: list[int], max_tokens: int
                      ) -> RequestRecord:
    """One streamed request; a failure is recorded (an error row), not raised."""
    from aioengine import EngineDeadError, SamplingParams

    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    rec = RequestRecord(sent_s=time.perf_counter())
    try:
        async for out in client.generate(prompt, params):
            rec.on_output(time.perf_counter(), len(out.token_ids))
            if out.finished and out.finish_reason not in ("length", "stop"):
                rec.error = f"finished with {out.finish_reason}: {out.error}"
    except (EngineDeadError, ValueError) as e:
        rec.error = f"{type(e).__name__}: {e}"
    rec.finish(time.perf_counter())
    return rec
