"""An Anthropic Messages request translated into the chat route's conversation model (a
``ChatCompletionRequest``): the system prompt and any ``role: "system"`` messages become one
leading system message, ``tool_use`` blocks an assistant's ``tool_calls``, ``tool_result`` blocks
``tool`` messages, tools ``function`` definitions and ``tool_choice`` its OpenAI counterpart.
Everything below (template, tool prompt, call grammar, parser, sampling) is the chat route's.

What the chat model has no place for is checked here, with Anthropic's field paths in the 400:
a block in a role that cannot hold it, a ``tool_result`` answering no earlier ``tool_use``.
Thinking blocks in the history are dropped (no reasoning parser yet; templates drop past
reasoning anyway).
"""

from __future__ import annotations

import json
from typing import Literal

from aioengine.server.anthropic.protocol import (
    AnyChoice,
    AutoChoice,
    Block,
    CountTokensRequest,
    MessagesRequest,
    NamedChoice,
    NoneChoice,
    RedactedThinkingBlock,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from aioengine.server.errors import ApiError
from aioengine.server.protocol import (
    ChatCompletionRequest,
    ChatMessage,
    FunctionCall,
    FunctionDef,
    FunctionName,
    MessageToolCall,
    NamedToolChoice,
    ToolDef,
)

_ALLOWED = {"user": (TextBlock, ToolResultBlock),
            "assistant": (TextBlock, ToolUseBlock, ThinkingBlock, RedactedThinkingBlock),
            "system": (TextBlock,)}
_TAGS = {TextBlock: "text", ToolUseBlock: "tool_use", ToolResultBlock: "tool_result",
         ThinkingBlock: "thinking", RedactedThinkingBlock: "redacted_thinking"}


def _bad(where: str, message: str) -> ApiError:
    return ApiError(400, f"{where}: {message}", param=where, code="invalid_parameter")


def _text(content: str | list[TextBlock]) -> str:
    return content if isinstance(content, str) else "".join(b.text for b in content)


def to_chat(req: CountTokensRequest, max_tokens: int | None = None) -> ChatCompletionRequest:
    """The chat request ``req`` asks for; ``max_tokens``: the cap already applied (a
    ``MessagesRequest``'s own, at most the model's context)."""
    system = [_text(req.system)] if req.system else []
    messages: list[ChatMessage] = []
    call_ids: set[str] = set()
    for i, m in enumerate(req.messages):
        where = f"messages[{i}]"
        blocks: list[Block] = [TextBlock(m.content)] if isinstance(m.content, str) \
            else list(m.content)
        for j, b in enumerate(blocks):
            if not isinstance(b, _ALLOWED[m.role]):
                raise _bad(f"{where}.content[{j}].type", f"a '{m.role}' message cannot hold a "
                           f"'{_TAGS[type(b)]}' block")
        if m.role == "system":
            system.append(_text(blocks))  # type: ignore[arg-type]
        elif m.role == "assistant":
            messages.append(_assistant(blocks, call_ids))
        else:
            messages += _user(blocks, call_ids, where)
    if req.messages[-1].role == "assistant":
        raise _bad(f"messages[{len(req.messages) - 1}].role", "a final assistant message (a "
                   "prefill to continue) is not supported yet; end with a user message")
    if system:
        messages.insert(0, ChatMessage("system", "\n\n".join(system)))
    if not any(m.role != "system" for m in messages):
        raise _bad("messages", "needs at least one user or assistant message")
    tools = None if req.tools is None else [
        ToolDef(FunctionDef(t.name, t.description, t.input_schema)) for t in req.tools]
    choice, parallel = _tool_choice(req)
    out = ChatCompletionRequest(messages=messages, model=req.model, tools=tools,
                                tool_choice=choice, parallel_tool_calls=parallel)
    if isinstance(req, MessagesRequest):
        out.max_tokens = max_tokens or req.max_tokens
        out.stop = list(req.stop_sequences) if req.stop_sequences else None
        out.temperature, out.top_p, out.top_k = req.temperature, req.top_p, req.top_k
        out.stream = req.stream
    return out


def _assistant(blocks: list[Block], call_ids: set[str]) -> ChatMessage:
    text = "".join(b.text for b in blocks if isinstance(b, TextBlock))
    calls = [MessageToolCall(b.id, FunctionCall(b.name, json.dumps(b.input, ensure_ascii=False)))
             for b in blocks if isinstance(b, ToolUseBlock)]
    call_ids.update(c.id for c in calls)
    if calls:
        return ChatMessage("assistant", text or None, tool_calls=calls)
    return ChatMessage("assistant", text)


def _user(blocks: list[Block], call_ids: set[str], where: str) -> list[ChatMessage]:
    """Tool results first (as ``tool`` messages, in order), then the user's text if any."""
    out: list[ChatMessage] = []
    text: list[str] = []
    for j, b in enumerate(blocks):
        if isinstance(b, ToolResultBlock):
            if b.tool_use_id not in call_ids:
                raise _bad(f"{where}.content[{j}].tool_use_id",
                           f"{b.tool_use_id!r} answers no tool_use block of an earlier "
                           "assistant message")
            result = _text(b.content)
            out.append(ChatMessage("tool", f"Error: {result}" if b.is_error else result,
                                   tool_call_id=b.tool_use_id))
        elif isinstance(b, TextBlock):
            text.append(b.text)
    if text or not out:
        out.append(ChatMessage("user", "".join(text)))
    return out


def _tool_choice(req: CountTokensRequest) -> tuple[
        Literal["none", "auto", "required"] | NamedToolChoice | None, bool | None]:
    c = req.tool_choice
    if c is None:
        return None, None
    parallel = None if isinstance(c, NoneChoice) else not c.disable_parallel_tool_use
    if isinstance(c, AutoChoice):
        return "auto", parallel
    if isinstance(c, AnyChoice):
        return "required", parallel
    if isinstance(c, NamedChoice):
        return NamedToolChoice(FunctionName(c.name)), parallel
    return "none", parallel


# The chat pipeline names OpenAI's fields in its 400s; the same fields here.
_PARAMS = ((".function.parameters", ".input_schema"), (".function.name", ".name"),
           ("tool_choice.function.name", "tool_choice.name"))


def anthropic_param(err: ApiError) -> ApiError:
    """``err`` from the chat pipeline with the field named as in the Messages request."""
    for old, new in _PARAMS:
        if err.param:
            err.param = err.param.replace(old, new)
        err.message = err.message.replace(old, new)
    return err
