"""The offline bench: the synthetic workload, and the suite end to end in its smallest form
(LLM.generate against transformers generate; speed is not asserted here)."""

from __future__ import annotations

import math
import random
import subprocess
import sys
from pathlib import Path

import pytest

from aioengine.bench import offline
from aioengine.bench.options import BenchOptions
from aioengine.bench.workload import TokenSpace, Workload, synthetic

ROOT = Path(__file__).resolve().parents[2]
SMALL = offline.Sizes(requests=5, prompt_lens=(4, 24), output_lens=(2, 9), batch_size=2,
                      repeats=1)


@pytest.fixture(scope="module")
def space() -> TokenSpace:
    return TokenSpace.of_model("tiny")


def test_workload_is_seeded_in_range_and_free_of_special_tokens(space: TokenSpace) -> None:
    a = synthetic(space, 50, (3, 40), (5, 9), seed=7)
    assert a == synthetic(space, 50, (3, 40), (5, 9), seed=7)
    assert a != synthetic(space, 50, (3, 40), (5, 9), seed=8)
    assert all(3 <= len(p) <= 40 for p in a.prompts) and all(5 <= n <= 9 for n in a.output_lens)
    ids = {t for p in a.prompts for t in p}
    assert ids and not ids & space.special_ids and max(ids) < space.vocab_size
    assert a.output_tokens == sum(a.output_lens)
    assert a.longest == max(len(p) + n for p, n in zip(a.prompts, a.output_lens, strict=True))


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"prompt_lens": (0, 4)}, r"prompt_lens must be a range 1 <= low <= high, got \(0, 4\)"),
    ({"output_lens": (9, 5)}, r"output_lens must be a range 1 <= low <= high, got \(9, 5\)"),
    ({"n": 0}, "at least one request, got n=0"),
    ({"prompt_lens": (1, 4000)}, "does not fit the model's context of 2048 tokens"),
])
def test_bad_workloads_are_refused(space: TokenSpace, kwargs: dict, message: str) -> None:
    args = {"n": 3, "prompt_lens": (1, 4), "output_lens": (1, 4), "seed": 0, **kwargs}
    with pytest.raises(ValueError, match=message):
        synthetic(space, **args)
    with pytest.raises(ValueError, match="one output length per prompt"):
        Workload([[1, 2]], [3, 4])


def test_offline_suite_smallest_form(space: TokenSpace) -> None:
    results = offline.run(BenchOptions(progress=False), SMALL)
    got = {(r.name, r.metric): r.value for r in results}
    work = synthetic(space, SMALL.requests, SMALL.prompt_lens, SMALL.output_lens, offline.SEED)
    for name in ("aioengine", "hf_transformers"):
        tps, rps = got[(name, "output_tokens_per_s")], got[(name, "requests_per_s")]
        assert math.isfinite(tps) and tps > 0 and rps > 0
        # Both rates come from one timed run: their ratio is the tokens counted per request,
        # which must be every requested token (eos ignored on both sides).
        assert tps / rps == pytest.approx(work.output_tokens / len(work))
    # Static batches of 2 run to their longest request: the useful share is exact arithmetic.
    batches = [work.output_lens[i:i + 2] for i in range(0, len(work), 2)]
    padded = sum(max(b) * len(b) for b in batches)
    assert got[("hf_transformers", "padding_efficiency")] == pytest.approx(
        work.output_tokens / padded)


def test_suite_modules_keep_torch_out_of_the_bench_host() -> None:
    code = ("import sys, aioengine.bench.__main__, aioengine.bench.offline, "
            "aioengine.bench.overhead, aioengine.bench.serve, aioengine.bench.hf_baseline, "
            "aioengine.bench.bare_loop; assert 'torch' not in sys.modules, 'torch'")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_prompt_draws_never_use_special_ids() -> None:
    space = TokenSpace(vocab_size=6, special_ids=frozenset({0, 1, 2, 3}), context_len=64)
    drawn = space.draw(random.Random(0), 200)
    assert set(drawn) == {4, 5}
