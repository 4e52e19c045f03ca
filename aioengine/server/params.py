"""From a decoded OpenAI request to what the client takes: ``SamplingParams`` and the prompt."""

from __future__ import annotations

from msgspec import UNSET
from msgspec.structs import replace

from aioengine import SamplingParams
from aioengine.server.errors import ApiError, from_value_error
from aioengine.server.protocol import (
    ChatCompletionRequest,
    ChatMessage,
    CompletionRequest,
    SamplingFields,
)

_PASSTHROUGH = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty",
                "presence_penalty", "frequency_penalty", "seed")

DEFAULT_COMPLETION_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
MAX_CHOICES = 256  # prompts x n in one /v1/completions request: each is an engine request


def sampling_params(req: SamplingFields, *, max_tokens: int,
                    logprobs: int | None) -> SamplingParams:
    """Build and validate; a ``ValueError`` from ``SamplingParams`` becomes a 400 naming the
    field (e.g. ``min_tokens`` larger than ``max_tokens``)."""
    if req.stream_options is not None and not req.stream:
        raise ApiError(400, "stream_options is only allowed when stream is true",
                       param="stream_options", code="invalid_parameter")
    chosen = {name: value for name in _PASSTHROUGH
              if (value := getattr(req, name)) is not None}
    stop = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
    try:
        return SamplingParams(max_tokens=max_tokens, stop=stop,
                              stop_token_ids=list(req.stop_token_ids or []),
                              ignore_eos=req.ignore_eos, min_tokens=req.min_tokens,
                              logprobs=logprobs, **chosen)
    except ValueError as e:
        raise from_value_error(e) from e


def check_messages(messages: list[ChatMessage]) -> None:
    """OpenAI's rules for each role: every message needs content, except an assistant's that
    carries tool_calls; tool messages answer such tool_calls (``tools.check_tool_history``
    checks those links and the calls themselves)."""
    for i, m in enumerate(messages):
        _check_assistant_fields(i, m)
        if m.content is None or m.content is UNSET:
            if m.role == "assistant" and m.tool_calls:
                continue
            sent = "missing" if m.content is UNSET else "null"
            why = (" (only an assistant message with tool_calls may leave it out)"
                   if m.role == "assistant" else "")
            raise ApiError(400, f"messages[{i}]: a '{m.role}' message must have content, a "
                           f"string or a list of text parts; its content is {sent}{why}",
                           param=f"messages[{i}].content", code="missing_required_parameter")


_ASSISTANT_FIELDS = {"tool_calls": "",
                     "function_call": "this server takes tool_calls, not the deprecated "
                                      "function_call",
                     "refusal": "this server does not take an assistant's refusal",
                     "audio": "this server does not take an assistant's audio"}


def _check_assistant_fields(i: int, m: ChatMessage) -> None:
    """Null is accepted, as OpenAI does; a value is refused (tool_calls aside), and so is the
    field in a message of another role (OpenAI's other roles do not have it)."""
    for name, why in _ASSISTANT_FIELDS.items():
        value = getattr(m, name)
        if value is UNSET or (value is None and m.role == "assistant") \
                or (name == "tool_calls" and m.role == "assistant"):
            continue
        if m.role != "assistant":
            why = f"only an assistant message has it, not a '{m.role}' message"
        raise ApiError(400, f"unsupported parameter `{name}` in messages[{i}]: {why} (send "
                       "null or leave it out)", param=f"messages[{i}].{name}",
                       code="unsupported_parameter")


def chat_params(req: ChatCompletionRequest, default_max_tokens: int) -> SamplingParams:
    if req.max_tokens is not None and req.max_completion_tokens is not None \
            and req.max_tokens != req.max_completion_tokens:
        raise ApiError(400, "max_tokens and max_completion_tokens disagree "
                       f"({req.max_tokens} vs {req.max_completion_tokens}); send one of them",
                       param="max_completion_tokens")
    if req.top_logprobs is not None and not req.logprobs:
        raise ApiError(400, "top_logprobs requires logprobs to be true", param="top_logprobs")
    max_tokens = req.max_completion_tokens or req.max_tokens or default_max_tokens
    logprobs = (req.top_logprobs or 0) if req.logprobs else None
    return sampling_params(req, max_tokens=max_tokens, logprobs=logprobs)


def completion_params(req: CompletionRequest) -> SamplingParams:
    if req.echo:
        raise ApiError(400, "echo is not supported", param="echo")
    if req.suffix:
        raise ApiError(400, "suffix is not supported", param="suffix")
    return sampling_params(req, max_tokens=req.max_tokens or DEFAULT_COMPLETION_MAX_TOKENS,
                           logprobs=req.logprobs)


def completion_prompts(req: CompletionRequest) -> list[str | list[int]]:
    """The request's prompts, in order: a string, a list of token ids, or a batch (a list of
    strings or of token-id lists; each prompt gets ``n`` choices)."""
    prompt = req.prompt
    if isinstance(prompt, str):
        return [prompt]
    if all(isinstance(t, int) for t in prompt):
        return [list(prompt)]  # type: ignore[arg-type]
    if all(isinstance(t, (str, list)) for t in prompt):
        if len(prompt) * req.n > MAX_CHOICES:
            raise ApiError(400, f"{len(prompt)} prompts x n={req.n} is {len(prompt) * req.n} "
                           f"choices; at most {MAX_CHOICES} per request", param="prompt")
        return list(prompt)  # type: ignore[arg-type]
    raise ApiError(400, "prompt must be a string, a list of token ids, or a list of prompts "
                   "(strings or token-id lists); got a list mixing token ids with prompts",
                   param="prompt")


def seeded(params: SamplingParams, index: int) -> SamplingParams:
    """The ``index``-th of ``n`` choices: its own seed, so seeded choices differ from each
    other yet reproduce run to run."""
    if params.seed is None or index == 0:
        return params
    return replace(params, seed=(params.seed + index) % 2**63)
