"""Seeded sampling: same seed, same tokens, whatever else is in the batch (and after resume)."""

from __future__ import annotations

import torch

from aioengine.messages.sampling_params import SamplingParams
from aioengine.worker.sampler import Sampler
from aioengine.worker.sampler_ops import position_seed
from aioengine.worker.sampler_state import SequenceState

VOCAB = 50


def step_logits(step: int) -> torch.Tensor:
    """The 'model' for these tests: a fixed, fairly flat distribution per step."""
    g = torch.Generator().manual_seed(1000 + step)
    return torch.randn(VOCAB, generator=g)


def run(seeded: SequenceState, others: list[SequenceState], steps: int, sampler: Sampler,
        seeded_row: int) -> list[int]:
    """Decode ``steps`` tokens for ``seeded`` inside a batch of ``others``; returns its tokens."""
    got = []
    for step in range(steps):
        states = list(others)
        states.insert(seeded_row, seeded)
        logits = torch.stack([step_logits(step) + 0.1 * i * (s is not seeded)
                              for i, s in enumerate(states)])
        out = sampler.sample(logits, states)
        for s, tok in zip(states, out.token_ids, strict=True):
            s.output_token_ids.append(tok)
        got.append(out.token_ids[seeded_row])
    return got


def make(params: SamplingParams, rid: str = "s") -> SequenceState:
    return SequenceState.create(rid, params, [1, 2, 3], [], (0,))


def test_same_seed_same_tokens_whatever_the_batch() -> None:
    p = SamplingParams(temperature=1.0, seed=1234, top_p=0.95)
    alone = run(make(p), [], 12, Sampler(VOCAB, seed=0), 0)
    others = [make(SamplingParams(temperature=0.8), f"o{i}") for i in range(5)] + \
        [make(SamplingParams(temperature=0.0), "g"), make(SamplingParams(seed=99), "z")]
    crowded = run(make(p), others, 12, Sampler(VOCAB, seed=77), 3)
    assert alone == crowded
    assert len(set(alone)) > 3  # really sampled, not collapsed to one token


def test_same_seed_same_tokens_with_a_large_vocabulary() -> None:
    """Top-p over a large vocabulary takes the candidate path; neighbours with big top-k cuts
    (more candidates) or cuts past the vocabulary must not change a seeded row's draws."""
    vocab = 3000
    g = torch.Generator().manual_seed(5)
    rows = [torch.randn(vocab, generator=g) * 4 for _ in range(6)]
    p = SamplingParams(seed=77, top_p=0.9, temperature=0.7)
    alone = Sampler(vocab)
    crowd = Sampler(vocab, seed=9)
    others = [SamplingParams(top_k=1500), SamplingParams(top_k=10**6, top_p=0.5),
              SamplingParams(temperature=0.0), SamplingParams(min_p=0.1)]
    for step, row in enumerate(rows):
        s1 = SequenceState.create("s", p, [1], list(range(step)), (0,))
        s2 = SequenceState.create("s", p, [1], list(range(step)), (0,))
        batch = [SequenceState.create(f"o{i}", o, [1], [], (0,)) for i, o in enumerate(others)]
        logits = torch.stack([row] + [torch.randn(vocab, generator=g) for _ in others])
        got_alone = alone.sample(row.unsqueeze(0), [s1]).token_ids[0]
        got_crowd = crowd.sample(logits, [s2, *batch]).token_ids[0]
        assert got_alone == got_crowd, step


def test_different_seeds_differ_and_unseeded_follow_engine_seed() -> None:
    a = run(make(SamplingParams(seed=1)), [], 12, Sampler(VOCAB), 0)
    b = run(make(SamplingParams(seed=2)), [], 12, Sampler(VOCAB), 0)
    assert a != b
    u1 = run(make(SamplingParams()), [], 12, Sampler(VOCAB, seed=5), 0)
    u2 = run(make(SamplingParams()), [], 12, Sampler(VOCAB, seed=5), 0)
    u3 = run(make(SamplingParams()), [], 12, Sampler(VOCAB, seed=6), 0)
    assert u1 == u2 and u1 != u3


def test_resume_after_preemption_reproduces() -> None:
    p = SamplingParams(seed=42, temperature=1.2)
    full = run(make(p), [], 10, Sampler(VOCAB), 0)
    # Preempted after 4 tokens: a fresh state carrying those outputs continues identically.
    resumed = SequenceState.create("s", p, [1, 2, 3], full[:4], (0,))
    sampler = Sampler(VOCAB, seed=123)
    rest = []
    for step in range(4, 10):
        out = sampler.sample(step_logits(step).unsqueeze(0), [resumed])
        resumed.output_token_ids.append(out.token_ids[0])
        rest.append(out.token_ids[0])
    assert rest == full[4:]


def test_position_seed_spreads() -> None:
    seeds = {position_seed(s, i) for s in range(20) for i in range(20)}
    assert len(seeds) == 400
    assert all(0 <= x < 2**63 for x in seeds)
