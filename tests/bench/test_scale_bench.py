"""The scale bench in its smallest form: both throughput rows and both routing rows measure
something, and with one request in flight prefix affinity reaches the workload's ceiling (every
question after a group's first finds the group's prefix cached) while round robin, which sends
each group to both replicas, cannot."""

from __future__ import annotations

import math

import pytest

from aioengine.bench import scale
from aioengine.bench.options import BenchOptions

# One request in flight and a KV cache that holds every prefix: the rates are exact arithmetic.
SMALL = {"requests": 4, "prompt_lens": (4, 24), "output_lens": (2, 9), "batch": 2,
         "in_flight": 1, "kv_blocks": 256}


def test_scale_suite_smallest_form() -> None:
    options = BenchOptions(progress=False, only=("dp1", "dp2", "round_robin",
                                                 "prefix_affinity"))
    got = {(r.name, r.metric): r.value for r in scale.run(options, SMALL)}
    for side in ("dp1", "dp2"):
        assert math.isfinite(got[(side, "output_tokens_per_s")])
        assert got[(side, "output_tokens_per_s")] > 0
    ceiling = ((scale.PREFIX_QUESTIONS - 1) * scale.PREFIX_LEN
               / (scale.PREFIX_QUESTIONS * (scale.PREFIX_LEN + scale.QUESTION_LEN)))
    assert got[("prefix_affinity", "prefix_hit_rate")] == pytest.approx(ceiling)
    assert got[("round_robin", "prefix_hit_rate")] < ceiling - 0.05
