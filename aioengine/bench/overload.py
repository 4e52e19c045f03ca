"""The ``serve`` suite's overload rows: admission control on vs off at twice the rate the
engine sustains, through ``AsyncMPClient`` (what ``python -m aioengine.serve`` runs on).

The sustainable rate is measured first (a burst of requests sent at once: completed requests
per second). Then the same Poisson workload at twice that rate runs against an engine without
limits (``overload_off``: every request is admitted and the queue grows for the whole run) and
one with ``max_queued_requests`` set to what the engine finishes in about half a second
(``overload_on``: the excess is refused at once, as the server's 503 would). Rows: TTFT/E2E
percentiles of the completed requests, goodput (completed requests per second), refused.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from aioengine.bench.latency import RequestRecord, summarize
from aioengine.bench.options import BenchOptions
from aioengine.bench.results import Result
from aioengine.bench.workload import TokenSpace, Workload, poisson_arrivals, synthetic

SUITE = "serve"
SEED = 2000
START_TIMEOUT = 600.0
QUEUE_SECONDS = 0.5  # admission bound: about this much work waiting
# The running batch is capped so that a queue forms in the scheduler, as it does when a real
# model's KV cache is full; with tiny's 256 default the whole overload would run at once.
MAX_NUM_SEQS = 16


@dataclass(frozen=True)
class OverloadSizes:
    calibrate: int  # requests in the burst that measures the sustainable rate
    seconds: float  # how long the overload lasts: rate x seconds requests per row
    prompt_lens: tuple[int, int]
    output_lens: tuple[int, int]


FULL = OverloadSizes(calibrate=48, seconds=12.0, prompt_lens=(16, 256), output_lens=(16, 128))
QUICK = OverloadSizes(calibrate=32, seconds=3.0, prompt_lens=(16, 128), output_lens=(16, 48))


async def run_overload(options: BenchOptions, sizes: OverloadSizes | None = None
                       ) -> list[Result]:
    import asyncio

    from aioengine import AsyncMPClient, EngineConfig

    sizes = sizes or (QUICK if options.quick else FULL)
    space = TokenSpace.of_model(options.model)
    burst = synthetic(space, sizes.calibrate, sizes.prompt_lens, sizes.output_lens, SEED)
    longest = sizes.prompt_lens[1] + sizes.output_lens[1]
    base = EngineConfig(model=options.model, num_threads=options.threads,
                        max_model_len=longest, max_num_seqs=MAX_NUM_SEQS)
    results: list[Result] = []
    async with AsyncMPClient(base) as client:
        await asyncio.wait_for(client.get_stats(), START_TIMEOUT)
        t0 = time.perf_counter()
        done = await asyncio.gather(*(_one(client, p, n) for p, n in
                                      zip(burst.prompts, burst.output_lens, strict=True)))
        capacity = sum(r.ok for r in done) / (time.perf_counter() - t0)
        rate = 2.0 * capacity
        count = max(8, math.ceil(rate * sizes.seconds))
        work = synthetic(space, count, sizes.prompt_lens, sizes.output_lens, SEED + 1)
        arrivals = poisson_arrivals(len(work), rate, SEED)
        results += await _row(client, "overload_off", work, arrivals, rate)
    limit = max(2, math.ceil(capacity * QUEUE_SECONDS))
    async with AsyncMPClient(base.replace(max_queued_requests=limit)) as client:
        await asyncio.wait_for(client.get_stats(), START_TIMEOUT)
        results += await _row(client, "overload_on", work, arrivals, rate)
    results.append(Result(SUITE, "overload_on", "max_queued_requests", limit, "count"))
    return results


async def _row(client, name: str, work: Workload, arrivals: list[float],
               rate: float) -> list[Result]:
    import asyncio

    t0 = time.perf_counter()

    async def fire(i: int) -> RequestRecord:
        await asyncio.sleep(max(0.0, t0 + arrivals[i] - time.perf_counter()))
        return await _one(client, work.prompts[i], work.output_lens[i])

    records = await asyncio.gather(*(fire(i) for i in range(len(work))))
    wall = time.perf_counter() - t0
    refused = sum(1 for r in records if r.error and r.error.startswith("EngineOverloaded"))
    rows = summarize(SUITE, name, records, wall, rate)
    rows.append(Result(SUITE, name, "refused", refused, "count"))
    return rows


async def _one(client, prompt: list[int], max_tokens: int) -> RequestRecord:
    from aioengine import EngineDeadError, EngineOverloadedError, SamplingParams

    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    rec = RequestRecord(sent_s=time.perf_counter())
    try:
        async for out in client.generate(prompt, params):
            rec.on_output(time.perf_counter(), len(out.token_ids))
    except (EngineDeadError, EngineOverloadedError, ValueError) as e:
        rec.error = f"{type(e).__name__}: {e}"
    rec.finish(time.perf_counter())
    return rec
