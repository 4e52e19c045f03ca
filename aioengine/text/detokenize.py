"""Incremental detokenization, torch-free: used by the host client, the detokenizer process and
the engine (``EngineConfig.detokenize_in``).

Decoding one token at a time is wrong for byte-level BPE (a character can span tokens) and for
sentencepiece-style decoders (a token's leading space depends on what precedes it). So each step
decodes a small window ``tokens[prefix:]`` and emits what it adds beyond ``tokens[prefix:read]``;
text that ends in U+FFFD (an incomplete UTF-8 sequence) is held back until the next token
completes it, or until ``flush()`` at the end. The deltas concatenate to the full decode.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from aioengine.messages.engine_io import AddRequest, RequestDelta

if TYPE_CHECKING:
    from tokenizers import Tokenizer

REPLACEMENT = "\ufffd"
# Prompt tokens kept as left context, so the first output token decodes as it would mid-text.
PROMPT_CONTEXT = 5


def load_hf_tokenizer(path: str) -> Tokenizer:
    """Load ``tokenizer.json`` from a model directory (or the file itself)."""
    file = os.path.join(path, "tokenizer.json") if os.path.isdir(path) else path
    if not os.path.isfile(file):
        raise FileNotFoundError(f"no tokenizer.json at {file!r}")
    # imported here: every engine imports this module, and only detokenize_in="engine" loads
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(file)
    # Some files switch padding and truncation on (all-MiniLM-L6-v2's pads every input to 128
    # [PAD] ids): the engine cuts and batches inputs itself, so a text is only its tokens.
    tok.no_padding()
    tok.no_truncation()
    return tok


class IncrementalDetokenizer:
    """Turns one request's stream of token ids into text deltas."""

    __slots__ = ("_prefix", "_prefix_text", "_read", "_skip", "_tok", "_tokens")

    def __init__(self, tokenizer: Tokenizer, prompt_token_ids: list[int],
                 skip_special_tokens: bool = True) -> None:
        self._tok = tokenizer
        self._skip = skip_special_tokens
        self._tokens: list[int] = list(prompt_token_ids[-PROMPT_CONTEXT:])
        self._prefix = 0
        self._read = len(self._tokens)
        # A prompt that ends mid-character: start the window before that character.
        while self._read > 0 and self._decode(0, self._read).endswith(REPLACEMENT):
            self._read -= 1
        self._prefix_text = self._decode(0, self._read)

    def _decode(self, start: int, end: int | None = None) -> str:
        return self._tok.decode(self._tokens[start:end], skip_special_tokens=self._skip)

    def step(self, token_ids: list[int]) -> str:
        """Add tokens; return the text they complete (possibly ``""`` while held back)."""
        self._tokens.extend(token_ids)
        full = self._decode(self._prefix)
        if len(full) <= len(self._prefix_text) or full.endswith(REPLACEMENT):
            return ""
        delta = full[len(self._prefix_text):]
        self._prefix, self._read = self._read, len(self._tokens)
        self._prefix_text = self._decode(self._prefix, self._read)
        # Bound the window: older tokens are never decoded again.
        if self._prefix > 64:
            del self._tokens[:self._prefix]
            self._read -= self._prefix
            self._prefix = 0
        return delta

    def flush(self) -> str:
        """Release held-back text (the stream is over, so an incomplete character stays U+FFFD)."""
        full = self._decode(self._prefix)
        delta = full[len(self._prefix_text):] if len(full) > len(self._prefix_text) else ""
        self._prefix = self._read = len(self._tokens)
        self._prefix_text = ""
        return delta


class EngineDetokenizer:
    """Fills ``RequestDelta.new_text`` for every request of a step (``detokenize_in`` "engine"
    or "process"). Call ``add`` for each ``AddRequest`` before its first output, ``drop`` for
    requests that end without a finishing delta (aborted ones). ``add``/``drop`` may run on
    another thread than ``fill``: each touches the map with one atomic dict operation."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tok = tokenizer
        self._states: dict[str, IncrementalDetokenizer] = {}

    @classmethod
    def from_path(cls, path: str) -> EngineDetokenizer:
        return cls(load_hf_tokenizer(path))

    def __len__(self) -> int:
        return len(self._states)

    def add(self, request: AddRequest) -> None:
        self._states[request.request_id] = IncrementalDetokenizer(
            self._tok, request.prompt_token_ids, request.params.skip_special_tokens)

    def drop(self, request_ids: list[str]) -> None:
        for rid in request_ids:
            self._states.pop(rid, None)

    def fill(self, deltas: list[RequestDelta]) -> None:
        for d in deltas:
            state = self._states.get(d.request_id)
            if state is None:  # aborted meanwhile, or unknown: nothing to decode against
                continue
            text = state.step(d.new_token_ids) if d.new_token_ids else ""
            if d.finish_reason is not None:
                text += state.flush()
                self._states.pop(d.request_id, None)
            d.new_text = text
