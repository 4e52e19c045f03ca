"""The ``embed`` suite: embeddings and reranking against sentence-transformers.

The same inputs, the same torch thread count (``--threads``, else the engine's policy for one
rank), every side loaded at once and the sides taking turns on each set, the order rotated each
round (so load that drifts on a shared machine hits every side alike):

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
import contextlib
import importlib.util
import logging
import math
import os
import random
import statistics
import time
from collections.abc import Awaitable, Callable, Sequence
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
    rng = random.Random(SEED)
    words = vocabulary_words(model)
    work: dict[str, Any] = {name: make_texts(rng, words, name, sizes)
                            for name in SETS if name in sets}
    reranker = _reranker_dir() if RERANK in sets else None
    if reranker is not None:
        work[RERANK] = make_pairs(rng, words, sizes)
    if not work:
        return []
    steps = sizes.repeats * len(work) * len(sides)
    with Progress(steps, SUITE, options.progress) as bar:
        rates, outputs = asyncio.run(_measure(model, reranker, work, sides, _threads(options),
                                              sizes.repeats, bar))
    results = [Result(SUITE, side, _rate_metric(name), statistics.median(v),
                      "pairs/s" if name == RERANK else "emb/s", samples=tuple(v))
               for (side, name), v in rates.items()]
    if OURS in outputs and BASELINE in outputs:
        results += agreement(outputs[OURS], outputs[BASELINE])
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

Runner = Callable[[Any], Awaitable[Any]]


async def _measure(model: str, reranker: str | None, work: dict[str, Any], sides: list[str],
                   threads: int, repeats: int, bar: Progress
                   ) -> tuple[dict[tuple[str, str], list[float]], dict[str, dict[str, Any]]]:
    """Every side loaded at once (an idle engine takes no CPU), one untimed call of each on
    each set, then ``repeats`` rounds in which each set runs on every side in turn, the order
    rotated each round: load that drifts during the run hits every side alike. Returns the
    rates by (side, set) and each side's outputs by set."""
    import torch

    async with contextlib.AsyncExitStack() as stack:
        runners: dict[str, dict[str, Runner]] = {}
        before = torch.get_num_threads()
        stack.callback(torch.set_num_threads, before)
        torch.set_num_threads(threads)  # this process's torch: the peer's (ours are children)
        for side in sides:
            bar.label(f"loading {side}")
            if side == OURS:
                runners[side] = await _aioengine(stack, model, reranker, work, threads)
            else:
                runners[side] = _sentence_transformers(model, reranker, work, PEERS[side])
        outputs = {side: {name: await run(work[name]) for name, run in by_set.items()}
                   for side, by_set in runners.items()}
        rates: dict[tuple[str, str], list[float]] = {}
        for r in range(repeats):
            for name, batch in work.items():
                for side in sides[r % len(sides):] + sides[:r % len(sides)]:
                    bar.label(f"{side} {name}")
                    t0 = time.perf_counter()
                    outputs[side][name] = await runners[side][name](batch)
                    rates.setdefault((side, name), []).append(
                        len(batch) / (time.perf_counter() - t0))
                    bar.advance()
    return rates, outputs


async def _aioengine(stack: contextlib.AsyncExitStack, model: str, reranker: str | None,
                     work: dict[str, Any], threads: int) -> dict[str, Runner]:
    """Embeddings: every input its own ``embed`` call, all at once. Reranking: one ``rerank``
    per query, all queries at once; scores back in the pairs' order."""
    from aioengine import AsyncMPClient, EngineConfig

    runners: dict[str, Runner] = {}
    if any(name in SETS for name in work):
        embedder = await stack.enter_async_context(
            AsyncMPClient(EngineConfig(model=model, num_threads=threads)))

        async def embed_all(batch: list[str]) -> np.ndarray:
            outs = await asyncio.gather(*(embedder.embed(t) for t in batch))
            return np.array([o.embedding for o in outs], dtype=np.float32)

        runners.update({name: embed_all for name in work if name in SETS})
    if RERANK in work and reranker is not None:
        scorer = await stack.enter_async_context(
            AsyncMPClient(EngineConfig(model=reranker, num_threads=threads)))

        async def rerank_all(pairs: list[tuple[str, str]]) -> np.ndarray:
            groups = _by_query(pairs)
            ranked = await asyncio.gather(*(scorer.rerank(q, docs) for q, docs in groups))
            scores: list[float] = []
            for results in ranked:
                by_index = {r.index: r.relevance_score for r in results}
                scores += [by_index[i] for i in range(len(by_index))]
            return np.array(scores, dtype=np.float64)

        runners[RERANK] = rerank_all
    return runners


def _by_query(pairs: list[tuple[str, str]]) -> list[tuple[str, list[str]]]:
    groups: dict[str, list[str]] = {}
    for q, d in pairs:
        groups.setdefault(q, []).append(d)
    return list(groups.items())


def _sentence_transformers(model: str, reranker: str | None, work: dict[str, Any],
                           batch_size: int) -> dict[str, Runner]:
    """``SentenceTransformer.encode`` and ``CrossEncoder.predict`` at ``batch_size`` (each
    call blocks the event loop, where nothing else runs meanwhile)."""
    from sentence_transformers import CrossEncoder, SentenceTransformer
    from transformers.utils import logging as hf_logging

    from aioengine.hub import resolve_model

    hf_logging.disable_progress_bar()  # its "Loading weights" bars, under the suite's own
    runners: dict[str, Runner] = {}
    if any(name in SETS for name in work):
        st = SentenceTransformer(resolve_model(model).model_path, device="cpu")

        async def encode(batch: list[str]) -> np.ndarray:
            return np.asarray(st.encode(batch, batch_size=batch_size, convert_to_numpy=True,
                                        show_progress_bar=False), dtype=np.float32)

        runners.update({name: encode for name in work if name in SETS})
    if RERANK in work and reranker is not None:
        ce = CrossEncoder(reranker, device="cpu", max_length=512)

        async def predict(pairs: list[tuple[str, str]]) -> np.ndarray:
            return np.asarray(ce.predict(pairs, batch_size=batch_size, convert_to_numpy=True,
                                         show_progress_bar=False), dtype=np.float64)

        runners[RERANK] = predict
    return runners


def agreement(ours: dict[str, Any], peer: dict[str, Any]) -> list[Result]:
    """Our outputs against the baseline's on the same inputs."""
    results = []
    for name in SETS:
        if name in ours and name in peer:
            a, b = ours[name].astype(np.float64), peer[name].astype(np.float64)
            cos = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
            results += [Result(SUITE, OURS, f"{name}_cos_mean", float(cos.mean()), "cos"),
                        Result(SUITE, OURS, f"{name}_cos_min", float(cos.min()), "cos")]
    if RERANK in ours and RERANK in peer:
        diff = float(np.abs(ours[RERANK] - peer[RERANK]).max())
        results.append(Result(SUITE, OURS, "rerank_max_abs_diff", diff, "abs"))
    return results
