"""``[PREVIOUS_TOKEN]`` decode chunks (steps scheduled one ahead): the runner feeds the token it
sampled last for the sequence, so the outputs equal explicit decodes; misuse is rejected."""

from __future__ import annotations

import pytest

from aioengine.config import EngineConfig
from aioengine.messages.sampling_params import SamplingParams
from aioengine.messages.worker_io import (
    PREVIOUS_TOKEN,
    NewSequence,
    ScheduledChunk,
    StepInput,
)
from aioengine.worker.model_runner import ModelRunner, StepInputError

BLOCK = 4
GREEDY = SamplingParams(temperature=0.0, max_tokens=64)
PROMPTS = {"a": [11, 12, 13, 14, 15], "b": [200, 7, 300]}


@pytest.fixture(scope="module")
def runner() -> ModelRunner:
    r = ModelRunner(EngineConfig(model="tiny", device="cpu", dtype="float32", block_size=BLOCK,
                                 num_kv_blocks=16))
    r.allocate_kv_cache(16)
    return r


def tables() -> dict[str, list[int]]:
    return {"a": list(range(0, 8)), "b": list(range(8, 16))}


def generate(runner: ModelRunner, steps: int, placeholder: bool) -> dict[str, list[int]]:
    """Prefill both prompts, then ``steps`` decodes of both, with explicit or placeholder ids."""
    runner.states.clear()
    out: dict[str, list[int]] = {rid: [] for rid in PROMPTS}
    new = [NewSequence(rid, p, [], GREEDY) for rid, p in PROMPTS.items()]
    chunks = [ScheduledChunk(rid, p, 0, tables()[rid], True) for rid, p in PROMPTS.items()]
    for step_id in range(steps + 1):
        res = runner.execute(StepInput(step_id, new if step_id == 0 else [], chunks, []))
        for s in res.sampled:
            out[s.request_id].append(s.token_id)
        chunks = [ScheduledChunk(rid, [PREVIOUS_TOKEN] if placeholder else [out[rid][-1]],
                                 len(p) + len(out[rid]) - 1, tables()[rid], True)
                  for rid, p in PROMPTS.items()]
    return out


def test_placeholder_decodes_equal_explicit_ones(runner) -> None:
    explicit = generate(runner, 6, placeholder=False)
    assert generate(runner, 6, placeholder=True) == explicit
    assert all(len(toks) == 7 for toks in explicit.values())


def test_placeholder_before_any_sample_is_rejected(runner) -> None:
    runner.states.clear()
    step = StepInput(1, [NewSequence("a", [5, 6], [], GREEDY)],
                     [ScheduledChunk("a", [PREVIOUS_TOKEN], 0, [0], True)], [])
    with pytest.raises(StepInputError, match=r"step 1: request 'a' has a PREVIOUS_TOKEN chunk "
                                             r"before any token was sampled for it"):
        runner.execute(step)


def test_placeholder_on_a_rank_that_does_not_sample_is_rejected(runner) -> None:
    runner.states.clear()
    runner.execute(StepInput(1, [NewSequence("a", [5, 6], [], GREEDY)],
                             [ScheduledChunk("a", [5, 6], 0, [0], True)], []))
    runner.rank = 1  # what a second tensor-parallel rank is: it runs the forward, never samples
    try:
        with pytest.raises(StepInputError, match=r"step 2: request 'a' has a PREVIOUS_TOKEN "
                                                 r"chunk, but rank 1 does not sample"):
            runner.execute(StepInput(2, [], [ScheduledChunk("a", [PREVIOUS_TOKEN], 2, [0],
                                                            True)], []))
    finally:
        runner.rank = 0
