"""A Responses API request translated into the chat route's conversation model (a
``ChatCompletionRequest``): ``instructions`` and every ``system``/``developer`` message become
one leading system message, ``function_call`` items an assistant's ``tool_calls``,
``function_call_output`` items ``tool`` messages, function tools (and a ``namespace``'s, as
``<namespace>__<name>``) ``function`` definitions, ``text.format`` the ``response_format``.
Everything below (template, tool prompt, call grammar, parser, sampling) is the chat route's.

What the chat model has no place for is checked here, with the Responses API's field paths in
the 400: a ``function_call_output`` answering no earlier ``function_call``, a part in a role
that cannot hold it. Reasoning items are dropped (no reasoning parser yet; templates drop past
reasoning anyway).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from aioengine.server.errors import ApiError
from aioengine.server.openai_responses.protocol import (
    FunctionCallItem,
    FunctionCallOutputItem,
    FunctionChoice,
    FunctionTool,
    InputItem,
    InputText,
    MessageItem,
    NamespaceTool,
    OutputText,
    Part,
    ResponsesRequest,
    convert_tools,
)
from aioengine.server.protocol import (
    ChatCompletionRequest,
    ChatMessage,
    FunctionCall,
    FunctionDef,
    FunctionName,
    JsonSchemaFormat,
    MessageToolCall,
    NamedToolChoice,
    ResponseFormat,
    ToolDef,
)

NAMESPACE_SEP = "__"


@dataclass
class Translation:
    """The chat request, and what the reply needs to speak the Responses API again."""

    chat: ChatCompletionRequest
    namespaces: dict[str, tuple[str, str]] = field(default_factory=dict)
    """The model's name of a namespaced function -> (namespace, name)."""
    tool_paths: list[str] = field(default_factory=list)
    """Each chat tool's place in the request (``tools[3].tools[1]``), for error messages."""
    skipped_tools: list[str] = field(default_factory=list)


def _bad(where: str, message: str) -> ApiError:
    return ApiError(400, f"{where}: {message}", param=where, code="invalid_parameter")


def _text(content: str | list[Part]) -> str:
    return content if isinstance(content, str) else "".join(p.text for p in content)


def to_chat(req: ResponsesRequest, items: list[InputItem], max_tokens: int | None,
            first: int = 0) -> Translation:
    """The chat request for ``items`` (a previous response's items, then this request's
    ``input``: its own start at ``first``, so paths name the request's fields)."""
    system = [req.instructions] if req.instructions else []
    messages: list[ChatMessage] = []
    call_ids: set[str] = set()
    for i, item in enumerate(items):
        where = f"input[{i - first}]" if i >= first else f"previous_response_id (item {i})"
        if isinstance(item, MessageItem):
            _check_parts(item, where)
            if item.role in ("system", "developer"):
                system.append(_text(item.content))
            else:
                messages.append(ChatMessage(item.role, _text(item.content)))
        elif isinstance(item, FunctionCallItem):
            name = f"{item.namespace}{NAMESPACE_SEP}{item.name}" if item.namespace else item.name
            call = MessageToolCall(item.call_id, FunctionCall(name, item.arguments))
            last = messages[-1] if messages else None
            if last is not None and last.role == "assistant":  # one turn: text, then calls
                last.tool_calls = [*(last.tool_calls or []), call]
                last.content = last.content or None
            else:
                messages.append(ChatMessage("assistant", None, tool_calls=[call]))
            call_ids.add(item.call_id)
        elif isinstance(item, FunctionCallOutputItem):
            if item.call_id not in call_ids:
                raise _bad(f"{where}.call_id", f"{item.call_id!r} answers no function_call "
                           "item before it")
            messages.append(ChatMessage("tool", _text(item.output),
                                        tool_call_id=item.call_id))
    if system:
        messages.insert(0, ChatMessage("system", "\n\n".join(system)))
    if not any(m.role != "system" for m in messages):
        raise _bad("input", "needs at least one user or assistant message (or a "
                   "function_call_output)")
    out = Translation(ChatCompletionRequest(
        messages=messages, model=req.model, max_tokens=max_tokens,
        temperature=req.temperature, top_p=req.top_p, stream=req.stream,
        parallel_tool_calls=req.parallel_tool_calls, response_format=_format(req)))
    _tools(req, out)
    return out


def _check_parts(item: MessageItem, where: str) -> None:
    """Input text in user, system and developer messages; output text in an assistant's."""
    if isinstance(item.content, str):
        return
    want = OutputText if item.role == "assistant" else InputText
    for j, part in enumerate(item.content):
        if not isinstance(part, want):
            got = "output_text" if isinstance(part, OutputText) else "input_text"
            raise _bad(f"{where}.content[{j}].type", f"a '{item.role}' message cannot hold "
                       f"an '{got}' part")


def _tools(req: ResponsesRequest, out: Translation) -> None:
    if req.tools is None:
        choice = req.tool_choice
        if choice is not None and choice != "none":
            raise _bad("tool_choice", f"{_choice_text(choice)} needs tools")
        return
    kept, out.skipped_tools = convert_tools(req.tools)
    defs: list[ToolDef] = []
    for i, tool in kept:
        functions: list[tuple[str, FunctionTool]] = (
            [(f"tools[{i}]", tool)] if isinstance(tool, FunctionTool) else
            [(f"tools[{i}].tools[{j}]", f) for j, f in enumerate(tool.tools)])
        for path, f in functions:
            name = f.name
            if isinstance(tool, NamespaceTool):
                name = f"{tool.name}{NAMESPACE_SEP}{f.name}"
                out.namespaces[name] = (tool.name, f.name)
            defs.append(ToolDef(FunctionDef(name, f.description, f.parameters, f.strict)))
            out.tool_paths.append(path)
    out.chat.tools = defs
    choice = req.tool_choice
    if isinstance(choice, FunctionChoice):
        out.chat.tool_choice = NamedToolChoice(FunctionName(choice.name))
    elif choice is not None:
        out.chat.tool_choice = choice
    if not defs and choice not in (None, "none", "auto"):
        raise _bad("tool_choice", f"{_choice_text(choice)} needs a function tool; this "
                   f"server skipped the hosted ones ({', '.join(out.skipped_tools)})")
    if not defs:  # only hosted tools: a plain chat
        out.chat.tools = None
        out.chat.tool_choice = None


def _choice_text(choice: str | FunctionChoice | None) -> str:
    return f"tool_choice {choice.name!r}" if isinstance(choice, FunctionChoice) \
        else f"tool_choice {choice!r}"


def _format(req: ResponsesRequest) -> ResponseFormat | None:
    fmt = req.text.format if req.text is not None else None
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return ResponseFormat("json_object")
    if fmt.schema is None:
        raise _bad("text.format.schema", "a json_schema format needs a schema")
    return ResponseFormat("json_schema", JsonSchemaFormat(
        fmt.name or "response", fmt.schema, fmt.strict, fmt.description))


_TOOL = re.compile(r"tools\[(\d+)\]\.function(\.parameters|\.name)?")
_PARAMS = (("response_format.json_schema.schema", "text.format.schema"),
           ("response_format", "text.format"), ("tool_choice.function.name", "tool_choice.name"),
           ("max_completion_tokens", "max_output_tokens"), ("max_tokens", "max_output_tokens"))


def responses_param(err: ApiError, tr: Translation) -> ApiError:
    """``err`` from the chat pipeline with the field named as in the Responses request."""
    def rename(text: str) -> str:
        text = _TOOL.sub(lambda m: tr.tool_paths[int(m.group(1))]
                         + (m.group(2) or "").replace(".function", ""), text) \
            if tr.tool_paths else text
        for old, new in _PARAMS:
            text = text.replace(old, new)
        return text

    if err.param:
        err.param = "input" if err.param == "messages" else rename(err.param)
    err.message = rename(err.message)
    return err
