"""The ``structured`` suite: what a JSON-schema constraint costs.

Rows:

- ``unconstrained`` (the baseline) and ``json_schema``: decode tokens per second through
  ``AsyncMPClient`` at batch 1 and 16, the same requests (prompt, seeds, length) with and
  without a 20-field JSON schema, alternating A/B and B/A in one run; ``vs_unconstrained`` is the
  median of each constrained batch's rate over its neighbouring unconstrained batch's. The
  ``_mp`` rows: the same with the mp executor (steps scheduled ahead when unconstrained).
- ``compile_20_fields``: grammar compile time of a 20-field schema, cold (a new schema each
  time) and cached (the same schema again), through the engine's ``GrammarManager``.
- ``mask_150k``: llguidance's per-step mask time at batch 1 and 32 with a 150k vocabulary (the
  model's tokenizer padded with tokens made of two of its tokens, as BPE merges make them;
  no 150k tokenizer ships here), matchers walked along random allowed tokens.
- ``xgrammar_150k`` (only where ``xgrammar`` imports): the same compile and mask figures.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import statistics
import tempfile
import time
from typing import Any

import numpy as np

from aioengine.bench.options import BenchOptions
from aioengine.bench.progress import Progress
from aioengine.bench.results import Result
from aioengine.bench.workload import TokenSpace

SUITE = "structured"
BASELINE = "unconstrained"
SEED = 0
PROMPT_LEN = 16
NEW_TOKENS = 64
BIG_VOCAB = 150_000


def schema_20(tag: str = "") -> dict[str, Any]:
    """20 bounded fields (ints, bools, enums): an output of ~120 tokens, longer than the
    measured ``NEW_TOKENS``, so constrained and unconstrained requests generate alike."""
    props: dict[str, Any] = {}
    for i in range(20):
        kind = i % 3
        props[f"{tag}field_{i}"] = ({"type": "integer", "minimum": 0, "maximum": 100000}
                                    if kind == 0 else {"type": "boolean"} if kind == 1
                                    else {"enum": ["alpha", "beta", "gamma", "delta"]})
    return {"type": "object", "properties": props, "required": list(props),
            "additionalProperties": False}


def run(options: BenchOptions) -> list[Result]:
    results: list[Result] = []
    repeats = 3 if options.quick else 8
    if options.wants(BASELINE) or options.wants("json_schema"):
        results += asyncio.run(_decode(options, repeats, "uniproc"))
    if options.wants(BASELINE + "_mp") or options.wants("json_schema_mp"):
        results += asyncio.run(_decode(options, repeats, "mp"))
    if options.wants("compile_20_fields"):
        results += _compile(options, 10 if options.quick else 40)
    if options.wants("mask_150k") or options.wants("xgrammar_150k"):
        results += _masks(options, 60 if options.quick else 200)
    return results


# ---- decode with and without the constraint -------------------------------------------------

async def _decode(options: BenchOptions, repeats: int, executor: str) -> list[Result]:
    """``executor="mp"``: the worker in its own process, where the engine schedules each step
    ahead of the one in flight, except while a constrained request runs (its mask needs the
    token being sampled): the ``_mp`` rows price that too."""
    from aioengine import AsyncMPClient, EngineConfig, SamplingParams, StructuredOutputs

    space = TokenSpace.of_model(options.model)
    rng = random.Random(SEED)
    prompts = [space.draw(rng, PROMPT_LEN) for _ in range(16)]
    spec = StructuredOutputs(json=schema_20())
    config = EngineConfig(model=options.model, max_model_len=PROMPT_LEN + 4 * NEW_TOKENS,
                          max_num_seqs=16, num_threads=options.threads, executor=executor)
    suffix = "" if executor == "uniproc" else f"_{executor}"

    def params(i: int, constrained: bool) -> SamplingParams:
        if constrained:
            return SamplingParams(max_tokens=NEW_TOKENS, temperature=1.0, seed=i,
                                  structured_outputs=spec)
        return SamplingParams(max_tokens=NEW_TOKENS, temperature=1.0, seed=i, ignore_eos=True)

    async def one(client: Any, prompt: list[int], p: SamplingParams) -> tuple[float, float, int]:
        first = end = 0.0
        n = 0
        async for out in client.generate(prompt, p):
            now = time.perf_counter()
            if not first:
                first = now
            end, n = now, len(out.token_ids)
        return first, end, n

    async def batch(client: Any, b: int, constrained: bool) -> float:
        runs = await asyncio.gather(*(one(client, prompts[i], params(i, constrained))
                                      for i in range(b)))
        start = max(f for f, _, _ in runs)  # every request is decoding from here on
        end = max(e for _, e, _ in runs)
        tokens = sum(n - 1 for _, _, n in runs)
        return tokens / (end - start)

    rates: dict[tuple[str, int], list[float]] = {}
    ratios: dict[int, list[float]] = {1: [], 16: []}
    async with AsyncMPClient(config) as client:
        for b in (1, 16):  # warm-up: start-up, the grammar's compile, first-use costs
            await batch(client, b, True)
            await batch(client, b, False)
        with Progress(repeats * 4, SUITE, options.progress) as bar:
            for r in range(repeats):
                for b in (1, 16):
                    order = (False, True) if r % 2 == 0 else (True, False)
                    got = {}
                    for constrained in order:
                        bar.label(f"{'json_schema' if constrained else BASELINE}{suffix} b{b}")
                        got[constrained] = await batch(client, b, constrained)
                        bar.advance()
                    for constrained, rate in got.items():
                        name = ("json_schema" if constrained else BASELINE) + suffix
                        rates.setdefault((name, b), []).append(rate)
                    ratios[b].append(got[True] / got[False])
    results = [Result(SUITE, name, f"decode_tok_s_b{b}", statistics.median(v), "tok/s",
                      samples=tuple(v)) for (name, b), v in rates.items()]
    results += [Result(SUITE, "json_schema" + suffix, f"vs_unconstrained_b{b}",
                       statistics.median(v), "x", samples=tuple(v)) for b, v in ratios.items()]
    return results


# ---- compile --------------------------------------------------------------------------------

def _tokenizer_of(model: str) -> tuple[str, int, list[int]]:
    from aioengine.hub import read_model_info, resolve_model

    resolved = resolve_model(model, require_tokenizer=True)
    info = read_model_info(resolved.model_path)
    return (os.path.join(resolved.tokenizer_path, "tokenizer.json"), info.vocab_size,
            list(info.eos_token_ids))


def _compile(options: BenchOptions, repeats: int) -> list[Result]:
    from aioengine.engine.grammars import GrammarManager
    from aioengine.messages import StructuredOutputs

    path, vocab, eos = _tokenizer_of(options.model)
    manager = GrammarManager(path, vocab, eos)
    t0 = time.perf_counter()
    _ = manager.backend  # the tokenizer's tables: once per engine
    load_ms = (time.perf_counter() - t0) * 1000
    cold, cached = [], []
    try:
        for i in range(repeats):
            spec = StructuredOutputs(json=schema_20(tag=f"r{i}_"))  # a new key: a real compile
            t0 = time.perf_counter()
            manager.compile(spec).result()
            cold.append((time.perf_counter() - t0) * 1000)
            t0 = time.perf_counter()
            manager.compile(StructuredOutputs(json=schema_20(tag=f"r{i}_"))).result()
            cached.append((time.perf_counter() - t0) * 1000)
    finally:
        manager.shutdown()
    return [Result(SUITE, "compile_20_fields", "cold_ms_p50", statistics.median(cold), "ms",
                   samples=tuple(cold)),
            Result(SUITE, "compile_20_fields", "cached_ms_p50", statistics.median(cached), "ms",
                   samples=tuple(cached)),
            Result(SUITE, "compile_20_fields", "tokenizer_load_ms", load_ms, "ms")]


# ---- per-step mask time at a 150k vocabulary ------------------------------------------------

def big_tokenizer(path: str, out_dir: str, size: int = BIG_VOCAB, seed: int = SEED) -> str:
    """A tokenizer.json with ``size`` tokens: the model's, padded with tokens that join two of
    its tokens (what BPE merges make). Written into ``out_dir``; returns its path."""
    with open(path, encoding="utf-8") as f:
        doc = json.load(f)
    vocab: dict[str, int] = doc["model"]["vocab"]
    specials = {t["content"] for t in doc.get("added_tokens", [])}
    pieces = [t for t in vocab if t not in specials]
    rng = random.Random(seed)
    next_id = max(max(vocab.values()), *(t["id"] for t in doc.get("added_tokens", []))) + 1
    while next_id < size:
        token = rng.choice(pieces) + rng.choice(pieces)
        if token not in vocab:
            vocab[token] = next_id
            next_id += 1
    out = os.path.join(out_dir, "tokenizer.json")
    with open(out, "w", encoding="utf-8") as f:
        json.dump(doc, f)
    return out


def _masks(options: BenchOptions, steps: int) -> list[Result]:
    path, _, eos = _tokenizer_of(options.model)
    results: list[Result] = []
    with tempfile.TemporaryDirectory(prefix="aioengine-bench-") as tmp:
        big = big_tokenizer(path, tmp)
        if options.wants("mask_150k"):
            results += _llguidance_masks(big, eos, steps)
        if options.wants("xgrammar_150k"):
            results += _xgrammar(big, eos, steps)
    return results


def _walk(rng: random.Random, row: np.ndarray) -> int:
    allowed = np.flatnonzero(np.unpackbits(row.view(np.uint8), bitorder="little"))
    return int(rng.choice(allowed))


def _llguidance_masks(path: str, eos: list[int], steps: int) -> list[Result]:
    from aioengine.messages import StructuredOutputs
    from aioengine.structured import GrammarBackend

    t0 = time.perf_counter()
    backend = GrammarBackend(path, BIG_VOCAB, eos)
    load_ms = (time.perf_counter() - t0) * 1000
    compiled = backend.compile(StructuredOutputs(json=schema_20()))
    rng = random.Random(SEED)
    results = [Result(SUITE, "mask_150k", "tokenizer_load_ms", load_ms, "ms")]
    for b in (1, 32):
        matchers = [backend.matcher(compiled) for _ in range(b)]
        out = np.zeros((b, backend.words), dtype=np.int32)
        times = []
        for _ in range(steps):
            t0 = time.perf_counter()
            backend.fill_bitmask(matchers, out)
            times.append((time.perf_counter() - t0) * 1e6)
            for i, m in enumerate(matchers):
                if m.is_terminated or not m.accept(_walk(rng, out[i])) or m.is_terminated:
                    matchers[i] = backend.matcher(compiled)
        results.append(Result(SUITE, "mask_150k", f"mask_us_per_step_b{b}",
                              statistics.median(times), "us", samples=tuple(times)))
    return results


def _xgrammar(path: str, eos: list[int], steps: int) -> list[Result]:
    try:
        import torch
        import xgrammar as xgr
        from transformers import PreTrainedTokenizerFast
    except ImportError:
        return []
    hf = PreTrainedTokenizerFast(tokenizer_file=path)
    t0 = time.perf_counter()
    info = xgr.TokenizerInfo.from_huggingface(hf, vocab_size=BIG_VOCAB, stop_token_ids=eos)
    compiler = xgr.GrammarCompiler(info, cache_enabled=False)
    load_ms = (time.perf_counter() - t0) * 1000
    cold = []
    for i in range(5):
        t0 = time.perf_counter()
        compiled = compiler.compile_json_schema(json.dumps(schema_20(tag=f"x{i}_")),
                                                any_whitespace=False)
        cold.append((time.perf_counter() - t0) * 1000)
    rng = random.Random(SEED)
    results = [Result(SUITE, "xgrammar_150k", "tokenizer_load_ms", load_ms, "ms"),
               Result(SUITE, "xgrammar_150k", "cold_ms_p50", statistics.median(cold), "ms",
                      samples=tuple(cold))]
    for b in (1, 32):
        matchers = [xgr.GrammarMatcher(compiled) for _ in range(b)]
        mask = xgr.allocate_token_bitmask(b, BIG_VOCAB)
        batch = xgr.BatchGrammarMatcher() if b > 1 and hasattr(xgr, "BatchGrammarMatcher") \
            else None
        times = []
        for _ in range(steps):
            t0 = time.perf_counter()
            if batch is not None:
                batch.batch_fill_next_token_bitmask(matchers, mask)
            else:
                for i, m in enumerate(matchers):
                    m.fill_next_token_bitmask(mask, i)
            times.append((time.perf_counter() - t0) * 1e6)
            rows = mask.numpy() if isinstance(mask, torch.Tensor) else mask
            for i, m in enumerate(matchers):
                if m.is_terminated() or not m.accept_token(_walk(rng, rows[i])) \
                        or m.is_terminated():
                    matchers[i] = xgr.GrammarMatcher(compiled)
        results.append(Result(SUITE, "xgrammar_150k", f"mask_us_per_step_b{b}",
                              statistics.median(times), "us", samples=tuple(times)))
    return results
