"""Anthropic Messages API request bodies as msgspec Structs: a typed decode names the offending
field (``- at `$.messages[0].content[1].type```). Content blocks are a tagged union on
``type``, so an unknown block type is a 400 naming it.

``cache_control`` (prompt caching hints) is accepted on every block and tool and ignored: the
engine's prefix cache needs no hints. Top-level fields Anthropic defines that change nothing
here (``metadata``, ``service_tier``, ``context_management``, ...) are accepted and listed in
the ignored-fields response header by ``routes``.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

PositiveInt = Annotated[int, Meta(ge=1)]
CacheControl = dict[str, Any] | None


class TextBlock(msgspec.Struct, tag_field="type", tag="text", forbid_unknown_fields=True):
    text: str
    cache_control: CacheControl = None
    citations: list[dict[str, Any]] | None = None


class ToolUseBlock(msgspec.Struct, tag_field="type", tag="tool_use",
                   forbid_unknown_fields=True):
    id: Annotated[str, Meta(min_length=1)]
    name: Annotated[str, Meta(min_length=1)]
    input: dict[str, Any]
    cache_control: CacheControl = None


class ToolResultBlock(msgspec.Struct, tag_field="type", tag="tool_result",
                      forbid_unknown_fields=True):
    tool_use_id: Annotated[str, Meta(min_length=1)]
    content: str | list[TextBlock] = ""
    is_error: bool = False
    cache_control: CacheControl = None


class ThinkingBlock(msgspec.Struct, tag_field="type", tag="thinking",
                    forbid_unknown_fields=True):
    thinking: str
    signature: str | None = None
    cache_control: CacheControl = None


class RedactedThinkingBlock(msgspec.Struct, tag_field="type", tag="redacted_thinking",
                            forbid_unknown_fields=True):
    data: str
    cache_control: CacheControl = None


Block = TextBlock | ToolUseBlock | ToolResultBlock | ThinkingBlock | RedactedThinkingBlock


class Message(msgspec.Struct, forbid_unknown_fields=True):
    # "system": Claude Code sends one inside ``messages``; it joins the system prompt.
    role: Literal["user", "assistant", "system"]
    content: str | list[Block]


class Tool(msgspec.Struct, forbid_unknown_fields=True):
    name: str
    input_schema: dict[str, Any]
    description: str | None = None
    type: Literal["custom"] | None = None  # server tools (web_search, bash...) are not run here
    cache_control: CacheControl = None


class AutoChoice(msgspec.Struct, tag_field="type", tag="auto", forbid_unknown_fields=True):
    disable_parallel_tool_use: bool = False


class AnyChoice(msgspec.Struct, tag_field="type", tag="any", forbid_unknown_fields=True):
    disable_parallel_tool_use: bool = False


class NamedChoice(msgspec.Struct, tag_field="type", tag="tool", forbid_unknown_fields=True):
    name: str
    disable_parallel_tool_use: bool = False


class NoneChoice(msgspec.Struct, tag_field="type", tag="none", forbid_unknown_fields=True):
    pass


ToolChoice = AutoChoice | AnyChoice | NamedChoice | NoneChoice


class ThinkingEnabled(msgspec.Struct, tag_field="type", tag="enabled",
                      forbid_unknown_fields=True):
    budget_tokens: PositiveInt


class ThinkingAdaptive(msgspec.Struct, tag_field="type", tag="adaptive",
                       forbid_unknown_fields=True):
    pass


class ThinkingDisabled(msgspec.Struct, tag_field="type", tag="disabled",
                       forbid_unknown_fields=True):
    pass


Thinking = ThinkingEnabled | ThinkingAdaptive | ThinkingDisabled

# Accepted, checked for nothing but presence, and listed in the ignored-fields header.
IGNORED_FIELDS = ("metadata", "service_tier", "context_management", "output_config",
                  "container", "mcp_servers")


class CountTokensRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """``POST /v1/messages/count_tokens``: the prompt's fields of a Messages request."""

    model: str
    messages: Annotated[list[Message], Meta(min_length=1)]
    system: str | list[TextBlock] | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None
    context_management: Any = None
    output_config: Any = None
    mcp_servers: Any = None


class MessagesRequest(CountTokensRequest, kw_only=True, forbid_unknown_fields=True):
    """``POST /v1/messages``."""

    max_tokens: PositiveInt
    stop_sequences: list[str] | None = None
    stream: bool = False
    temperature: Annotated[float, Meta(ge=0.0, le=1.0)] | None = None
    top_p: Annotated[float, Meta(gt=0.0, le=1.0)] | None = None
    top_k: PositiveInt | None = None
    metadata: dict[str, Any] | None = None
    service_tier: str | None = None
    container: Any = None
