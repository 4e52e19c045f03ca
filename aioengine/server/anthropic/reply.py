"""A Messages API reply made from the chat pipeline's: the chat format's choice (text and the
parsed ``tool_calls``) as content blocks, its finish reason as a ``stop_reason``."""

from __future__ import annotations

import json
import uuid
from typing import Any

from aioengine.server.responses import ChoiceState, Json


def message_id() -> str:
    return f"msg_{uuid.uuid4().hex[:24]}"


def tool_use_id(call_id: str) -> str:
    """The chat format's ``call_...`` id in Anthropic's ``toolu_...`` form."""
    return "toolu_" + call_id.removeprefix("call_")


def stop_reason(state: ChoiceState, finish_reason: str | None, stop_sequences: list[str]
                ) -> tuple[str, str | None]:
    """``stop_reason`` and ``stop_sequence`` for a choice that ended with ``finish_reason``
    (the chat format's: ``tool_calls`` once calls were parsed)."""
    if finish_reason == "tool_calls":
        return "tool_use", None
    if finish_reason == "length":
        return "max_tokens", None
    if finish_reason == "abort":  # cut short (server shutdown): the turn was not finished
        return "pause_turn", None
    if isinstance(state.stop_reason, str) and state.stop_reason in stop_sequences:
        return "stop_sequence", state.stop_reason
    return "end_turn", None


def usage(state: ChoiceState) -> Json:
    return {"input_tokens": state.prompt_tokens, "output_tokens": state.token_count,
            "cache_read_input_tokens": state.cached_tokens, "cache_creation_input_tokens": 0}


def tool_use_block(call: Json) -> Json:
    fn = call["function"]
    return {"type": "tool_use", "id": tool_use_id(call["id"]), "name": fn["name"],
            "input": json.loads(fn["arguments"])}


def message(msg_id: str, model: str, content: list[Json], state: ChoiceState | None,
            stop: tuple[str | None, str | None] = (None, None)) -> Json:
    return {"id": msg_id, "type": "message", "role": "assistant", "model": model,
            "content": content, "stop_reason": stop[0], "stop_sequence": stop[1],
            "usage": usage(state) if state is not None else {"input_tokens": 0,
                                                              "output_tokens": 0}}


def full_message(fmt: Any, state: ChoiceState, stop_sequences: list[str]) -> Json:
    """The whole reply, from ``fmt`` (a ``ChatFormat`` or ``ToolChatFormat``)."""
    choice = fmt.full_choice(state)
    msg = choice["message"]
    content: list[Json] = []
    if msg.get("content"):
        content.append({"type": "text", "text": msg["content"]})
    content += [tool_use_block(c) for c in msg.get("tool_calls") or []]
    stop = stop_reason(state, choice["finish_reason"], stop_sequences)
    return message(message_id(), fmt.model, content, state, stop)
