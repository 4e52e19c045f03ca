"""Hermes / Qwen format: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, any number,
with free text around them (Qwen2.5, Qwen3, Hermes 2/3, and the fallback prompt that servers
for templates which do not know tools)."""

from __future__ import annotations

import json

from aioengine.server.tool_parsers.base import (
    Parsed,
    StreamParser,
    ToolParser,
    call_from_json,
    held_prefix,
)

START = "<tool_call>"
END = "</tool_call>"


class HermesStream(StreamParser):
    def __init__(self) -> None:
        self._buf = ""
        self._inside = False
        self._calls = 0

    def feed(self, text: str) -> Parsed:
        self._buf += text
        out = Parsed()
        while True:
            if not self._inside:
                at = self._buf.find(START)
                if at < 0:
                    keep = held_prefix(self._buf, START)
                    out.content += self._content(self._buf[:len(self._buf) - keep])
                    self._buf = self._buf[len(self._buf) - keep:]
                    return out
                out.content += self._content(self._buf[:at])
                self._buf = self._buf[at + len(START):]
                self._inside = True
            at = self._buf.find(END)
            if at < 0:
                return out
            out.add(self._body(self._buf[:at], closed=True))
            self._buf = self._buf[at + len(END):]
            self._inside = False

    def finish(self) -> Parsed:
        """A call cut off before ``</tool_call>`` (a stop string, or the end of the reply)
        still counts when its JSON is whole; otherwise it is shown as text."""
        buf, self._buf = self._buf, ""
        if self._inside:
            self._inside = False
            return self._body(buf, closed=False)
        return Parsed(self._content(buf))

    def _content(self, text: str) -> str:
        # Whitespace between and after calls is layout, not a message.
        return "" if self._calls and not text.strip() else text

    def _body(self, body: str, *, closed: bool) -> Parsed:
        try:
            call = call_from_json(json.loads(body))
        except ValueError:
            call = None
        if call is None:
            return Parsed(START + body + (END if closed else ""))
        self._calls += 1
        return Parsed(calls=[call])


class HermesParser(ToolParser):
    name = "hermes"

    def stream(self) -> StreamParser:
        return HermesStream()

    def extract(self, text: str) -> Parsed:
        out = super().extract(text)
        if out.calls and not out.content.strip():
            out.content = ""
        return out
