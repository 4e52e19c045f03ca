"""The ``peers`` suite: aioengine side by side with llama.cpp on the same GGUF files.

``python -m aioengine.bench peers --model FILE.gguf --llama-cpp DIR`` (``DIR`` holds
``llama-bench`` and ``llama-server``, or their ``bin/``), or ``--build-llama-cpp`` to build
llama.cpp once from the sources vendored in the ``llama-cpp-python`` sdist into
``$AIOENGINE_CACHE/llama.cpp`` (pip, cmake and a C++ compiler; ~10+ minutes on 2 cores). A
llama.cpp built there earlier is found by itself. Without one, quick mode skips the suite
with a message (``make bench`` stays build-free) and full mode fails saying how to get one.
``--model`` may also be a package model (``smollm2-135m-instruct``: its Q4_1 file).

``--quants f32,q8_0,q4_1,q4_k_m`` measures one file of each type in one run: the model's own
file where it is that type, the others made from it once with ``llama-quantize`` and cached
next to the build (``llama_cpp.model_files``). Our engine keeps a quantized file's blocks
(``--quantization``, default ``gguf``) and runs float files in float32. ``--no-x8`` keeps our
quantized weights in the file's row layout (A/B of the x8 layout). ``--only decode`` or
``--only serve`` runs one half (short holds of a shared machine's bench lock); ``--only
llama.cpp`` or ``aioengine`` one side.

Rows (names ``aioengine`` and ``llama.cpp``, the baseline; every metric starts with the file's
type, e.g. ``q4_1.decode_tok_s_t1``), A/B alternated per round:

- ``decode_tok_s_t{1,2}``: batch-1 decode tokens per second at that many threads (llama-bench
  ``-p 0 -n N``; ours: ``ModelRunner.execute`` steps with ``num_threads=T``, greedy);
- ``default_threads`` and ``decode_tok_s_tdefault``: the threads our engine's linears run on
  when ``num_threads`` is unset (what ``python -m aioengine.serve`` uses: picked at load, per
  machine and model) and the decode at that default; llama.cpp's row is its figure at the same
  count; ``default_threads_measured``: 1 where the child measured that count at its start (no
  cached one yet, or a busy machine), 0 where it read it back (median over rounds);
- ``prefill512_tok_s_t{1,2}``: one 512-token prompt (llama-bench ``-p 512 -n 0``);
- ``read_gbytes_per_s_{huge,4k}_t{T}`` (``machine``): the read bandwidth at T threads of 2 MiB
  transparent huge pages and of 4 KiB pages (``child.read_bandwidth``: one GEMV pass over 256
  MiB), measured in each of our decode children right after its decode;
  ``weights_huge_fraction``: the share of our decode weights' bytes on huge pages (smaps);
  ``decode_bw_fraction_t{T}``: weight bytes read per second at batch-1 decode over the
  bandwidth of the pages the weights are on (huge where at least half are), at T threads;
- ``x8_fraction``, ``float_fraction``: of our quantized weights' bytes, the share in the x8
  layout and the share run as float rows (a tensor type without a kernel of ours);
- serving (full mode; ``serving``): both servers up, the same requests through the same HTTP
  driver: ``serve_*`` at 8 concurrent streams, ``serve_{R}rps_*`` at Poisson arrivals of R
  requests/s (1, 2, 4, 8): output tok/s, TTFT/ITL p50/p90; start-up seconds to a 200 on
  ``/health``; resident MB of the process tree, the most seen under the 8-stream load
  (``serve_rss_mb``) and over every stage (``serve_rss_max_mb``: llama-server keeps a prompt
  cache of up to 8 GiB in host memory by default, ``--cache-ram``, which grows with the rates);
  the same as proportional set size (``serve_pss_mb``, ``serve_pss_max_mb``: a page several
  processes of the tree map, such as the shared-memory rings, counts once).
"""

from __future__ import annotations

import os
import statistics
import sys
from dataclasses import dataclass, replace
from pathlib import Path

from aioengine.bench.options import BenchOptions
from aioengine.bench.peers import procs
from aioengine.bench.peers.child import (
    PAGES,
    decode_read_bytes,
    ours_child,
    read_bandwidth,
)
from aioengine.bench.peers.llama_cpp import (
    FLOAT_TYPES,
    NoLlamaCpp,
    find_llama_cpp,
    llama_bench,
    llama_cpp_dir,
    model_files,
    parse_llama_bench,
    parse_quants,
)
from aioengine.bench.peers.serving import BASELINE, OURS, free_port, server_command, serving_rows
from aioengine.bench.results import Result
from aioengine.runtime.heap_env import model_process_env

__all__ = ["BASELINE", "OURS", "NoLlamaCpp", "decode_read_bytes", "find_llama_cpp",
           "parse_llama_bench", "read_bandwidth", "run"]

SUITE = "peers"
STAGES = ("decode", "serve")
"""``--only`` names that pick a half of the suite."""


@dataclass(frozen=True)
class Sizes:
    threads: tuple[int, ...]
    rounds: int
    decode_tokens: int
    prefill_len: int
    serve_requests: int  # 0: no serving rows
    serve_streams: int
    prompt_lens: tuple[int, int]
    output_lens: tuple[int, int]
    rates: tuple[float, ...] = ()  # Poisson arrivals, requests/s
    rate_requests: int = 0


FULL = Sizes(threads=(1, 2), rounds=2, decode_tokens=64, prefill_len=512, serve_requests=24,
             serve_streams=8, prompt_lens=(16, 256), output_lens=(32, 128),
             rates=(1, 2, 4, 8), rate_requests=20)
QUICK = Sizes(threads=(1, 2), rounds=1, decode_tokens=16, prefill_len=128, serve_requests=0,
              serve_streams=8, prompt_lens=(16, 64), output_lens=(8, 16))


def source_file(model: str) -> str:
    """The GGUF file behind ``--model``: a ``.gguf`` path, or a package model's file."""
    from aioengine.hub.package_models import PACKAGE_MODELS, fetch_package_model

    if model in PACKAGE_MODELS:
        return fetch_package_model(model)
    if model.endswith(".gguf") and os.path.isfile(model):
        return model
    raise ValueError(f"the peers suite compares on GGUF files: --model FILE.gguf or a package "
                     f"model ({', '.join(PACKAGE_MODELS)}) (got {model!r})")


def run(options: BenchOptions) -> list[Result]:
    """Every row; SIGTERM (``timeout``, ``kill``) or Ctrl-C stops the servers and children it
    started and waits for them (``procs.guarded``), and they die with a killed bench."""
    with procs.guarded():
        return _run(options)


def _run(options: BenchOptions) -> list[Result]:
    sizes = QUICK if options.quick else FULL
    if options.threads is not None:
        sizes = replace(sizes, threads=(options.threads,))
    if options.rate is not None:
        sizes = replace(sizes, rates=(options.rate,))
    quants = parse_quants(options.quants)
    try:
        try:
            bindir: Path | None = llama_cpp_dir(options.llama_cpp, options.build_llama_cpp)
        except NoLlamaCpp:
            if options.llama_cpp is not None or BASELINE in _picked(options.only,
                                                                    (BASELINE, OURS)):
                raise
            bindir = None  # ``--only aioengine``: llama.cpp only to make files of other types
        files = model_files(source_file(options.model), quants, bindir)
    except (NoLlamaCpp, ValueError) as e:
        if options.quick:
            print(f"suite peers skipped: {e}", file=sys.stderr, flush=True)
            return []
        raise
    # our decode child runs the model itself: it starts as an engine process would
    env = {**os.environ, **model_process_env()}
    rows: list[Result] = []
    for quant, path in files:
        rows += file_rows(quant, path, bindir, sizes, options, env)
    return rows


def _picked(only: tuple[str, ...], among: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(n for n in among if n in only) or among


def file_rows(quant: str, path: str, bindir: Path | None, sizes: Sizes, options: BenchOptions,
              env: dict[str, str]) -> list[Result]:
    """Every row of one file; metrics start with its type (``q4_1.decode_tok_s_t1``)."""
    sides = _picked(options.only, (BASELINE, OURS))
    stages = _picked(options.only, STAGES)
    quantization = None if quant in FLOAT_TYPES else (options.quantization or "gguf")
    samples: dict[tuple[str, str], list[float]] = {}
    units: dict[str, str] = {}

    def add(name: str, metric: str, value: float, unit: str = "tok/s") -> None:
        metric = f"{quant}.{metric}"
        samples.setdefault((name, metric), []).append(value)
        units[metric] = unit
        if options.progress:  # each figure as it comes: a long run cut short keeps them
            print(f"peers: {name} {metric} {value:.4g}", file=sys.stderr, flush=True)

    spec = {"model": path, "decode_tokens": sizes.decode_tokens,
            "prefill_len": sizes.prefill_len, "quantization": quantization, "x8": options.x8}
    if "decode" in stages:
        llama: dict[int, list[float]] = {}
        for _ in range(sizes.rounds):
            for t in sizes.threads:
                if BASELINE in sides:
                    dec, pre = llama_bench(bindir, path, t, sizes.decode_tokens,
                                           sizes.prefill_len)
                    llama.setdefault(t, []).append(dec)
                    add(BASELINE, f"decode_tok_s_t{t}", dec)
                    add(BASELINE, f"prefill{sizes.prefill_len}_tok_s_t{t}", pre)
                if OURS in sides:
                    got = ours_child({**spec, "threads": t}, env)
                    for pages in PAGES:
                        add("machine", f"read_gbytes_per_s_{pages}_t{t}",
                            got[f"read_gbytes_per_s_{pages}"], "GB/s")
                    # over the bandwidth of the pages the weights are on, at the same count
                    on = "huge" if got["weights_huge_fraction"] >= 0.5 else "4k"
                    add(OURS, "weights_huge_fraction", got["weights_huge_fraction"], "fraction")
                    add(OURS, f"decode_bw_fraction_t{t}", got["decode_tok_s"]
                        * got["weight_bytes"] / 1e9 / got[f"read_gbytes_per_s_{on}"],
                        "fraction")
                    add(OURS, f"decode_tok_s_t{t}", got["decode_tok_s"])
                    add(OURS, f"prefill{sizes.prefill_len}_tok_s_t{t}", got["prefill_tok_s"])
            if OURS in sides:
                got = ours_child({**spec, "threads": None, "decode_only": True}, env)
                n = int(got["threads"])
                add(OURS, "default_threads", n, "threads")
                # 1: measured at this start (no cache yet, or a busy machine), 0: read back
                add(OURS, "default_threads_measured", got["threads_measured"], "fraction")
                add(OURS, "decode_tok_s_tdefault", got["decode_tok_s"])
                add(OURS, "x8_fraction", got["x8_fraction"], "fraction")
                add(OURS, "float_fraction", got["float_fraction"], "fraction")
                if BASELINE in sides:
                    if n not in sizes.threads:  # a count the rounds do not measure
                        llama.setdefault(n, []).append(llama_bench(
                            bindir, path, n, sizes.decode_tokens, sizes.prefill_len)[0])
                    add(BASELINE, "decode_tok_s_tdefault", llama[n][-1])
    rows = [Result(SUITE, name, metric, statistics.median(vals), units[metric],
                   samples=tuple(vals)) for (name, metric), vals in samples.items()]
    if "serve" in stages and sizes.serve_requests:
        rows += serve_rows(quant, path, bindir, sizes, quantization, sides, env,
                           options.progress)
    return rows


def serve_rows(quant: str, path: str, bindir: Path | None, sizes: Sizes, quantization: str | None,
               sides: tuple[str, ...], env: dict[str, str], progress: bool) -> list[Result]:
    from aioengine.bench.workload import TokenSpace, synthetic

    space = TokenSpace.of_model(path)
    closed = synthetic(space, sizes.serve_requests, sizes.prompt_lens, sizes.output_lens, 7)
    # another seed per rate: the same prompts again would hit the servers' prefix caches
    rated = [(rate, synthetic(space, sizes.rate_requests, sizes.prompt_lens,
                              sizes.output_lens, 100 + i)) for i, rate in enumerate(sizes.rates)]
    ctx = sizes.prompt_lens[1] + sizes.output_lens[1] + 16
    servers = []
    for kind in sides:
        port = free_port()
        servers.append((kind, server_command(kind, bindir, path, port, max(sizes.threads),
                                             sizes.serve_streams, ctx, quantization),
                        port, env if kind == OURS else None))
    rows: list[Result] = []

    def report(kind: str, metric: str, value: float, unit: str) -> None:
        rows.append(Result(SUITE, kind, f"{quant}.{metric}", value, unit))
        if progress:
            print(f"peers: {kind} {quant}.{metric} {value:.4g}", file=sys.stderr, flush=True)

    serving_rows(servers, closed, sizes.serve_streams, rated, report)
    return rows

