"""A Responses API ``response`` object made from the chat pipeline's reply: the text as a
``message`` output item, each parsed tool call a ``function_call`` item, the finish reason as
the status (``incomplete`` with ``max_output_tokens`` when it ran out)."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from aioengine.server.errors import ApiError
from aioengine.server.responses import ChoiceState, Json


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


@dataclass
class Reply:
    """One response's identity and the request's fields it echoes."""

    model: str
    echo: Json
    namespaces: dict[str, tuple[str, str]] = field(default_factory=dict)
    id: str = field(default_factory=lambda: new_id("resp"))
    created_at: int = field(default_factory=lambda: int(time.time()))

    def body(self, status: str, output: list[Json], state: ChoiceState | None,
             finish_reason: str | None = None, error: ApiError | None = None) -> Json:
        incomplete = None
        if status == "completed" and finish_reason in _INCOMPLETE:
            status, incomplete = "incomplete", {"reason": _INCOMPLETE[finish_reason]}
        return {"id": self.id, "object": "response", "created_at": self.created_at,
                "status": status, "model": self.model, "output": output,
                "error": None if error is None else {"code": error.code or "server_error",
                                                     "message": error.message},
                "incomplete_details": incomplete,
                "usage": usage(state) if state is not None and status != "in_progress"
                else None, **self.echo}

    def call_item(self, call: Json, status: str = "completed") -> Json:
        """A chat ``tool_calls`` entry as a ``function_call`` output item."""
        fn = call["function"]
        item = {"type": "function_call", "id": "fc_" + call["id"].removeprefix("call_"),
                "call_id": call["id"], "name": fn["name"], "arguments": fn.get("arguments", ""),
                "status": status}
        if fn["name"] in self.namespaces:
            item["namespace"], item["name"] = self.namespaces[fn["name"]]
        return item

    def full(self, fmt: Any, state: ChoiceState) -> Json:
        """The whole response, from ``fmt`` (a ``ChatFormat`` or ``ToolChatFormat``)."""
        choice = fmt.full_choice(state)
        msg = choice["message"]
        output: list[Json] = []
        if msg.get("content"):
            output.append(message_item(new_id("msg"), msg["content"]))
        output += [self.call_item(c) for c in msg.get("tool_calls") or []]
        return self.body("completed", output, state, state.finish_reason)


# Chat finish reasons that leave a response incomplete, and OpenAI's reason for each.
_INCOMPLETE = {"length": "max_output_tokens", "abort": "interrupted"}


def text_part(text: str) -> Json:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def message_item(item_id: str, text: str | None, status: str = "completed") -> Json:
    return {"type": "message", "id": item_id, "status": status, "role": "assistant",
            "content": [] if text is None else [text_part(text)]}


def usage(state: ChoiceState) -> Json:
    return {"input_tokens": state.prompt_tokens,
            "input_tokens_details": {"cached_tokens": state.cached_tokens},
            "output_tokens": state.token_count,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": state.prompt_tokens + state.token_count}
