"""OpenAI request bodies as msgspec Structs: a typed decode of the JSON body validates every
field at once and names the offending one (``- at `$.messages[0].role```).

Unknown top-level fields are ignored (listed in the ``x-aioengine-ignored-fields`` header) or,
with ``--strict-request-fields``, refused; see ``unknown_fields``. Fields that would change the
output and are not implemented get a specific 400 there.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import UNSET, Meta, UnsetType

MAX_N = 16  # choices per request; each is a full engine request

NonNegInt = Annotated[int, Meta(ge=0)]
PositiveInt = Annotated[int, Meta(ge=1)]
Penalty = Annotated[float, Meta(ge=-2.0, le=2.0)]


class StreamOptions(msgspec.Struct, forbid_unknown_fields=True):
    include_usage: bool = False
    continuous_usage_stats: bool = False  # vLLM's: with include_usage, usage in every chunk


class JsonSchemaFormat(msgspec.Struct, forbid_unknown_fields=True):
    """``response_format.json_schema``: OpenAI's shape."""

    name: str = "response"
    schema: dict[str, Any] | bool | None = None
    strict: bool | None = None
    description: str | None = None


class ResponseFormat(msgspec.Struct, forbid_unknown_fields=True):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class StructuredOutputsField(msgspec.Struct, forbid_unknown_fields=True):
    """The ``structured_outputs`` extra body field, vLLM's shape (one of the first five)."""

    json: dict[str, Any] | str | None = None
    json_object: bool | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    # vLLM's options; see ``structured_fields`` for which are honoured or refused.
    disable_fallback: bool | None = None
    disable_any_whitespace: bool | None = None
    disable_additional_properties: bool | None = None
    whitespace_pattern: str | None = None
    structural_tag: Any = None


class TextPart(msgspec.Struct, tag_field="type", tag="text", forbid_unknown_fields=True):
    text: str


class FunctionCall(msgspec.Struct, forbid_unknown_fields=True):
    name: str
    arguments: str  # JSON text of an object, as OpenAI sends it


class MessageToolCall(msgspec.Struct, forbid_unknown_fields=True):
    """One call in an assistant message's ``tool_calls`` (a history replayed to the model)."""

    id: str
    function: FunctionCall
    type: Literal["function"] = "function"


class FunctionDef(msgspec.Struct, forbid_unknown_fields=True):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None  # a JSON schema; absent: no arguments
    strict: bool | None = None


class ToolDef(msgspec.Struct, forbid_unknown_fields=True):
    function: FunctionDef
    type: Literal["function"] = "function"


class FunctionName(msgspec.Struct, forbid_unknown_fields=True):
    name: str


class NamedToolChoice(msgspec.Struct, forbid_unknown_fields=True):
    function: FunctionName
    type: Literal["function"] = "function"


class ChatMessage(msgspec.Struct, forbid_unknown_fields=True):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    # UNSET (absent) and None (null) are told apart only to say which one was sent:
    # ``params.check_messages`` refuses both, as OpenAI does without tool_calls.
    content: str | Annotated[list[TextPart], Meta(min_length=1)] | UnsetType | None = UNSET
    name: str | None = None
    # An assistant's fields in OpenAI's API: null means "none" (replayed histories carry it);
    # ``params.check_messages`` refuses a value (no refusals or audio here).
    refusal: str | UnsetType | None = UNSET
    tool_calls: list[MessageToolCall] | UnsetType | None = UNSET
    tool_call_id: str | UnsetType | None = UNSET  # a 'tool' message: the call it answers
    function_call: dict[str, Any] | UnsetType | None = UNSET
    audio: dict[str, Any] | UnsetType | None = UNSET

    def as_template_dict(self) -> dict[str, str]:
        if isinstance(self.content, list):
            text = "".join(p.text for p in self.content)
        else:
            text = self.content or ""
        out = {"role": self.role, "content": text}
        if self.name is not None:
            out["name"] = self.name
        return out


class SamplingFields(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Fields shared by both endpoints; None means "the engine's default"."""

    model: str | None = None
    max_tokens: PositiveInt | None = None
    temperature: Annotated[float, Meta(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[float, Meta(gt=0.0, le=1.0)] | None = None
    top_k: Annotated[int, Meta(ge=-1)] | None = None
    min_p: Annotated[float, Meta(ge=0.0, le=1.0)] | None = None
    repetition_penalty: Annotated[float, Meta(gt=0.0, le=100.0)] | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    seed: Annotated[int, Meta(ge=0, le=2**63 - 1)] | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[NonNegInt] | None = None
    ignore_eos: bool = False
    min_tokens: NonNegInt = 0
    n: Annotated[int, Meta(ge=1, le=MAX_N)] = 1
    user: str | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    timeout: Annotated[float, Meta(gt=0.0)] | None = None  # seconds; ours, not OpenAI's
    # Structured outputs (``structured_fields``): OpenAI's response_format, vLLM's
    # structured_outputs and its older guided_* fields; logit_bias keys are token ids.
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputsField | None = None
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    logit_bias: dict[str, float] | None = None

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    @property
    def continuous_usage(self) -> bool:
        """Usage in every streamed chunk (vLLM's ``continuous_usage_stats``)."""
        return self.include_usage and self.stream_options.continuous_usage_stats  # type: ignore


class ChatCompletionRequest(SamplingFields, kw_only=True, forbid_unknown_fields=True):
    messages: Annotated[list[ChatMessage], Meta(min_length=1)]
    max_completion_tokens: PositiveInt | None = None
    logprobs: bool = False
    top_logprobs: Annotated[int, Meta(ge=0, le=20)] | None = None
    tools: list[ToolDef] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None


class CompletionRequest(SamplingFields, kw_only=True, forbid_unknown_fields=True):
    # One string, one list of token ids, or a batch: strings or token-id lists.
    prompt: str | Annotated[list[int | str | Annotated[list[int], Meta(min_length=1)]],
                            Meta(min_length=1)]
    logprobs: Annotated[int, Meta(ge=0, le=20)] | None = None
    echo: bool = False
    suffix: str | None = None


CHAT_DECODER = msgspec.json.Decoder(ChatCompletionRequest)
COMPLETION_DECODER = msgspec.json.Decoder(CompletionRequest)
