"""Which generated tokens the returned text is made of, so ``logprobs`` describe exactly that
text: the eos (or a special stop token) that the text leaves out has no entry, nor have the
tokens of a stop string that cut the text off.

Each token's share of the text is what an incremental detokenizer (the same algorithm and left
context the client uses for the text itself) emits when the token is added; a token completing
a character split over several tokens carries the whole character, the ones before it nothing.
Token ``i`` is covered by a returned text of ``n`` characters when some token at or after ``i``
adds text starting before ``n``. A token a stop string cuts through keeps its entry (its
logprob is that of the whole token); special tokens that the text skips never get one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from aioengine.messages import TokenLogprob


class TokenSpans:
    """One choice: the logprob entries that its text released so far covers, each once."""

    __slots__ = ("_contributes", "_detok", "_length", "_released", "_skipped", "_starts",
                 "_tokenizer")

    def __init__(self, tokenizer: Any, prompt_token_ids: Sequence[int]) -> None:
        self._tokenizer = tokenizer
        self._detok = tokenizer.detokenizer(list(prompt_token_ids), True)
        self._starts: list[int] = []  # offset in the text where each token's share begins
        self._contributes: list[bool] = []  # its share is not empty
        self._skipped: list[bool] = []  # a special token the text leaves out
        self._length = 0  # characters the shares add up to
        self._released = 0  # tokens already handed out (or passed over)

    def add(self, token_ids: Sequence[int]) -> None:
        """The choice's new tokens, in order."""
        for tok in token_ids:
            piece = self._detok.step([tok])
            self._starts.append(self._length)
            self._contributes.append(bool(piece))
            self._skipped.append(not piece and not self._tokenizer.decode([tok]))
            self._length += len(piece)

    def finish(self) -> None:
        """The choice ended: a character still held back (an incomplete UTF-8 sequence) is
        the last token's share."""
        piece = self._detok.flush()
        if piece and self._starts:
            self._contributes[-1] = True
            self._length += len(piece)

    def release(self, text_length: int, logprobs: Sequence[TokenLogprob]
                ) -> list[tuple[TokenLogprob, int]]:
        """The entries newly covered by the first ``text_length`` characters of the text, with
        each token's offset in it. ``logprobs`` holds one entry per token added so far."""
        covered = self._released
        for i in range(len(self._starts) - 1, self._released - 1, -1):
            if self._contributes[i] and self._starts[i] < text_length:
                covered = i + 1
                break
        out = [(logprobs[i], self._starts[i]) for i in range(self._released, covered)
               if not self._skipped[i]]
        self._released = covered
        return out
