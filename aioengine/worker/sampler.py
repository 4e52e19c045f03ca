"""Batched token sampling with different parameters per row.

Order of operations for one step (each row independently):

1. log-probabilities, when asked (``params.logprobs``): ``log_softmax`` of the *raw* model
   logits, before any masking, penalty or temperature (vLLM's default "raw logprobs"), so they
   describe the model, not the sampling settings;
2. ``min_tokens``: the request's stop token ids and eos (unless ``ignore_eos``) are masked while
   fewer than ``min_tokens`` tokens were produced -- except in rows a grammar constrains
   (structured outputs), where the engine's token bitmask decides what may come, eos included;
   then ``logit_bias`` is added;
3. penalties: repetition (prompt and output tokens), frequency and presence (output tokens);
4. greedy rows (temperature 0) take the argmax here;
5. other rows: temperature, then top-k, top-p (on the renormalised top-k set), min-p, and one
   inverse-CDF draw with a single uniform number per row (an exponential race would need one
   exponential per vocabulary entry, the bulk of a CPU step for a 150k vocabulary). Rows with a
   ``seed`` take their uniform from a generator seeded by (seed, output index), so a seeded
   request gives the same tokens whatever else is in the batch, and again after preemption by
   recompute. Other rows share the sampler's generator (seeded from the engine's seed).

An all-greedy batch without penalties, ``min_tokens`` or logprobs is one ``argmax``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from aioengine.messages.engine_io import TokenLogprob
from aioengine.messages.worker_io import GrammarBitmask
from aioengine.worker.sampler_ops import (
    apply_min_p,
    apply_penalties,
    apply_token_bitmask,
    apply_top_k_top_p,
    inverse_cdf_sample,
    position_seed,
)
from aioengine.worker.sampler_state import SequenceState


def greedy_tokens(logits: torch.Tensor) -> list[int]:
    """Each row's argmax (the first on ties, as torch's). CPU float32 rows go through numpy's
    SIMD argmax, several times faster than torch's over a large vocabulary (docs/benchmarks.md)."""
    if logits.device.type == "cpu" and logits.dtype == torch.float32:
        return logits.detach().numpy().argmax(axis=-1).tolist()
    return logits.argmax(dim=-1).tolist()


def argmax_only(states: Sequence[SequenceState], bitmask: GrammarBitmask | None) -> bool:
    """Every row greedy with no penalty, ``min_tokens`` mask, logit bias or logprobs, and no
    grammar: its token is the argmax of its logits (``greedy_tokens``), nothing else."""
    if bitmask is not None:
        return False
    for s in states:
        if not s.greedy or s.has_penalty or s.params.logprobs is not None \
                or s.masks_stop_now or s.logit_bias_ids:
            return False
    return True


@dataclass(slots=True)
class SamplerOutput:
    token_ids: list[int]
    logprobs: list[TokenLogprob | None]  # per row; None where the request did not ask


class Sampler:
    """Samples one token per row of ``logits`` ``[n, >=vocab_size]`` for ``states[i]``."""

    def __init__(self, vocab_size: int, seed: int = 0) -> None:
        if vocab_size < 1:
            raise ValueError(f"vocab_size must be positive, got {vocab_size}")
        self.vocab_size = vocab_size
        self._seed = seed
        self._generators: dict[torch.device, torch.Generator] = {}

    def _generator(self, device: torch.device) -> torch.Generator:
        gen = self._generators.get(device)
        if gen is None:
            gen = torch.Generator(device=device)
            gen.manual_seed(self._seed)
            self._generators[device] = gen
        return gen

    @torch.inference_mode()
    def sample(self, logits: torch.Tensor, states: Sequence[SequenceState],
               bitmask: GrammarBitmask | None = None) -> SamplerOutput:
        """``bitmask``: the allowed tokens of the rows a grammar constrains (its ``rows`` index
        ``states``)."""
        n = len(states)
        if logits.dim() != 2 or logits.shape[0] != n:
            raise ValueError(f"logits must be [{n}, vocab] for {n} sequences, "
                             f"got {tuple(logits.shape)}")
        if logits.shape[1] < self.vocab_size:
            raise ValueError(f"logits have {logits.shape[1]} columns, fewer than the vocabulary "
                             f"size {self.vocab_size}")
        if n == 0:
            return SamplerOutput([], [])
        logits = logits[:, :self.vocab_size]
        if argmax_only(states, bitmask):
            return SamplerOutput(greedy_tokens(logits), [None] * n)
        all_greedy = all(s.greedy for s in states)
        if bitmask is not None and (len(bitmask.data) != len(bitmask.rows) * bitmask.words * 4
                                    or any(not 0 <= r < n for r in bitmask.rows)):
            raise ValueError(f"grammar bitmask of {len(bitmask.data)} bytes for rows "
                             f"{bitmask.rows} ({bitmask.words} words each) does not fit a "
                             f"batch of {n}")
        return self._sample_general(logits.float(), states, all_greedy, bitmask)

    def _sample_general(self, raw: torch.Tensor, states: Sequence[SequenceState],
                        all_greedy: bool, bitmask: GrammarBitmask | None = None
                        ) -> SamplerOutput:
        device = raw.device
        lp_rows = [i for i, s in enumerate(states) if s.params.logprobs is not None]
        raw_logprobs = raw[lp_rows].log_softmax(dim=-1) if lp_rows else None
        x = raw

        mask_rows: list[int] = []
        mask_cols: list[int] = []
        bias_rows: list[int] = []
        bias_cols: list[int] = []
        bias_values: list[float] = []
        constrained = set(bitmask.rows) if bitmask is not None else ()
        for i, s in enumerate(states):
            if s.masks_stop_now and i not in constrained:
                ids = [t for t in s.min_tokens_mask_ids if t < self.vocab_size]
                mask_rows.extend([i] * len(ids))
                mask_cols.extend(ids)
            if s.logit_bias_ids:
                for t, v in zip(s.logit_bias_ids, s.logit_bias_values, strict=True):
                    if t < self.vocab_size:
                        bias_rows.append(i)
                        bias_cols.append(t)
                        bias_values.append(v)
        pen_rows = [i for i, s in enumerate(states) if s.has_penalty]
        if mask_rows or pen_rows or bias_rows or bitmask is not None:
            x = raw.clone()  # the steps below write in place; raw may be the model's output
        if mask_rows:
            x[torch.tensor(mask_rows, device=device), torch.tensor(mask_cols, device=device)] = \
                float("-inf")
        if bias_rows:
            x.index_put_((torch.tensor(bias_rows, device=device),
                          torch.tensor(bias_cols, device=device)),
                         torch.tensor(bias_values, device=device, dtype=x.dtype),
                         accumulate=True)
        if bitmask is not None:
            apply_token_bitmask(x, bitmask.rows, bitmask.words, bitmask.data)

        if pen_rows:
            self._penalise(x, pen_rows, [states[i] for i in pen_rows])

        tokens = x.argmax(dim=-1) if all_greedy else self._sample_random(x, states)
        token_ids: list[int] = tokens.tolist()
        return SamplerOutput(token_ids, self._logprobs(raw_logprobs, lp_rows, states, token_ids))

    def _penalise(self, x: torch.Tensor, rows: list[int], states: list[SequenceState]) -> None:
        device, vocab, n = x.device, self.vocab_size, len(rows)
        # One spare column takes padding and out-of-vocabulary ids, then is dropped.
        prompt_mask = torch.zeros(n, vocab + 1, dtype=torch.bool, device=device)
        counts = torch.zeros(n, vocab + 1, dtype=torch.float32, device=device)
        longest = max(len(s.output_token_ids) for s in states)
        if longest:
            out = torch.tensor([s.output_token_ids + [vocab] * (longest - len(s.output_token_ids))
                                for s in states], dtype=torch.long, device=device)
            counts.scatter_add_(1, out.clamp_(0, vocab), torch.ones_like(out, dtype=counts.dtype))
        for j, s in enumerate(states):
            if s.params.repetition_penalty != 1.0:
                prompt_mask[j].index_fill_(0, s.prompt_ids_tensor(device).clamp(0, vocab), True)
        sub = x[rows]
        apply_penalties(
            sub, prompt_mask[:, :vocab], counts[:, :vocab],
            torch.tensor([s.params.repetition_penalty for s in states], device=device),
            torch.tensor([s.params.presence_penalty for s in states], device=device),
            torch.tensor([s.params.frequency_penalty for s in states], device=device),
        )
        x[rows] = sub

    def _sample_random(self, x: torch.Tensor, states: Sequence[SequenceState]) -> torch.Tensor:
        device = x.device
        greedy = [s.greedy for s in states]
        rand_rows = [i for i, g in enumerate(greedy) if not g]
        rstates = [states[i] for i in rand_rows]
        mixed = len(rand_rows) != len(states)
        r = x[rand_rows] if mixed else x
        r = r / torch.tensor([s.params.temperature for s in rstates], device=device).unsqueeze(1)

        top_k = top_p = None
        max_k = 0
        vocab = self.vocab_size
        if any(s.has_top_k and s.params.top_k < vocab for s in rstates):
            # A cut at or above the vocabulary is no cut: such rows take the same path as rows
            # without one, so a row's result never depends on its neighbours' settings.
            ks = [s.params.top_k if s.has_top_k and s.params.top_k < vocab else vocab
                  for s in rstates]
            max_k = max(k for k in ks if k < vocab)
            top_k = torch.tensor(ks, device=device)
        if any(s.has_top_p for s in rstates):
            top_p = torch.tensor([s.params.top_p if s.has_top_p else 2.0 for s in rstates],
                                 device=device)
        if top_k is not None or top_p is not None:
            r = apply_top_k_top_p(r, top_k, max_k, top_p)
        if any(s.has_min_p for s in rstates):
            r = apply_min_p(r, torch.tensor([s.params.min_p for s in rstates], device=device))

        probs = r.softmax(dim=-1)
        uniforms = torch.rand(len(rstates), 1, device=device, generator=self._generator(device))
        for j, s in enumerate(rstates):
            if s.params.seed is not None:
                gen = torch.Generator(device=device)
                gen.manual_seed(position_seed(s.params.seed, len(s.output_token_ids)))
                uniforms[j] = torch.rand(1, device=device, generator=gen)
        sampled = inverse_cdf_sample(probs, uniforms)
        # A row whose probabilities are NaN (inf/NaN logits from the model's numerics) draws
        # past the end of the CDF: it takes its best finite logit instead of an id outside the
        # vocabulary, which would fail the whole step for every request. Checked on [B] ids
        # only; the fallback pass over the logits runs only for such a step (the ids are read
        # back right after this anyway, so the check adds no device sync that matters).
        bad = sampled >= probs.shape[-1]
        if bool(bad.any()):
            best = torch.nan_to_num(r, nan=-math.inf).argmax(dim=-1)
            sampled = torch.where(bad, best, sampled)
        if not mixed:
            return sampled
        tokens = x.argmax(dim=-1)
        tokens[rand_rows] = sampled
        return tokens

    @staticmethod
    def _logprobs(raw_logprobs: torch.Tensor | None, rows: list[int],
                  states: Sequence[SequenceState], token_ids: list[int]
                  ) -> list[TokenLogprob | None]:
        result: list[TokenLogprob | None] = [None] * len(states)
        if raw_logprobs is None:
            return result
        device = raw_logprobs.device
        chosen = raw_logprobs.gather(
            1, torch.tensor([token_ids[i] for i in rows], device=device).unsqueeze(1))
        chosen_list: list[float] = chosen.squeeze(1).tolist()
        top_n = max(states[i].params.logprobs or 0 for i in rows)
        top_vals: list[list[float]] = []
        top_ids: list[list[int]] = []
        if top_n:
            top = raw_logprobs.topk(min(top_n, raw_logprobs.shape[1]), dim=-1)
            top_vals, top_ids = top.values.tolist(), top.indices.tolist()
        for j, i in enumerate(rows):
            n = states[i].params.logprobs or 0
            pairs = list(zip(top_ids[j][:n], top_vals[j][:n], strict=True)) if n else []
            result[i] = TokenLogprob(token_ids[i], chosen_list[j], pairs)
        return result
