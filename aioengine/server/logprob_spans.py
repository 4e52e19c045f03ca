"""Which generated tokens the returned text is made of, so ``logprobs`` describe exactly that
text: the eos (or a special stop token) that the text leaves out has no entry, nor have the
tokens of a stop string that cut the text off.

Each token's share of the text is what an incremental detokenizer (the same algorithm and left
context the client uses for the text itself) emits when the token is added; a token completing
a character split over several tokens carries the whole character, the ones before it nothing.
Token ``i`` is covered by a returned text of ``n`` characters when some token at or after ``i``
adds text starting before ``n``. A token a stop string cuts through keeps its entry (its
logprob is that of the whole token); special tokens that the text skips never get one.

Linear in the reply's length: each token is decoded on its own once, special tokens (text that
the detokenizer skips anyway) are not fed to it, so a run of them does not widen its window,
and ``release`` moves a cursor over the tokens that carry text instead of scanning back over
the ones that do not (a scan back over them made long replies of skipped tokens quadratic;
docs/benchmarks.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from aioengine.messages import TokenLogprob


class TokenSpans:
    """One choice: the logprob entries that its text released so far covers, each once."""

    __slots__ = ("_carriers", "_detok", "_length", "_next_carrier", "_released", "_skipped",
                 "_specials", "_starts", "_tokenizer")

    def __init__(self, tokenizer: Any, prompt_token_ids: Sequence[int]) -> None:
        self._tokenizer = tokenizer
        self._detok = tokenizer.detokenizer(list(prompt_token_ids), True)
        # What ``skip_special_tokens`` leaves out of the text.
        self._specials = frozenset(i for i, added in tokenizer.hf.get_added_tokens_decoder()
                                   .items() if added.special)
        self._starts: list[int] = []  # offset in the text where each token's share begins
        self._skipped: list[bool] = []  # a special token the text leaves out
        self._carriers: list[int] = []  # the tokens whose share is not empty, in order
        self._next_carrier = 0  # carriers before this one start inside the released text
        self._length = 0  # characters the shares add up to
        self._released = 0  # tokens already handed out (or passed over)

    def add(self, token_ids: Sequence[int]) -> None:
        """The choice's new tokens, in order."""
        for tok in token_ids:
            special = tok in self._specials
            # The text skips a special token: the detokenizer would only keep it in its window.
            piece = "" if special else self._detok.step([tok])
            self._starts.append(self._length)
            self._skipped.append(special or (not piece and not self._tokenizer.decode([tok])))
            if piece:
                self._carriers.append(len(self._starts) - 1)
            self._length += len(piece)

    def finish(self) -> None:
        """The choice ended: a character still held back (an incomplete UTF-8 sequence) is
        the last token's share."""
        piece = self._detok.flush()
        if piece and self._starts:
            last = len(self._starts) - 1
            if not self._carriers or self._carriers[-1] != last:
                self._carriers.append(last)
            self._length += len(piece)

    def release(self, text_length: int, logprobs: Sequence[TokenLogprob]
                ) -> list[tuple[TokenLogprob, int]]:
        """The entries newly covered by the first ``text_length`` characters of the text, with
        each token's offset in it. ``logprobs`` holds one entry per token added so far."""
        carriers, starts = self._carriers, self._starts
        while (self._next_carrier < len(carriers)
               and starts[carriers[self._next_carrier]] < text_length):
            self._next_carrier += 1
        # Up to the last token that adds text starting inside it (and the ones before it).
        covered = carriers[self._next_carrier - 1] + 1 if self._next_carrier else 0
        covered = max(covered, self._released)
        out = [(logprobs[i], starts[i]) for i in range(self._released, covered)
               if not self._skipped[i]]
        self._released = covered
        return out
