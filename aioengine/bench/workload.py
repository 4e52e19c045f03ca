"""Deterministic synthetic workloads: seeded prompt token ids, output lengths and arrivals.

Both sides of a comparison get the very same lists. Prompts are random ordinary token ids (no
special tokens, so no accidental eos or chat markers), drawn only from ids that both the model
and its tokenizer know. Nothing here imports torch.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass

from tokenizers import Tokenizer

from aioengine.hub import read_model_info, resolve_model


@dataclass(frozen=True)
class Workload:
    prompts: list[list[int]]
    output_lens: list[int]  # max_tokens of each request (eos ignored on every side)

    def __post_init__(self) -> None:
        if len(self.prompts) != len(self.output_lens) or not self.prompts:
            raise ValueError(f"a workload needs one output length per prompt and at least one "
                             f"request, got {len(self.prompts)} prompts and "
                             f"{len(self.output_lens)} output lengths")

    def __len__(self) -> int:
        return len(self.prompts)

    @property
    def output_tokens(self) -> int:
        return sum(self.output_lens)

    @property
    def longest(self) -> int:
        """The most context any request needs (prompt + output)."""
        return max(len(p) + o for p, o in zip(self.prompts, self.output_lens, strict=True))


@dataclass(frozen=True)
class TokenSpace:
    """Token ids a synthetic prompt may use, and the model's context length."""

    vocab_size: int  # ids below this are known to the model and the tokenizer
    special_ids: frozenset[int]
    context_len: int

    @classmethod
    def of_model(cls, model: str) -> TokenSpace:
        """Read from the model directory's JSON files and tokenizer.json (no torch)."""
        resolved = resolve_model(model, require_tokenizer=True)
        info = read_model_info(resolved.model_path)
        tok = Tokenizer.from_file(os.path.join(resolved.tokenizer_path, "tokenizer.json"))
        vocab = min(info.vocab_size, tok.get_vocab_size(with_added_tokens=True))
        special = frozenset(tok.get_added_tokens_decoder()) | frozenset(info.eos_token_ids)
        if info.bos_token_id is not None:
            special |= {info.bos_token_id}
        if vocab - len(special) < 2:
            raise ValueError(f"model {model!r} has no ordinary token ids to build prompts from "
                             f"(vocabulary {vocab}, {len(special)} special)")
        return cls(vocab, special, info.max_position_embeddings)

    def draw(self, rng: random.Random, n: int) -> list[int]:
        out: list[int] = []
        while len(out) < n:
            t = rng.randrange(self.vocab_size)
            if t not in self.special_ids:
                out.append(t)
        return out


def synthetic(space: TokenSpace, n: int, prompt_lens: tuple[int, int],
              output_lens: tuple[int, int], seed: int) -> Workload:
    """``n`` requests with prompt and output lengths uniform in the inclusive ranges."""
    for name, (low, high) in (("prompt_lens", prompt_lens), ("output_lens", output_lens)):
        if not 1 <= low <= high:
            raise ValueError(f"{name} must be a range 1 <= low <= high, got ({low}, {high})")
    if n < 1:
        raise ValueError(f"a workload needs at least one request, got n={n}")
    if prompt_lens[1] + output_lens[1] > space.context_len:
        raise ValueError(f"the longest request ({prompt_lens[1]} prompt + {output_lens[1]} "
                         f"output tokens) does not fit the model's context of "
                         f"{space.context_len} tokens")
    rng = random.Random(seed)
    prompts = [space.draw(rng, rng.randint(*prompt_lens)) for _ in range(n)]
    outs = [rng.randint(*output_lens) for _ in range(n)]
    return Workload(prompts, outs)


def poisson_arrivals(n: int, rate: float, seed: int) -> list[float]:
    """Send times (seconds from the start) of ``n`` requests arriving as a Poisson process of
    ``rate`` per second; the first arrives at 0."""
    if not rate > 0:
        raise ValueError(f"rate must be positive, got {rate}")
    rng = random.Random(seed)
    times, t = [], 0.0
    for _ in range(n):
        times.append(t)
        t += rng.expovariate(rate)
    return times
