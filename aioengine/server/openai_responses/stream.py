"""The Responses API's event stream, made from the chat format's stream deltas::

    response.created, response.in_progress,
    (response.output_item.added,
       [response.content_part.added, response.output_text.delta*, response.output_text.done,
        response.content_part.done | response.function_call_arguments.delta*,
        response.function_call_arguments.done],
     response.output_item.done)*,
    response.completed | response.incomplete | response.failed

Text is a ``message`` item with one ``output_text`` part; each tool call a ``function_call``
item whose arguments arrive as deltas. Every event carries its ``sequence_number``. The last
event holds the whole response (with usage). While no output comes (a long prefill) an SSE
comment keeps the connection alive (the Responses API has no ping event).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec
from aiohttp import web

from aioengine.server.errors import ApiError
from aioengine.server.openai_responses.reply import Reply, message_item, new_id, text_part
from aioengine.server.responses import ChoiceState, Json

_FINAL = {"completed": "response.completed", "incomplete": "response.incomplete",
          "failed": "response.failed"}


class EventWriter:
    """Writes one response's events; keeps the output items and which one is open.
    ``on_final`` gets the final response body (to store it)."""

    def __init__(self, resp: web.StreamResponse, reply: Reply,
                 on_final: Callable[[Json], None]) -> None:
        self.resp = resp
        self._reply = reply
        self._on_final = on_final
        self._seq = 0
        self._output: list[Json] = []
        self._open: Json | None = None  # the item being written

    async def send(self, kind: str, **fields: Any) -> None:
        event = {"type": kind, "sequence_number": self._seq, **fields}
        self._seq += 1
        await self.resp.write(b"event: " + kind.encode() + b"\ndata: "
                              + msgspec.json.encode(event) + b"\n\n")

    async def start(self, state: ChoiceState) -> None:
        response = self._reply.body("in_progress", [], state)
        await self.send("response.created", response=response)
        await self.send("response.in_progress", response=response)

    async def ping(self) -> None:
        await self.resp.write(b": keep-alive\n\n")

    async def _open_item(self, item: Json) -> None:
        await self.close_item()
        self._open = item
        await self.send("response.output_item.added", output_index=len(self._output),
                        item=dict(item, content=[]) if item["type"] == "message" else item)
        if item["type"] == "message":
            await self.send("response.content_part.added", **self._where(),
                            part=text_part(""))

    def _where(self) -> Json:
        assert self._open is not None
        where = {"item_id": self._open["id"], "output_index": len(self._output)}
        if self._open["type"] == "message":
            where["content_index"] = 0
        return where

    async def close_item(self) -> None:
        item = self._open
        if item is None:
            return
        if item["type"] == "message":
            text = item["content"][0]["text"]
            await self.send("response.output_text.done", **self._where(), text=text,
                            logprobs=[])
            await self.send("response.content_part.done", **self._where(),
                            part=text_part(text))
        else:
            await self.send("response.function_call_arguments.done", **self._where(),
                            name=item["name"], arguments=item["arguments"])
        item["status"] = "completed"
        await self.send("response.output_item.done", output_index=len(self._output), item=item)
        self._output.append(item)
        self._open = None

    async def delta(self, delta: Json) -> None:
        text = delta.get("content")
        if text:
            if self._open is None or self._open["type"] != "message":
                await self._open_item(message_item(new_id("msg"), "", "in_progress"))
            assert self._open is not None
            self._open["content"][0]["text"] += text
            await self.send("response.output_text.delta", **self._where(), delta=text,
                            logprobs=[])
        for call in delta.get("tool_calls") or []:
            if "id" in call:
                header = {"id": call["id"], "function": {"name": call["function"]["name"]}}
                await self._open_item(self._reply.call_item(header, "in_progress"))
            args = call["function"].get("arguments")
            if args and self._open is not None:
                self._open["arguments"] += args
                await self.send("response.function_call_arguments.delta", **self._where(),
                                delta=args)

    async def finish(self, state: ChoiceState, finish_reason: str | None) -> None:
        await self.close_item()
        body = self._reply.body("completed", self._output, state, state.finish_reason)
        self._on_final(body)
        await self.send(_FINAL[body["status"]], response=body)

    async def error(self, err: ApiError) -> None:
        await self.close_item()
        body = self._reply.body("failed", self._output, None, error=err)
        await self.send("response.failed", response=body)
