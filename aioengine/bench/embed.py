"""The ``embed`` suite: embeddings and reranking against sentence-transformers.

The same inputs, the same torch thread count (``--threads``, else the engine's policy for one
rank), one after the other in one run:

- ``aioengine``: every input its own ``AsyncMPClient.embed`` call, all sent at once (the
  engine batches them: each step pads its inputs in batches of similar length); reranking:
  one ``rerank(query, documents)`` per query, all queries at once.
- ``st_b32`` (the baseline; sentence-transformers' default batch) and ``st_b8``:
  ``SentenceTransformer(dir).encode(texts, batch_size=B)`` on the same model directory;
  ``CrossEncoder(dir).predict(pairs, batch_size=B)`` on the same reranker directory.

Input sets (seeded, words drawn from the model's vocabulary): ``short`` (8-12 words),
``long`` (300 words, cut at the model's 256 tokens by both sides) and ``mixed`` (3-300 words,
log-uniform: where padding waste matters). Reranking: queries of 4-8 words, each with 8
documents of 20-200 words (under the reranker's 512 tokens, so no truncation rule differs).

Metrics: ``<set>_emb_per_s`` and ``rerank_pairs_per_s`` (the median of the timed repeats,
after an untimed warm-up; each factor is against ``st_b32``), and on the ``aioengine`` row the
agreement with ``st_b32``'s outputs on the same inputs: ``<set>_cos_mean`` / ``_cos_min``
(cosine of our vector to theirs) and ``rerank_max_abs_diff`` (largest |score difference|).

The embedder is ``all-minilm-l6-v2`` (sentence-transformers/all-MiniLM-L6-v2 from the package
index) unless ``--model`` names another embedding model; the reranker is the ms-marco
MiniLM-L-12 cross-encoder rebuilt from a wheel's int8 ONNX export
(``aioengine.hub.onnx_rebuild``; building it once needs ``onnx``). sentence-transformers is
optional (``pip install 'aioengine[bench]'``): without it, only the ``aioengine`` rows run.
``--only`` takes row names (``aioengine``, ``st_b8``, ``st_b32``) and set names (``short``,
``long``, ``mixed``, ``rerank``).
"""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import math
import os
import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from aioengine.bench.options import BenchOptions
from aioengine.bench.progress import Progress
from aioengine.bench.results import Result

logger = logging.getLogger(__name__)

SUITE = "embed"
OURS = "aioengine"
BASELINE = "st_b32"
PEERS = {"st_b32": 32, "st_b8": 8}
EMBEDDER = "all-minilm-l6-v2"
SETS = ("short", "long", "mixed")
RERANK = "rerank"
SEED = 0
INSTALL = ("sentence-transformers is not installed: pip install 'aioengine[bench]' (or pip "
           "install sentence-transformers)")


@dataclass(frozen=True)
class Sizes:
    short: int
    long: int
    mixed: int
    queries: int
    docs_per_query: int
    repeats: int


FULL = Sizes(short=512, long=128, mixed=256, queries=16, docs_per_query=8, repeats=3)
QUICK = Sizes(short=32, long=8, mixed=16, queries=2, docs_per_query=4, repeats=1)


def has_sentence_transformers() -> bool:
    return importlib.util.find_spec("sentence_transformers") is not None


def run(options: BenchOptions, sizes: Sizes | None = None) -> list[Result]:
    sizes = sizes or (QUICK if options.quick else FULL)
    sides = _picked(options, (OURS, *PEERS))
    sets = _picked(options, (*SETS, RERANK))
    if any(s in PEERS for s in sides) and not has_sentence_transformers():
        logger.warning("embed: %s; only the aioengine rows run", INSTALL)
        sides = [s for s in sides if s not in PEERS]
    if not sides:
        return []
    model = EMBEDDER if options.model == "tiny" else options.model
    threads = _threads(options)
    rng = random.Random(SEED)
    words = vocabulary_words(model)
    texts = {name: make_texts(rng, words, name, sizes) for name in SETS if name in sets}
    pairs: list[tuple[str, str]] = []
    reranker = None
    if RERANK in sets:
        reranker = _reranker_dir()
        if reranker is not None:
            pairs = make_pairs(rng, words, sizes)
    repeats = sizes.repeats
    steps = len(sides) * (len(texts) + (1 if pairs else 0))
    ours: dict[str, Any] = {}
    peer: dict[str, Any] = {}
    results: list[Result] = []
    with Progress(steps, SUITE, options.progress) as bar:
        for side in sides:
            bar.label(side)
            if side == OURS:
                rates, outputs = asyncio.run(_aioengine(model, reranker, texts, pairs, threads,
                                                        repeats, bar))
                ours = outputs
            else:
                rates, outputs = _sentence_transformers(model, reranker, texts, pairs,
                                                        threads, PEERS[side], repeats, bar)
                if side == BASELINE:
                    peer = outputs
            results += [Result(SUITE, side, _rate_metric(name), statistics.median(v),
                               "pairs/s" if name == RERANK else "emb/s", samples=tuple(v))
                        for name, v in rates.items()]
    if ours and peer:
        results += agreement(ours, peer)
    return results


def _picked(options: BenchOptions, names: Sequence[str]) -> list[str]:
    """The names ``--only`` lists among ``names``; all of them when it lists none."""
    return [n for n in names if n in options.only] or list(names)


def _rate_metric(name: str) -> str:
    return "rerank_pairs_per_s" if name == RERANK else f"{name}_emb_per_s"


def _threads(options: BenchOptions) -> int:
    from aioengine.config import EngineConfig
    from aioengine.worker.threads import threads_per_rank

    return threads_per_rank(EngineConfig(model="tiny", num_threads=options.threads), 1)


def _reranker_dir() -> str | None:
    from aioengine.hub.onnx_rebuild import msmarco_reranker_dir

    try:
        return msmarco_reranker_dir()
    except ImportError as e:  # onnx, to build it the first time
        logger.warning("embed: the reranker rows are left out: building the reranker needs "
                       "the onnx package (pip install 'aioengine[bench]'): %s", e)
    except Exception as e:  # no package index, a changed wheel
        logger.warning("embed: the reranker rows are left out: its directory could not be "
                       "built: %s", e)
    return None


# ---- inputs -----------------------------------------------------------------------------------

def vocabulary_words(model: str) -> list[str]:
    """The whole lowercase words of the model's WordPiece vocabulary (no pieces, no
    specials), sorted: what the seeded texts are drawn from."""
    from aioengine.hub import resolve_model

    path = os.path.join(resolve_model(model, require_tokenizer=True).tokenizer_path,
                        "vocab.txt")
    if not os.path.isfile(path):
        raise ValueError(f"the embed suite draws its texts from a WordPiece vocab.txt, and "
                         f"{model!r} has none at {path}")
    with open(path, encoding="utf-8") as f:
        words = {w.strip() for w in f}
    return sorted(w for w in words if len(w) >= 2 and w.isascii() and w.isalpha()
                  and w.islower())


def _sentence(rng: random.Random, words: list[str], n: int) -> str:
    text = " ".join(rng.choice(words) for _ in range(n))
    return text[0].upper() + text[1:] + "."


def make_texts(rng: random.Random, words: list[str], name: str, sizes: Sizes) -> list[str]:
    if name == "short":
        return [_sentence(rng, words, rng.randint(8, 12)) for _ in range(sizes.short)]
    if name == "long":
        return [_sentence(rng, words, 300) for _ in range(sizes.long)]
    if name == "mixed":
        return [_sentence(rng, words, round(math.exp(rng.uniform(math.log(3), math.log(300)))))
                for _ in range(sizes.mixed)]
    raise ValueError(f"unknown input set {name!r}")


def make_pairs(rng: random.Random, words: list[str], sizes: Sizes) -> list[tuple[str, str]]:
    """``queries`` x ``docs_per_query`` (query, document) pairs, grouped by query."""
    pairs = []
    for _ in range(sizes.queries):
        query = _sentence(rng, words, rng.randint(4, 8)).rstrip(".") + "?"
        pairs += [(query, _sentence(rng, words, rng.randint(20, 200)))
                  for _ in range(sizes.docs_per_query)]
    return pairs


# ---- the two sides ------------------------------------------------------------------------------

def _timed(fn: Callable[[], Any], repeats: int) -> tuple[list[float], Any]:
    """The seconds of each of ``repeats`` timed calls, after one untimed call; and the last
    call's output."""
    out = fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return times, out


async def _aioengine(model: str, reranker: str | None, texts: dict[str, list[str]],
                     pairs: list[tuple[str, str]], threads: int, repeats: int,
                     bar: Progress) -> tuple[dict[str, list[float]], dict[str, Any]]:
    from aioengine import AsyncMPClient, EngineConfig

    rates: dict[str, list[float]] = {}
    outputs: dict[str, Any] = {}
    if texts:
        async with AsyncMPClient(EngineConfig(model=model, num_threads=threads)) as client:
            async def embed_all(batch: list[str]) -> np.ndarray:
                outs = await asyncio.gather(*(client.embed(t) for t in batch))
                return np.array([o.embedding for o in outs], dtype=np.float32)

            for name, batch in texts.items():
                await embed_all(batch)  # warm-up
                times = []
                for _ in range(repeats):
                    t0 = time.perf_counter()
                    outputs[name] = await embed_all(batch)
                    times.append(time.perf_counter() - t0)
                rates[name] = [len(batch) / t for t in times]
                bar.advance()
    if pairs and reranker is not None:
        groups = _by_query(pairs)
        async with AsyncMPClient(EngineConfig(model=reranker, num_threads=threads)) as client:
            async def rerank_all() -> np.ndarray:
                ranked = await asyncio.gather(*(client.rerank(q, docs) for q, docs in groups))
                scores = []
                for results in ranked:
                    by_index = {r.index: r.relevance_score for r in results}
                    scores += [by_index[i] for i in range(len(by_index))]
                return np.array(scores, dtype=np.float64)

            await rerank_all()
            times = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                outputs[RERANK] = await rerank_all()
                times.append(time.perf_counter() - t0)
            rates[RERANK] = [len(pairs) / t for t in times]
            bar.advance()
    return rates, outputs


def _by_query(pairs: list[tuple[str, str]]) -> list[tuple[str, list[str]]]:
    groups: dict[str, list[str]] = {}
    for q, d in pairs:
        groups.setdefault(q, []).append(d)
    return list(groups.items())


def _sentence_transformers(model: str, reranker: str | None, texts: dict[str, list[str]],
                           pairs: list[tuple[str, str]], threads: int, batch_size: int,
                           repeats: int, bar: Progress
                           ) -> tuple[dict[str, list[float]], dict[str, Any]]:
    import torch
    from sentence_transformers import CrossEncoder, SentenceTransformer
    from transformers.utils import logging as hf_logging

    from aioengine.hub import resolve_model

    hf_logging.disable_progress_bar()  # its "Loading weights" bars, under the suite's own
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    rates: dict[str, list[float]] = {}
    outputs: dict[str, Any] = {}
    try:
        if texts:
            st = SentenceTransformer(resolve_model(model).model_path, device="cpu")
            for name, batch in texts.items():
                times, outputs[name] = _timed(
                    lambda b=batch: st.encode(b, batch_size=batch_size, convert_to_numpy=True,
                                              show_progress_bar=False), repeats)
                rates[name] = [len(batch) / t for t in times]
                bar.advance()
            del st
        if pairs and reranker is not None:
            ce = CrossEncoder(reranker, device="cpu", max_length=512)
            times, scores = _timed(
                lambda: ce.predict(pairs, batch_size=batch_size, convert_to_numpy=True,
                                   show_progress_bar=False), repeats)
            outputs[RERANK] = np.asarray(scores, dtype=np.float64)
            rates[RERANK] = [len(pairs) / t for t in times]
            bar.advance()
    finally:
        torch.set_num_threads(before)
    return rates, outputs


def agreement(ours: dict[str, Any], peer: dict[str, Any]) -> list[Result]:
    """Our outputs against the baseline's on the same inputs."""
    results = []
    for name in SETS:
        if name in ours and name in peer:
            a, b = ours[name], peer[name]
            cos = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
            results += [Result(SUITE, OURS, f"{name}_cos_mean", float(cos.mean()), "cos"),
                        Result(SUITE, OURS, f"{name}_cos_min", float(cos.min()), "cos")]
    if RERANK in ours and RERANK in peer:
        diff = float(np.abs(ours[RERANK] - peer[RERANK]).max())
        results.append(Result(SUITE, OURS, "rerank_max_abs_diff", diff, "abs"))
    return results
