"""The ``offline`` suite: ``LLM.generate`` throughput against transformers ``generate``.

A seeded synthetic workload (random prompt and output lengths; eos ignored, greedy) runs
through ``LLM.generate`` (continuous batching, ``max_num_seqs`` = the batch size) and through
transformers ``generate`` batched statically at the same batch size (see ``hf_baseline``).
Output tokens are counted from what came back. Metrics: ``output_tokens_per_s`` and
``requests_per_s``, the median of the timed repeats, after an untimed warm-up.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from dataclasses import dataclass

from aioengine.bench.hf_baseline import run_hf_baseline
from aioengine.bench.options import BenchOptions
from aioengine.bench.progress import Progress
from aioengine.bench.results import Result
from aioengine.bench.workload import TokenSpace, Workload, synthetic

SUITE = "offline"
BASELINE = "hf_transformers"
OURS = "aioengine"
SEED = 0
HF_TIMEOUT = 3600.0


@dataclass(frozen=True)
class Sizes:
    requests: int
    prompt_lens: tuple[int, int]
    output_lens: tuple[int, int]
    batch_size: int
    repeats: int


FULL = Sizes(requests=128, prompt_lens=(16, 512), output_lens=(16, 256), batch_size=32,
             repeats=3)
QUICK = Sizes(requests=32, prompt_lens=(16, 128), output_lens=(16, 64), batch_size=16,
              repeats=3)


def run(options: BenchOptions, sizes: Sizes | None = None) -> list[Result]:
    sizes = sizes or (QUICK if options.quick else FULL)
    space = TokenSpace.of_model(options.model)
    work = synthetic(space, sizes.requests, sizes.prompt_lens, sizes.output_lens, SEED)
    names = [n for n in (OURS, BASELINE) if options.wants(n)]
    results: list[Result] = []
    with Progress(len(names), SUITE, options.progress) as bar:
        if OURS in names:
            bar.label(OURS)
            warm = synthetic(space, sizes.batch_size, sizes.prompt_lens, (4, 8), SEED + 1)
            seconds, tokens = _run_aioengine(options, work, warm, sizes)
            results += _rows(OURS, tokens, len(work), seconds)
            bar.advance()
        if BASELINE in names:
            bar.label(BASELINE)
            with tempfile.TemporaryDirectory(prefix="bench-offline-") as tmp:
                hf = run_hf_baseline(options.model, work, sizes.batch_size, sizes.repeats,
                                     options.threads, os.path.join(tmp, "workload.json"),
                                     HF_TIMEOUT)
            results += _rows(BASELINE, hf.useful_tokens, len(work), hf.seconds)
            results.append(Result(SUITE, BASELINE, "padding_efficiency",
                                  hf.useful_tokens / hf.generated_tokens, "fraction"))
            bar.advance()
    return results


def _rows(name: str, tokens: int, requests: int, seconds: float) -> list[Result]:
    return [Result(SUITE, name, "output_tokens_per_s", tokens / seconds, "tok/s"),
            Result(SUITE, name, "requests_per_s", requests / seconds, "req/s")]


def _run_aioengine(options: BenchOptions, work: Workload, warm: Workload,
                   sizes: Sizes) -> tuple[float, int]:
    """Median seconds of the timed repeats and the output tokens one repeat produced."""
    from aioengine import LLM, EngineConfig, SamplingParams
    from aioengine.client.sync_client import SyncMPClient

    def params(w: Workload) -> list[SamplingParams]:
        return [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
                for n in w.output_lens]

    config = EngineConfig(model=options.model, max_num_seqs=sizes.batch_size,
                          max_model_len=max(work.longest, warm.longest),
                          num_threads=options.threads,
                          data_parallel_size=options.data_parallel_size)
    times, counts = [], []
    with LLM(config) as llm:
        client = llm.client
        assert isinstance(client, SyncMPClient)
        llm.generate(warm.prompts, params(warm), use_tqdm=False)
        for _ in range(sizes.repeats):
            # Every repeat starts cold: no prompt may hit blocks cached by the one before.
            client.call_async(client.async_client.reset_prefix_cache)
            t0 = time.perf_counter()
            outs = llm.generate(work.prompts, params(work), use_tqdm=False)
            times.append(time.perf_counter() - t0)
            counts.append(sum(len(o.token_ids) for o in outs))
    if len(set(counts)) != 1:
        raise RuntimeError(f"repeats of one greedy workload produced different token counts: "
                           f"{counts}")
    return statistics.median(times), counts[0]
