"""Checks on everything a caller hands to ``generate``/``chat``: every bad input becomes a
``ValueError`` naming the cause, raised before anything is sent to the engine."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from aioengine.client.chat_template import ChatMessage
from aioengine.client.tokenizer import Tokenizer
from aioengine.messages.sampling_params import SamplingParams

Prompt = str | list[int]


class PromptTypeError(TypeError, ValueError):
    """A prompt of the wrong type (bytes, a number, ...). A ``TypeError``, as Python raises for
    a wrong type, and a ``ValueError``, as every other bad input here."""


def check_params(params: SamplingParams | None, vocab_size: int) -> SamplingParams:
    if params is None:
        return SamplingParams()
    if not isinstance(params, SamplingParams):
        raise ValueError(f"params must be a SamplingParams, got {type(params).__name__}")
    # Fields may have been assigned after construction: validate again.
    params.__post_init__()
    bad = [t for t in params.stop_token_ids if t >= vocab_size]
    if bad:
        raise ValueError(f"stop_token_ids {bad} are outside the vocabulary (size {vocab_size})")
    if params.structured_outputs is not None:
        from aioengine.structured import spec_error  # llguidance, only when asked for

        error = spec_error(params.structured_outputs)
        if error:
            raise ValueError(f"structured_outputs: {error}")
    bad = [t for t in params.logit_bias or () if t >= vocab_size]
    if bad:
        raise ValueError(f"logit_bias token ids {bad} are outside the vocabulary (size "
                         f"{vocab_size})")
    return params


def check_text_fits(tokenizer: Tokenizer, text: str, max_model_len: int) -> None:
    """Refuse, before tokenizing it, a text that has more tokens than the context for sure
    (``Tokenizer.min_tokens``): a message of a few MB cost seconds of tokenizer time and
    hundreds of MB only to be refused afterwards (docs/benchmarks.md)."""
    floor = tokenizer.min_tokens(text)
    if floor > max_model_len:
        raise ValueError(f"prompt has at least {floor} tokens ({len(text)} characters), longer "
                         f"than the model's context (max_model_len={max_model_len})")


def chat_token_ids(tokenizer: Tokenizer, messages: Sequence[ChatMessage], max_model_len: int,
                   **template_kwargs: Any) -> list[int]:
    """``Tokenizer.encode_chat``, refusing a conversation that cannot fit before tokenizing
    it (the rendered text: a template may trim or drop parts of the messages)."""
    text = tokenizer.apply_chat_template(messages, **template_kwargs)
    check_text_fits(tokenizer, text, max_model_len)
    return tokenizer.encode(text, add_special_tokens=False)


def prompt_token_ids(tokenizer: Tokenizer, prompt: Prompt, max_model_len: int) -> list[int]:
    if isinstance(prompt, str):
        if not prompt:
            raise ValueError("prompt is empty")
        check_text_fits(tokenizer, prompt, max_model_len)
        ids = tokenizer.encode(prompt)
    elif isinstance(prompt, Sequence) and not isinstance(prompt, (bytes, bytearray)):
        ids = checked_token_ids(prompt, tokenizer.vocab_size, "prompt")
    else:
        raise PromptTypeError(f"prompt must be a string or a list of token ids, "
                              f"got {type(prompt).__name__}")
    if not ids:
        raise ValueError("prompt has no tokens")
    if len(ids) > max_model_len:
        raise ValueError(f"prompt has {len(ids)} tokens, longer than the model's context "
                         f"(max_model_len={max_model_len})")
    return ids


def checked_token_ids(ids: Sequence[Any], vocab: int, what: str) -> list[int]:
    """A copy of ``ids``; ValueError naming ``what`` and the position of a bad one."""
    ids = [*ids]
    for i, t in enumerate(ids):
        if not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < vocab:
            raise ValueError(f"{what} token id at position {i} must be an integer in "
                             f"[0, {vocab}), got {t!r}")
    return ids


def check_request_id(request_id: str | None, in_use: object) -> str:
    """A fresh id when None; otherwise a non-empty string not ``in`` ``in_use``."""
    if request_id is None:
        return uuid.uuid4().hex
    if not isinstance(request_id, str) or not request_id:
        raise ValueError(f"request_id must be a non-empty string, got {request_id!r}")
    if request_id in in_use:  # type: ignore[operator]
        raise ValueError(f"request_id {request_id!r} is already in use by a running request")
    return request_id


def check_priority(priority: int) -> int:
    if not isinstance(priority, int) or isinstance(priority, bool) \
            or not -(2**63) <= priority < 2**63:
        raise ValueError(f"priority must be an integer in [-2**63, 2**63) (int64 on the "
                         f"wire), got {priority!r}")
    return priority


def text_size(messages: Sequence[ChatMessage]) -> int:
    """Characters of a conversation's message contents (what templating/tokenizing costs)."""
    size = 0
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, str):
            size += len(content)
        elif isinstance(content, list):
            size += sum(len(str(part)) for part in content)
    return size
