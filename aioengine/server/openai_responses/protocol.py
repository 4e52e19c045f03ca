"""OpenAI Responses API request bodies as msgspec Structs.

``input`` items and ``tools`` arrive as JSON objects and are converted one by one
(``convert_items``, ``convert_tools``): a message item may leave out its ``type`` (the "easy
input message"), and a hosted tool this engine cannot run (``web_search``, ``file_search``,
...) is skipped rather than refused, so the top-level decode cannot be one tagged union. Each
conversion's error names its path (``input[2].call_id``). Content parts are a tagged union on
``type``: an unknown part type is a 400 naming it.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, TypeVar

import msgspec
from msgspec import Meta

from aioengine.server.errors import ApiError, from_decode_error

PositiveInt = Annotated[int, Meta(ge=1)]
NonEmpty = Annotated[str, Meta(min_length=1)]
T = TypeVar("T")


class InputText(msgspec.Struct, tag_field="type", tag="input_text", forbid_unknown_fields=True):
    text: str


class OutputText(msgspec.Struct, tag_field="type", tag="output_text",
                 forbid_unknown_fields=True):
    """An assistant's text replayed (a previous response's output item)."""

    text: str
    annotations: list[Any] | None = None
    logprobs: list[Any] | None = None


class SummaryText(msgspec.Struct, tag_field="type", tag="summary_text",
                  forbid_unknown_fields=True):
    text: str


class ReasoningText(msgspec.Struct, tag_field="type", tag="reasoning_text",
                    forbid_unknown_fields=True):
    text: str


Part = InputText | OutputText


class MessageItem(msgspec.Struct, forbid_unknown_fields=True):
    role: Literal["user", "developer", "system", "assistant"]
    content: str | list[Part]
    type: Literal["message"] = "message"
    id: str | None = None
    status: str | None = None


class FunctionCallItem(msgspec.Struct, forbid_unknown_fields=True):
    type: Literal["function_call"]
    call_id: NonEmpty
    name: NonEmpty
    arguments: str  # JSON text of an object
    namespace: str | None = None  # a call of a ``namespace`` tool's function
    id: str | None = None
    status: str | None = None


class FunctionCallOutputItem(msgspec.Struct, forbid_unknown_fields=True):
    type: Literal["function_call_output"]
    call_id: NonEmpty
    output: str | list[Part]
    id: str | None = None
    status: str | None = None


class ReasoningItem(msgspec.Struct, forbid_unknown_fields=True):
    """Past reasoning: accepted and dropped (templates drop past reasoning anyway)."""

    type: Literal["reasoning"]
    summary: list[SummaryText] = []
    content: list[ReasoningText] | None = None
    encrypted_content: str | None = None
    id: str | None = None
    status: str | None = None


InputItem = MessageItem | FunctionCallItem | FunctionCallOutputItem | ReasoningItem
ITEM_TYPES: dict[str, type[Any]] = {"message": MessageItem, "function_call": FunctionCallItem,
                                    "function_call_output": FunctionCallOutputItem,
                                    "reasoning": ReasoningItem}


class FunctionTool(msgspec.Struct, forbid_unknown_fields=True):
    type: Literal["function"]
    name: str
    parameters: dict[str, Any] | None = None
    description: str | None = None
    strict: bool | None = None


class NamespaceTool(msgspec.Struct, forbid_unknown_fields=True):
    """Functions grouped under a name (Codex sends MCP servers' tools so); the model sees each
    as ``<namespace>__<name>``, the reply's call names them apart again."""

    type: Literal["namespace"]
    name: NonEmpty
    tools: list[FunctionTool]
    description: str | None = None


Tool = FunctionTool | NamespaceTool
TOOL_TYPES: dict[str, type[Any]] = {"function": FunctionTool, "namespace": NamespaceTool}


class FunctionChoice(msgspec.Struct, forbid_unknown_fields=True):
    type: Literal["function"]
    name: str


class TextFormat(msgspec.Struct, forbid_unknown_fields=True):
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    schema: dict[str, Any] | None = None
    strict: bool | None = None
    description: str | None = None


class TextConfig(msgspec.Struct, forbid_unknown_fields=True):
    format: TextFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = None  # accepted, no effect


class Reasoning(msgspec.Struct, forbid_unknown_fields=True):
    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    summary: Literal["auto", "concise", "detailed", "none"] | None = None
    generate_summary: str | None = None  # the older name of ``summary``


# Accepted and listed in the ignored-fields header when set (they change nothing here).
IGNORED_FIELDS = ("include", "prompt_cache_key", "metadata", "user", "service_tier",
                  "truncation", "safety_identifier", "max_tool_calls", "stream_options",
                  "prompt_cache_retention", "top_logprobs")


class ResponsesRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """``POST /v1/responses``."""

    input: str | list[dict[str, Any]]
    model: str | None = None
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Literal["none", "auto", "required"] | FunctionChoice | None = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    reasoning: Reasoning | None = None
    max_output_tokens: PositiveInt | None = None
    temperature: Annotated[float, Meta(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[float, Meta(gt=0.0, le=1.0)] | None = None
    store: bool = True
    previous_response_id: str | None = None
    stream: bool = False
    background: Literal[False] | None = None  # background runs are not served here
    include: list[str] | None = None
    prompt_cache_key: str | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None
    service_tier: str | None = None
    truncation: Literal["auto", "disabled"] | None = None
    safety_identifier: str | None = None
    max_tool_calls: PositiveInt | None = None
    stream_options: dict[str, Any] | None = None
    prompt_cache_retention: str | None = None
    top_logprobs: Annotated[int, Meta(ge=0, le=20)] | None = None


def convert_one(raw: Any, types: dict[str, type[T]], where: str, default: str | None = None
                ) -> T | str:
    """``raw`` as the struct its ``type`` names (``default`` when it has none); a type not in
    ``types`` comes back as its name. A wrong field is a 400 naming ``where`` and the field."""
    if not isinstance(raw, dict):
        raise ApiError(400, f"{where}: expected an object, got {type(raw).__name__}",
                       param=where, code="invalid_parameter")
    kind = raw.get("type", default)
    if not isinstance(kind, str):
        raise ApiError(400, f"{where}.type: expected a string naming the {where.split('[')[0]}"
                       " item's type", param=f"{where}.type", code="invalid_parameter")
    struct = types.get(kind)
    if struct is None:
        return kind
    try:
        return msgspec.convert(raw, struct)
    except msgspec.ValidationError as e:
        # msgspec's path is relative to the item: root it at the item's place in the request.
        text = str(e).replace("`$", f"`$.{where}")
        if " - at `" not in text:
            text += f" - at `$.{where}`"
        raise from_decode_error(msgspec.ValidationError(text)) from e


def convert_items(items: list[dict[str, Any]], where: str = "input") -> list[InputItem]:
    out: list[InputItem] = []
    for i, raw in enumerate(items):
        item = convert_one(raw, ITEM_TYPES, f"{where}[{i}]", default="message")
        if isinstance(item, str):
            raise ApiError(400, f"{where}[{i}].type: unsupported input item type {item!r} "
                           f"(this server takes {', '.join(ITEM_TYPES)})",
                           param=f"{where}[{i}].type", code="invalid_parameter")
        out.append(item)
    return out


def convert_tools(tools: list[dict[str, Any]]) -> tuple[list[tuple[int, Tool]], list[str]]:
    """The tools this server runs (each with its index in ``tools``), and the types of the
    hosted ones it skipped."""
    kept: list[tuple[int, Tool]] = []
    skipped: list[str] = []
    for i, raw in enumerate(tools):
        tool = convert_one(raw, TOOL_TYPES, f"tools[{i}]")
        if isinstance(tool, str):
            skipped.append(tool)
        else:
            kept.append((i, tool))
    return kept, skipped
