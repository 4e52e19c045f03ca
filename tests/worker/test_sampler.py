"""Sampler: truncation, penalties, greedy, min_tokens, logprobs (per-row params in one batch)."""

from __future__ import annotations

import math

import pytest
import torch

from aioengine.messages.sampling_params import SamplingParams
from aioengine.worker.sampler import Sampler, greedy_tokens
from aioengine.worker.sampler_ops import (
    TOP_P_CANDIDATES,
    _sorted_cut,
    apply_penalties,
    apply_top_k_top_p,
    inverse_cdf_sample,
)
from aioengine.worker.sampler_state import SequenceState

EOS = 2
VOCAB = 8


def st(params: SamplingParams, prompt: list[int] | None = None,
       output: list[int] | None = None, rid: str = "r") -> SequenceState:
    return SequenceState.create(rid, params, prompt or [7], output or [], (EOS,))


def logits_for(probs: list[float], rows: int) -> torch.Tensor:
    return torch.tensor(probs).log().expand(rows, -1).clone()


def counts(tokens: list[int], vocab: int) -> list[int]:
    return torch.bincount(torch.tensor(tokens), minlength=vocab).tolist()


def test_all_greedy_batch_is_argmax() -> None:
    torch.manual_seed(0)
    logits = torch.randn(5, 50)
    out = Sampler(50).sample(logits, [st(SamplingParams(temperature=0.0))] * 5)
    assert out.token_ids == logits.argmax(-1).tolist()
    assert out.logprobs == [None] * 5


def test_logits_wider_than_vocab_never_pick_padding() -> None:
    logits = torch.zeros(2, 12)
    logits[:, 10:] = 100.0  # padded columns past the real vocabulary
    out = Sampler(10).sample(logits, [st(SamplingParams(temperature=0.0)),
                                      st(SamplingParams(temperature=1.0))])
    assert all(t < 10 for t in out.token_ids)


def test_nan_or_inf_logits_never_give_an_id_outside_the_vocabulary() -> None:
    """A model's bad numerics must not fail the step for every request: such a row takes its
    best finite logit (or token 0 when none is finite)."""
    logits = torch.randn(4, VOCAB)
    logits[0] = float("nan")
    logits[1, 3] = float("inf")  # softmax: NaN everywhere
    logits[2, :] = float("nan")
    logits[2, 5] = 4.0
    params = [SamplingParams(temperature=1.0, seed=s) for s in range(4)]
    out = Sampler(VOCAB).sample(logits, [st(p) for p in params])
    assert all(0 <= t < VOCAB for t in out.token_ids), out.token_ids
    assert out.token_ids[1] == 3 and out.token_ids[2] == 5


def test_bad_logits_shape_raises() -> None:
    with pytest.raises(ValueError, match=r"logits must be \[2, vocab\]"):
        Sampler(8).sample(torch.zeros(3, 8), [st(SamplingParams())] * 2)
    with pytest.raises(ValueError, match="fewer than the vocabulary size 8"):
        Sampler(8).sample(torch.zeros(1, 4), [st(SamplingParams())])


def test_temperature_sampling_follows_softmax() -> None:
    probs = [0.4, 0.3, 0.2, 0.1, 0.0, 0.0, 0.0, 0.0]
    n = 8000
    out = Sampler(VOCAB, seed=1).sample(logits_for(probs, n),
                                        [st(SamplingParams(temperature=1.0))] * n)
    freq = [c / n for c in counts(out.token_ids, VOCAB)]
    for f, p in zip(freq, probs, strict=True):
        assert abs(f - p) < 0.025, (freq, probs)


def test_temperature_sharpens_and_flattens() -> None:
    probs = [0.6, 0.4] + [0.0] * 6
    n = 6000
    sampler = Sampler(VOCAB, seed=2)
    cold = counts(sampler.sample(logits_for(probs, n),
                                 [st(SamplingParams(temperature=0.25))] * n).token_ids, VOCAB)
    hot = counts(sampler.sample(logits_for(probs, n),
                                [st(SamplingParams(temperature=4.0))] * n).token_ids, VOCAB)
    # p^(1/T) renormalised: T=0.25 -> 0.835; T=4 -> 0.525
    assert abs(cold[0] / n - 0.6**4 / (0.6**4 + 0.4**4)) < 0.03
    assert abs(hot[0] / n - 0.6**0.25 / (0.6**0.25 + 0.4**0.25)) < 0.03


def test_top_k_never_leaves_the_top_k() -> None:
    torch.manual_seed(3)
    n, vocab = 3000, 64
    row = torch.randn(vocab) * 0.5  # flat-ish: without the cut many tokens would appear
    logits = row.expand(n, -1).clone()
    params = [SamplingParams(temperature=1.0, top_k=5), SamplingParams(temperature=1.0)]
    states = [st(params[i % 2]) for i in range(n)]
    out = Sampler(vocab, seed=3).sample(logits, states)
    top5 = set(row.topk(5).indices.tolist())
    cut = [t for i, t in enumerate(out.token_ids) if i % 2 == 0]
    free = [t for i, t in enumerate(out.token_ids) if i % 2 == 1]
    assert set(cut) == top5  # never outside, and every one of the 5 is reachable
    assert len(set(free)) > 20  # the uncut rows in the same batch are not truncated


def test_top_k_above_the_vocabulary_is_no_cut() -> None:
    probs = [0.5, 0.3, 0.15, 0.05] + [0.0] * 4
    n = 4000
    out = Sampler(VOCAB, seed=8).sample(logits_for(probs, n),
                                        [st(SamplingParams(top_k=10**6))] * n)
    assert counts(out.token_ids, VOCAB)[3] > 0.03 * n


def test_top_p_respects_the_mass() -> None:
    probs = [0.5, 0.3, 0.15, 0.05] + [0.0] * 4
    n = 6000
    out = Sampler(VOCAB, seed=4).sample(logits_for(probs, n),
                                        [st(SamplingParams(top_p=0.7))] * n)
    c = counts(out.token_ids, VOCAB)
    # {0, 1} is the smallest prefix with mass >= 0.7; renormalised 0.625 / 0.375
    assert c[2:] == [0] * 6
    assert abs(c[0] / n - 0.625) < 0.03


def test_top_p_keeps_the_top_token_and_top_k_then_top_p() -> None:
    logits = torch.tensor([[3.0, 2.0, 1.0, 0.0], [3.0, 2.0, 1.0, 0.0]])
    out = apply_top_k_top_p(logits, torch.tensor([4, 2]), 2, torch.tensor([1e-6, 0.9]))
    assert torch.isfinite(out[0]).tolist() == [True, False, False, False]
    # row 1: top-2 renormalised is (0.73, 0.27): 0.73 < 0.9, so both survive
    assert torch.isfinite(out[1]).tolist() == [True, True, False, False]
    assert out[1, 0].item() == 3.0  # survivors keep their logits


def test_top_p_candidates_agree_with_a_full_sort() -> None:
    """Large vocabulary: the nucleus is searched among the best candidates, and rows whose
    nucleus reaches further (flat rows) fall back to a full sort; both must be exact."""
    torch.manual_seed(9)
    vocab = 4 * TOP_P_CANDIDATES
    peaked = torch.randn(vocab) * 6
    flat = torch.randn(vocab) * 0.1
    logits = torch.stack([peaked, flat, peaked, flat, peaked, flat])
    top_k = torch.tensor([vocab, vocab, 20, 300, vocab, vocab])
    top_p = torch.tensor([0.9, 0.9, 0.8, 0.95, 2.0, 2.0])
    out = apply_top_k_top_p(logits, top_k, 300, top_p)
    ref = _sorted_cut(logits, top_k, top_p)
    assert torch.equal(torch.isfinite(out), torch.isfinite(ref))
    kept = torch.isfinite(out).sum(dim=1).tolist()
    assert kept[1] > TOP_P_CANDIDATES  # the flat row really needed the fallback
    assert kept[2] <= 20 and kept[3] <= 300 and kept[4] == kept[5] == vocab
    assert torch.equal(out[5], logits[5])  # rows without a cut are untouched
    # only top-k rows and a no-cut row (the candidate path without top-p)
    only_k = apply_top_k_top_p(logits[:3], torch.tensor([5, vocab, 700]), 700, None)
    assert torch.isfinite(only_k).sum(dim=1).tolist() == [5, vocab, 700]


def test_inverse_cdf_never_draws_zero_probability_tokens() -> None:
    probs = torch.tensor([[0.0, 0.5, 0.0, 0.5, 0.0]] * 4)
    u = torch.tensor([[0.0], [0.4999999], [0.5], [1.0 - 2**-24]])
    assert inverse_cdf_sample(probs, u).tolist() == [1, 1, 3, 3]


def test_min_p() -> None:
    probs = [0.5, 0.3, 0.15, 0.04, 0.01, 0.0, 0.0, 0.0]
    n = 6000
    out = Sampler(VOCAB, seed=5).sample(logits_for(probs, n),
                                        [st(SamplingParams(min_p=0.2))] * n)
    c = counts(out.token_ids, VOCAB)
    assert c[3:] == [0] * 5  # below 0.2 * 0.5 = 0.1
    assert c[2] > 0.12 * n  # 0.15 / 0.95 renormalised


def penalties_reference(logits: list[float], prompt: list[int], output: list[int],
                        rep: float, pres: float, freq: float) -> list[float]:
    out = []
    for tok, x in enumerate(logits):
        if tok in prompt or tok in output:
            x = x / rep if x > 0 else x * rep
        c = output.count(tok)
        x -= freq * c + (pres if c else 0.0)
        out.append(x)
    return out


@pytest.mark.parametrize("rep,pres,freq", [(2.0, 0.0, 0.0), (1.0, 1.5, 0.0), (1.0, 0.0, 0.7),
                                           (1.3, -0.5, 0.4)])
def test_penalties_match_definition(rep: float, pres: float, freq: float) -> None:
    torch.manual_seed(6)
    raw = torch.randn(2, VOCAB) * 3
    prompts, outputs = [[0, 1, 1], [5]], [[1, 3, 3, 3], []]
    x = raw.clone()
    prompt_mask = torch.zeros(2, VOCAB, dtype=torch.bool)
    cnt = torch.zeros(2, VOCAB)
    for i in range(2):
        prompt_mask[i, prompts[i]] = True
        for t in outputs[i]:
            cnt[i, t] += 1
    apply_penalties(x, prompt_mask, cnt, torch.tensor([rep] * 2), torch.tensor([pres] * 2),
                    torch.tensor([freq] * 2))
    for i in range(2):
        ref = penalties_reference(raw[i].tolist(), prompts[i], outputs[i], rep, pres, freq)
        assert x[i].tolist() == pytest.approx(ref, abs=1e-5)


def test_penalties_change_the_greedy_choice() -> None:
    logits = torch.tensor([[3.0, 2.0, 1.0, 0.5, 0, 0, 0, 0]]).expand(4, -1).clone()
    states = [
        st(SamplingParams(temperature=0.0)),
        st(SamplingParams(temperature=0.0, repetition_penalty=2.0), prompt=[0]),  # 3 -> 1.5
        st(SamplingParams(temperature=0.0, presence_penalty=1.5), prompt=[0]),  # prompt-blind
        st(SamplingParams(temperature=0.0, frequency_penalty=0.6), output=[0, 0]),  # 3 -> 1.8
    ]
    assert Sampler(VOCAB).sample(logits, states).token_ids == [0, 1, 0, 1]


def test_frequency_penalty_counts_repeats() -> None:
    logits = torch.tensor([[3.0, 2.0, 0, 0, 0, 0, 0, 0]]).expand(2, -1).clone()
    states = [st(SamplingParams(temperature=0.0, frequency_penalty=0.6), output=[0]),  # 2.4
              st(SamplingParams(temperature=0.0, presence_penalty=0.6), output=[0, 0, 0])]
    assert Sampler(VOCAB).sample(logits, states).token_ids == [0, 0]


def test_min_tokens_masks_eos_and_stop_ids_until_reached() -> None:
    logits = torch.tensor([[0.0, 0.0, 9.0, 8.0, 7.0, 0, 0, 0]]).expand(4, -1).clone()
    p = SamplingParams(temperature=0.0, min_tokens=2, stop_token_ids=[3])
    states = [st(p), st(p, output=[5]), st(p, output=[5, 5]),
              st(SamplingParams(temperature=0.0, min_tokens=2, ignore_eos=True,
                                stop_token_ids=[3]))]
    # eos (2) and stop id 3 masked for the first two; the third reached min_tokens; with
    # ignore_eos eos is not a stop token, so only 3 is masked.
    assert Sampler(VOCAB).sample(logits, states).token_ids == [4, 4, 2, 2]


def test_logprobs_match_log_softmax_of_raw_logits() -> None:
    torch.manual_seed(7)
    logits = torch.randn(4, 32) * 2
    states = [st(SamplingParams(temperature=0.0, logprobs=3)),
              st(SamplingParams(temperature=0.7, logprobs=0, repetition_penalty=1.5)),
              st(SamplingParams(temperature=0.0)),
              st(SamplingParams(temperature=1.0, top_k=3, logprobs=5))]
    out = Sampler(32).sample(logits, states)
    ref = torch.log_softmax(logits, dim=-1)
    assert out.logprobs[2] is None
    for i in (0, 1, 3):
        lp = out.logprobs[i]
        assert lp is not None and lp.token_id == out.token_ids[i]
        assert lp.logprob == pytest.approx(ref[i, lp.token_id].item(), abs=1e-5)
        n = states[i].params.logprobs
        top = ref[i].topk(n) if n else None
        assert [t for t, _ in lp.top] == (top.indices.tolist() if top is not None else [])
        assert [v for _, v in lp.top] == pytest.approx(top.values.tolist() if n else [],
                                                       abs=1e-5)
    assert math.isclose(sum(math.exp(v) for v in ref[0].tolist()), 1.0, rel_tol=1e-5)


def test_half_precision_logits() -> None:
    logits = torch.randn(3, 16).to(torch.bfloat16)
    out = Sampler(16).sample(logits, [st(SamplingParams(temperature=0.0, logprobs=1)),
                                      st(SamplingParams(top_p=0.5)), st(SamplingParams())])
    assert out.token_ids[0] == logits.float().argmax(-1)[0].item()


def test_greedy_tokens_equal_torch_argmax_on_ties_nan_and_strided_rows():
    """The numpy argmax of the greedy fast path picks what torch's argmax picks: the first
    maximum on ties, the first NaN, on a column slice of wider logits, and on other dtypes."""
    wide = torch.randn(5, 50, generator=torch.Generator().manual_seed(3))
    wide[1, 7] = wide[1, 30] = 100.0  # a tie
    wide[2, 9] = float("nan")
    wide[2, 4] = float("nan")
    wide[3, :] = 0.0
    logits = wide[:, :40]
    assert greedy_tokens(logits) == logits.argmax(dim=-1).tolist() == [
        int(logits[0].argmax()), 7, 4, 0, int(logits[4].argmax())]
    half = logits.to(torch.bfloat16)
    assert greedy_tokens(half) == half.argmax(dim=-1).tolist()
    with torch.inference_mode():
        inf = torch.randn(3, 40)
        assert greedy_tokens(inf) == inf.argmax(dim=-1).tolist()
