"""Batched tensor operations of the sampler, one row per sequence, parameters per row.

Every function works on float32 logits ``[n, vocab]`` and is row-independent: a row's result
never depends on the other rows, which is what makes seeded sampling reproducible whatever
else is in the batch.
"""

from __future__ import annotations

import numpy as np
import torch

_MASK64 = (1 << 64) - 1


def position_seed(seed: int, index: int) -> int:
    """A 63-bit generator seed for output position ``index`` of a request seeded ``seed``
    (splitmix64 finaliser, so nearby (seed, index) pairs give unrelated streams)."""
    z = (seed * 0x9E3779B97F4A7C15 + (index + 1) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (z ^ (z >> 31)) >> 1


def apply_penalties(logits: torch.Tensor, prompt_mask: torch.Tensor, output_counts: torch.Tensor,
                    repetition: torch.Tensor, presence: torch.Tensor,
                    frequency: torch.Tensor) -> None:
    """In place, OpenAI/vLLM definitions. ``prompt_mask`` (bool) and ``output_counts`` (float)
    are ``[n, vocab]``; the penalties are ``[n]``.

    - repetition (over prompt and output tokens): positive logits divided by it, negative ones
      multiplied by it;
    - frequency: minus ``frequency * count`` of the token among the outputs;
    - presence: minus ``presence`` once the token appears among the outputs.
    """
    seen = prompt_mask | (output_counts > 0)
    rep = repetition.unsqueeze(1)
    penalised = torch.where(logits > 0, logits / rep, logits * rep)
    logits.copy_(torch.where(seen, penalised, logits))
    logits -= frequency.unsqueeze(1) * output_counts
    logits -= presence.unsqueeze(1) * (output_counts > 0).to(logits.dtype)


# Top-p looks for its nucleus among this many best tokens first (a partial top-k instead of a
# full sort of the vocabulary); rows whose nucleus reaches further are redone with a sort.
TOP_P_CANDIDATES = 256


def apply_top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor | None, max_k: int,
                      top_p: torch.Tensor | None) -> torch.Tensor:
    """Mask (to -inf) tokens outside each row's top ``k`` and outside the smallest set whose
    probability mass (after the top-k cut, renormalised) reaches ``p``. ``top_k`` holds the
    vocabulary size for rows without a cut and ``max_k`` is the largest real cut (known on the
    host, so no device sync); ``top_p`` holds values >= 1 for rows without a cut. The most
    likely token always survives. Ties at the k-th value are all kept."""
    vocab = logits.shape[-1]
    if top_p is None:
        assert top_k is not None
        # Only a top-k cut: a partial top-k gives each row's k-th value without a full sort.
        kth_values = torch.topk(logits, max_k, dim=-1).values
        kth = kth_values.gather(1, (top_k - 1).clamp(max=max_k - 1).unsqueeze(1))
        kth = kth.masked_fill(top_k.unsqueeze(1) >= vocab, float("-inf"))
        return logits.masked_fill(logits < kth, float("-inf"))
    k = min(vocab, max(TOP_P_CANDIDATES, max_k))
    if k == vocab:
        return _sorted_cut(logits, top_k, top_p)
    vals, idx = logits.topk(k, dim=-1)  # sorted, best first
    has_p = top_p < 1.0
    if top_k is not None:
        has_k = top_k < vocab
        ranks = torch.arange(k, device=logits.device).unsqueeze(0)
        vals = vals.masked_fill(ranks >= top_k.unsqueeze(1), float("-inf"))
        # A top-k row's candidates hold its whole renormalised set; other rows need the
        # normaliser of the full vocabulary.
        norm = torch.where(has_k, vals.logsumexp(dim=-1), logits.logsumexp(dim=-1))
        cut = has_p | has_k
        short = has_p & ~has_k
    else:
        norm = logits.logsumexp(dim=-1)
        cut = short = has_p
    probs = (vals - norm.unsqueeze(1)).exp()
    mass = probs.cumsum(dim=-1)
    drop = (mass - probs) >= top_p.unsqueeze(1)
    drop[:, 0] = False
    out = torch.full_like(logits, float("-inf")).scatter_(1, idx, vals.masked_fill(drop,
                                                                                  float("-inf")))
    out = torch.where(cut.unsqueeze(1), out, logits)
    short = short & (mass[:, -1] < top_p)  # the nucleus reaches past the candidates
    if bool(short.any()):
        rows = short.nonzero().squeeze(1)
        out[rows] = _sorted_cut(logits[rows], None if top_k is None else top_k[rows],
                                top_p[rows])
    return out


def _sorted_cut(logits: torch.Tensor, top_k: torch.Tensor | None,
                top_p: torch.Tensor) -> torch.Tensor:
    """Top-k and top-p over a full sort of each row (exact for any nucleus size)."""
    vocab = logits.shape[-1]
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    if top_k is not None:
        ranks = torch.arange(vocab, device=logits.device).unsqueeze(0)
        sorted_logits = sorted_logits.masked_fill(ranks >= top_k.unsqueeze(1), float("-inf"))
    probs = sorted_logits.softmax(dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs  # probability of the strictly better tokens
    drop = mass_before >= top_p.unsqueeze(1)
    drop[:, 0] = False
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(1, order, sorted_logits)


def apply_min_p(logits: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """Mask tokens whose probability is below ``min_p`` times the row's top probability.
    Relative to the top token, so it commutes with the renormalisation of top-k/top-p."""
    probs = logits.softmax(dim=-1)
    threshold = probs.amax(dim=-1, keepdim=True) * min_p.unsqueeze(1)
    return logits.masked_fill(probs < threshold, float("-inf"))


def inverse_cdf_sample(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """One token per row from (unnormalised) ``probs`` ``[n, V]`` and ``uniforms`` ``[n, 1]`` in
    [0, 1): the first token whose cumulative mass exceeds ``u * total``. Tokens with zero
    probability have empty intervals and are never drawn. One random number per row, where an
    exponential race (Gumbel-max) needs V: on CPU that is most of a large-vocabulary step."""
    cdf = probs.cumsum(dim=-1)
    total = cdf[:, -1:]
    # Strictly below the total, so rounding of u * total can never pass the last live token.
    target = torch.minimum(uniforms * total, torch.nextafter(total, torch.zeros_like(total)))
    return torch.searchsorted(cdf, target, right=True).squeeze(1)


def apply_token_bitmask(logits: torch.Tensor, rows: list[int], words: int, data: bytes) -> None:
    """In place: set to -inf the logits of ``rows`` whose token's bit is 0 in that row's
    bitmask (``words`` little-endian 32-bit words per row, one bit per token id; ids past the
    bitmask are masked too)."""
    n, vocab = len(rows), logits.shape[1]
    packed = np.frombuffer(data, dtype=np.uint8).reshape(n, words * 4)
    if logits.device.type == "cpu":
        bits = torch.from_numpy(np.unpackbits(packed, axis=1, bitorder="little"))
    else:  # unpack on the device: a quarter of the bytes cross the bus
        dev = torch.from_numpy(packed.copy()).to(logits.device, non_blocking=True)
        shifts = torch.arange(8, dtype=torch.uint8, device=logits.device)
        bits = ((dev.unsqueeze(-1) >> shifts) & 1).reshape(n, -1)
    width = min(vocab, bits.shape[1])
    banned = bits[:, :width] == 0
    if vocab > width:
        banned = torch.cat([banned, banned.new_ones(n, vocab - width)], dim=1)
    if n == logits.shape[0] and rows == list(range(n)):
        logits.masked_fill_(banned, float("-inf"))
    else:
        index = torch.tensor(rows, device=logits.device)
        logits[index] = logits[index].masked_fill(banned, float("-inf"))
