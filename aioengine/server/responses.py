"""OpenAI response bodies for chat and text completions, streamed (chunks) and whole.

``ChoiceState`` follows one choice's cumulative ``RequestOutput``s; ``ChatFormat`` and
``CompletionFormat`` turn states and deltas into the two endpoints' JSON shapes.
"""

from __future__ import annotations

import abc
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from aioengine.messages import TokenLogprob
from aioengine.server.logprob_spans import TokenSpans

TokenText = Callable[[int], str]
TokenBytes = Callable[[int], bytes]
Json = dict[str, Any]
Logprobs = list[tuple[TokenLogprob, int]]
"""Logprob entries of the tokens that make up the returned text, each with its offset there."""

TOKEN_CACHE = 1 << 16
"""Tokens whose text and bytes one app keeps for logprobs (an LRU each): a reply names the same
few thousand tokens and alternatives over and over, and each costs a decode otherwise."""


class ChoiceState:
    """One choice of a request: what was sent so far and how it ended."""

    __slots__ = ("_spans", "_tokenizer", "cached_tokens", "counts_prompt", "finish_reason",
                 "index", "logprobs", "prompt_tokens", "stop_reason", "text", "token_count")

    def __init__(self, index: int, tokenizer: Any = None, *, counts_prompt: bool = True) -> None:
        """``tokenizer``: the client's, when logprobs are wanted (None: they are not);
        ``counts_prompt``: usage counts this choice's prompt (the first choice of each prompt
        of a request)."""
        self.index = index
        self.counts_prompt = counts_prompt
        self.text = ""
        self.token_count = 0
        self.logprobs: Logprobs = []
        self.finish_reason: str | None = None
        self.stop_reason: str | int | None = None  # the stop string or token that ended it
        self.prompt_tokens = 0
        self.cached_tokens = 0
        self._tokenizer = tokenizer
        self._spans: TokenSpans | None = None

    @property
    def wants_logprobs(self) -> bool:
        return self._tokenizer is not None

    def update(self, out: Any) -> tuple[str, Logprobs]:
        """Take one output; return the new text and the logprobs of the tokens it covers."""
        new_ids = out.token_ids[self.token_count:]
        self.text = out.text
        self.token_count = len(out.token_ids)
        self.prompt_tokens = len(out.prompt_token_ids)
        self.cached_tokens = out.num_cached_tokens or 0
        if out.finished:
            self.finish_reason = out.finish_reason
            self.stop_reason = out.stop_reason
        new_lp: Logprobs = []
        if self._tokenizer is not None and out.logprobs is not None:
            if self._spans is None:
                self._spans = TokenSpans(self._tokenizer, out.prompt_token_ids)
            self._spans.add(new_ids)
            if out.finished:
                self._spans.finish()
            # ``out.logprobs`` is cumulative: one per token in ``out.token_ids``.
            new_lp = self._spans.release(len(out.text), out.logprobs)
            self.logprobs.extend(new_lp)
        return out.delta_text, new_lp

    def abort(self) -> bool:
        """End a choice that was cut short; False if it had ended already."""
        if self.finish_reason is not None:
            return False
        self.finish_reason = "abort"
        return True


def usage(states: Sequence[ChoiceState]) -> Json:
    """Each prompt once (a batch of prompts: their sum), every choice's completion."""
    prompt = sum(s.prompt_tokens for s in states if s.counts_prompt)
    cached = sum(s.cached_tokens for s in states if s.counts_prompt)
    completion = sum(s.token_count for s in states)
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached}}


class _Format(abc.ABC):
    object_full = ""
    object_chunk = ""
    id_prefix = ""

    def __init__(self, model: str, token_text: TokenText) -> None:
        self.model = model
        self.token_text = token_text
        self.id = self.id_prefix + uuid.uuid4().hex
        self.created = int(time.time())

    def envelope(self, obj: str, choices: list[Json]) -> Json:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model,
                "choices": choices}

    def chunk(self, choices: list[Json], include_usage: bool) -> Json:
        body = self.envelope(self.object_chunk, choices)
        if include_usage:
            body["usage"] = None
        return body

    def usage_chunk(self, states: Sequence[ChoiceState]) -> Json:
        body = self.envelope(self.object_chunk, [])
        body["usage"] = usage(states)
        return body

    def full(self, states: Sequence[ChoiceState]) -> Json:
        body = self.envelope(self.object_full, [self.full_choice(s) for s in states])
        body["usage"] = usage(states)
        return body

    @abc.abstractmethod
    def delta_choice(self, index: int, text: str, logprobs: Logprobs | None,
                     finish_reason: str | None) -> Json:
        """One choice of a stream chunk."""

    def delta_choices(self, index: int, text: str, logprobs: Logprobs | None,
                      finish_reason: str | None) -> list[Json]:
        """The stream chunks' choices for one output (one each; tool calls may need several,
        or none while text is held back)."""
        return [self.delta_choice(index, text, logprobs, finish_reason)]

    @abc.abstractmethod
    def full_choice(self, state: ChoiceState) -> Json:
        """One choice of a non-streamed response, in this endpoint's shape."""

    def _token(self, token_id: int) -> str:
        return self.token_text(token_id)


class ChatFormat(_Format):
    object_full = "chat.completion"
    object_chunk = "chat.completion.chunk"
    id_prefix = "chatcmpl-"

    def role_choice(self, index: int) -> Json:
        return {"index": index, "delta": {"role": "assistant", "content": ""},
                "logprobs": None, "finish_reason": None}

    def delta_choice(self, index: int, text: str, logprobs: Logprobs | None,
                     finish_reason: str | None) -> Json:
        delta = {"content": text} if text or finish_reason is None else {}
        return {"index": index, "delta": delta,
                "logprobs": self.logprobs(logprobs) if logprobs is not None else None,
                "finish_reason": finish_reason}

    def full_choice(self, state: ChoiceState) -> Json:
        return {"index": state.index, "message": {"role": "assistant", "content": state.text},
                "logprobs": self.logprobs(state.logprobs) if state.wants_logprobs else None,
                "finish_reason": state.finish_reason}

    def __init__(self, model: str, token_text: TokenText, token_bytes: TokenBytes) -> None:
        super().__init__(model, token_text)
        self.token_bytes = token_bytes

    def logprobs(self, entries: Logprobs) -> Json:
        def item(token_id: int, logprob: float) -> Json:
            # The token's own bytes: those of tokens splitting a character join into it.
            return {"token": self._token(token_id), "logprob": logprob,
                    "bytes": list(self.token_bytes(token_id))}

        return {"content": [{**item(e.token_id, e.logprob),
                             "top_logprobs": [item(t, lp) for t, lp in e.top]}
                            for e, _ in entries]}


class CompletionFormat(_Format):
    object_full = "text_completion"
    object_chunk = "text_completion"
    id_prefix = "cmpl-"

    def delta_choice(self, index: int, text: str, logprobs: Logprobs | None,
                     finish_reason: str | None) -> Json:
        return {"index": index, "text": text,
                "logprobs": self.logprobs(logprobs) if logprobs is not None else None,
                "finish_reason": finish_reason}

    def full_choice(self, state: ChoiceState) -> Json:
        return {"index": state.index, "text": state.text,
                "logprobs": self.logprobs(state.logprobs) if state.wants_logprobs else None,
                "finish_reason": state.finish_reason}

    def logprobs(self, entries: Logprobs) -> Json:
        return {"tokens": [self._token(e.token_id) for e, _ in entries],
                "token_logprobs": [e.logprob for e, _ in entries],
                "top_logprobs": [{self._token(t): lp for t, lp in e.top} for e, _ in entries],
                "text_offset": [offset for _, offset in entries]}
