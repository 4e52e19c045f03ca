"""Hermes / Qwen format: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, any number,
with free text around them (Qwen2.5, Qwen3, Hermes 2/3, and the fallback prompt that servers
for templates which do not know tools)."""

from __future__ import annotations

import json
import re
from typing import Any

from aioengine.server.tool_parsers.base import (
    CallDelta,
    Parsed,
    ParsedCall,
    StreamParser,
    ToolParser,
    call_from_json,
    held_prefix,
    json_rule,
)

START = "<tool_call>"
END = "</tool_call>"


# A call's head when it names the function first, as the format (and our grammar) does: from
# there on its arguments object is streamed as the model writes it.
_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"arguments"\s*:\s*(?=\{)')


class HermesStream(StreamParser):
    def __init__(self) -> None:
        self._buf = ""
        self._inside = False
        self._calls = 0
        self._started = 0  # calls whose start was sent
        self._args: _ObjectScan | None = None  # the arguments of the call being streamed
        self._name = ""  # its function

    def feed(self, text: str) -> Parsed:
        self._buf += text
        out = Parsed(deltas=[])
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
            out.add(self._stream_arguments())
            at = self._buf.find(END)
            if at < 0:
                return out
            out.add(self._body(self._buf[:at], closed=True))
            self._buf = self._buf[at + len(END):]
            self._inside = False
            self._args = None

    def finish(self) -> Parsed:
        """A call cut off before ``</tool_call>`` (a stop string, or the end of the reply)
        still counts when its JSON is whole; otherwise it is shown as text."""
        buf, self._buf = self._buf, ""
        if self._inside:
            self._inside = False
            out = self._body(buf, closed=False)
            self._args = None
            return out
        return Parsed(self._content(buf), deltas=[])

    def _stream_arguments(self) -> Parsed:
        """Send the start of the call once its name is known, then its arguments as they come
        (up to the object's closing brace)."""
        deltas: list[CallDelta] = []
        if self._args is None:
            head = _HEAD.match(self._buf)
            if head is None:
                return Parsed(deltas=deltas)
            self._args = _ObjectScan(head.end())
            self._name = json.loads(head.group(1))
            deltas.append(CallDelta(self._started, self._name, ""))
            self._started += 1
        # Never past the closing tag (or what may be its start): a malformed object that does
        # not close must not swallow it.
        end = self._buf.find(END)
        limit = end if end >= 0 else len(self._buf) - held_prefix(self._buf, END)
        piece = self._args.scan(self._buf, limit)
        if piece:
            deltas.append(CallDelta(self._started - 1, None, piece))
        return Parsed(deltas=deltas)

    def _content(self, text: str) -> str:
        # Whitespace between and after calls is layout, not a message.
        return "" if self._calls and not text.strip() else text

    def _body(self, body: str, *, closed: bool) -> Parsed:
        try:
            call = call_from_json(json.loads(body))
        except ValueError:
            call = None
        streamed = self._args is not None
        if call is None and self._args is not None and closed:
            # The model named the function and closed the tag, but the JSON around the
            # arguments is off (a small model drops the last brace): the call as written,
            # its arguments as sent (a client can tell them apart: they may not parse).
            call = ParsedCall(self._name, _normalized(self._args.text(self._buf)))
        if call is None:
            # Not a call after all; a start already sent stays (its arguments are cut short).
            return Parsed(START + body + (END if closed else ""), deltas=[])
        self._calls += 1
        if streamed:
            return Parsed(calls=[call], deltas=[])
        # The name came after the arguments (or the arguments were text): sent whole.
        index = self._started
        self._started += 1
        return Parsed(calls=[call], deltas=[CallDelta(index, call.name, ""),
                                            CallDelta(index, None, call.arguments)])


def _normalized(arguments: str) -> str:
    try:
        value = json.loads(arguments)
    except ValueError:
        return arguments
    return json.dumps(value, ensure_ascii=False) if isinstance(value, dict) else arguments


class _ObjectScan:
    """Follows one JSON object in a growing buffer from ``start``; ``scan`` returns the text
    added since the last call, up to and including the object's closing brace."""

    def __init__(self, start: int) -> None:
        self._start = start
        self._pos = start
        self._depth = 0
        self._in_string = False
        self._escape = False
        self._done = False

    def text(self, buf: str) -> str:
        """All of the object seen so far."""
        return buf[self._start:self._pos]

    def scan(self, buf: str, limit: int) -> str:
        begin = self._pos
        pos = begin
        while pos < limit and not self._done:
            ch = buf[pos]
            pos += 1
            if self._in_string:
                if self._escape:
                    self._escape = False
                elif ch == "\\":
                    self._escape = True
                elif ch == '"':
                    self._in_string = False
            elif ch == '"':
                self._in_string = True
            elif ch in "{[":
                self._depth += 1
            elif ch in "}]":
                self._depth -= 1
                self._done = self._depth == 0
        self._pos = pos
        return buf[begin:pos]


class HermesParser(ToolParser):
    name = "hermes"

    def stream(self) -> StreamParser:
        return HermesStream()

    def call_grammar(self, call: dict[str, Any], parallel: bool) -> str:
        more = ' ("\\n" call)*' if parallel else ""
        return (f"start: call{more}\n"
                'call: "<tool_call>\\n" body "\\n</tool_call>"\n'
                f"body: {json_rule(call)}\n")

    def extract(self, text: str) -> Parsed:
        out = super().extract(text)
        if out.calls and not out.content.strip():
            out.content = ""
        return out
