"""Tools and tool calls rendered for the chat template: Hugging Face's message shapes for a
template that mentions ``tools``, the Hermes format written into plain messages for any other."""

from __future__ import annotations

import json
from typing import Any

from aioengine.server.protocol import ChatMessage
from aioengine.server.responses import Json

NO_ARGUMENTS: dict[str, Any] = {"type": "object", "properties": {},
                                "additionalProperties": False}


def function_dict(fn: Any) -> Json:
    out: Json = {"name": fn.name}
    if fn.description is not None:
        out["description"] = fn.description
    out["parameters"] = fn.parameters if fn.parameters is not None else NO_ARGUMENTS
    return out


def template_knows_tools(source: str | None) -> bool:
    return source is not None and "tools" in source


def chat_inputs(messages: list[ChatMessage], tools: list[Json] | None, tokenizer: Any, *,
                may_call: bool = True) -> tuple[list[Json], dict[str, Any]]:
    """The template's messages and its extra arguments (``tools`` when it renders them). With
    ``may_call`` false (``tool_choice: "none"``) a template without tools is not given the
    Hermes instructions to call them; a tool-aware one still sees the tools, as vLLM does."""
    template = getattr(tokenizer, "chat_template", None)
    knows = template_knows_tools(getattr(template, "source", None))
    described = tools if knows or may_call else None
    return template_messages(messages, described, knows), ({"tools": tools} if tools and knows
                                                           else {})


def tool_dicts(tools: list[Any] | None) -> list[Json] | None:
    """``tools`` as the template sees them (no checks: /tokenize only counts them)."""
    if not tools:
        return None
    return [{"type": "function", "function": function_dict(t.function)} for t in tools]


def template_messages(messages: list[ChatMessage], tools: list[Json] | None,
                      knows_tools: bool) -> list[Json]:
    """The conversation as chat-template dicts. A tool-aware template gets Hugging Face's
    shape (``tool_calls`` with arguments as dicts, ``tool`` messages with ``tool_call_id``);
    any other the Hermes format written into plain messages."""
    if knows_tools:
        return [_hf_message(m) for m in messages]
    out: list[Json] = []
    for m in messages:
        d: Json = m.as_template_dict()
        if m.role == "assistant" and m.tool_calls:
            blocks = [_hermes_call(c.function.name, c.function.arguments) for c in m.tool_calls]
            d["content"] = "\n".join(([d["content"]] if d["content"] else []) + blocks)
        elif m.role == "tool":
            block = f"<tool_response>\n{d['content']}\n</tool_response>"
            if out and out[-1].get("_tool_results"):
                out[-1]["content"] += "\n" + block
                continue
            d = {"role": "user", "content": block, "_tool_results": True}
        out.append(d)
    for d in out:
        d.pop("_tool_results", None)
    if tools:
        prompt = hermes_system_prompt(tools)
        if out and out[0]["role"] in ("system", "developer"):
            out[0]["content"] = (out[0]["content"] + "\n\n" + prompt).strip()
        else:
            out.insert(0, {"role": "system", "content": prompt})
    return out


def _hf_message(m: ChatMessage) -> Json:
    d: Json = m.as_template_dict()
    if m.role == "assistant" and m.tool_calls:
        d["tool_calls"] = [{"id": c.id, "type": "function",
                            "function": {"name": c.function.name,
                                         "arguments": json.loads(c.function.arguments)}}
                           for c in m.tool_calls]
    if m.role == "tool":
        d["tool_call_id"] = m.tool_call_id
    return d


def _hermes_call(name: str, arguments: str) -> str:
    call = {"name": name, "arguments": json.loads(arguments)}
    return f"<tool_call>\n{json.dumps(call, ensure_ascii=False)}\n</tool_call>"


def hermes_system_prompt(tools: list[Json]) -> str:
    """Qwen2.5's tool prompt (the Hermes format), for templates that do not render tools."""
    lines = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
    return ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
            "You are provided with function signatures within <tools></tools> XML tags:\n"
            f"<tools>\n{lines}\n</tools>\n\n"
            "For each function call, return a json object with function name and arguments "
            "within <tool_call></tool_call> XML tags:\n<tool_call>\n"
            '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>')
