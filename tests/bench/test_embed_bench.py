"""The embed bench in its smallest form (speed is not asserted): every row and metric there,
our vectors and scores agreeing with sentence-transformers'; and without sentence-transformers,
a message saying how to install it instead of a crash."""

from __future__ import annotations

import logging
import math

import pytest

from aioengine.bench import embed, suites
from aioengine.bench.options import BenchOptions

TINY = embed.Sizes(short=4, long=2, mixed=4, queries=1, docs_per_query=3, repeats=1)


def test_embed_suite_smallest_form() -> None:
    pytest.importorskip("sentence_transformers", reason=embed.INSTALL)
    assert suites.load("embed") is embed
    options = BenchOptions(only=(embed.OURS, embed.BASELINE), progress=False, threads=1)
    got = {(r.name, r.metric): r for r in embed.run(options, TINY)}
    for side in (embed.OURS, embed.BASELINE):
        for metric in ("short_emb_per_s", "long_emb_per_s", "mixed_emb_per_s",
                       "rerank_pairs_per_s"):
            r = got[(side, metric)]
            assert math.isfinite(r.value) and r.value > 0, (side, metric)
    for name in embed.SETS:
        assert got[(embed.OURS, f"{name}_cos_min")].value >= 0.9999, name
    assert got[(embed.OURS, "rerank_max_abs_diff")].value < 1e-4


def test_without_sentence_transformers_it_says_how_to_install(monkeypatch, caplog) -> None:
    monkeypatch.setattr(embed, "has_sentence_transformers", lambda: False)
    with caplog.at_level(logging.WARNING, logger=embed.__name__):
        assert embed.run(BenchOptions(only=(embed.BASELINE,), progress=False)) == []
    assert "pip install 'aioengine[bench]'" in caplog.text


def test_inputs_are_seeded_and_long_ones_are_long() -> None:
    import random

    words = embed.vocabulary_words(embed.EMBEDDER)
    assert len(words) > 10_000 and all(w.isalpha() for w in words)
    a = embed.make_texts(random.Random(0), words, "mixed", TINY)
    assert a == embed.make_texts(random.Random(0), words, "mixed", TINY)
    assert all(len(t.split()) == 300 for t in embed.make_texts(random.Random(0), words,
                                                                "long", TINY))
    pairs = embed.make_pairs(random.Random(0), words, TINY)
    assert len(pairs) == 3 and len({q for q, _ in pairs}) == 1
