"""Llama 3.1/3.2 JSON format: the reply is one or more ``{"name": ..., "parameters": {...}}``
objects (separated by ``;``), optionally after ``<|python_tag|>``; any other reply is text."""

from __future__ import annotations

import json
from typing import Any

from aioengine.server.tool_parsers.base import (
    Parsed,
    ParsedCall,
    StreamParser,
    ToolParser,
    call_from_json,
    json_rule,
)

PYTHON_TAG = "<|python_tag|>"


def parse_calls(text: str) -> list[ParsedCall] | None:
    """Every call in ``text``, or None when it is not only calls."""
    rest = text.strip()
    if rest.startswith(PYTHON_TAG):
        rest = rest[len(PYTHON_TAG):].lstrip()
    decoder = json.JSONDecoder()
    calls: list[ParsedCall] = []
    while rest:
        try:
            obj, end = decoder.raw_decode(rest)
        except ValueError:
            return None
        call = call_from_json(obj, ("parameters", "arguments"))
        if call is None:
            return None
        calls.append(call)
        rest = rest[end:].lstrip()
        if rest.startswith(";"):
            rest = rest[1:].lstrip()
    return calls or None


class Llama3JsonStream(StreamParser):
    """A reply that starts like a call (``{`` or the python tag) is held to its end; any other
    is text from its first character."""

    def __init__(self) -> None:
        self._buf = ""
        self._mode: str | None = None  # None: undecided, "text", "call"

    def feed(self, text: str) -> Parsed:
        if self._mode == "text":
            return Parsed(text)
        self._buf += text
        head = self._buf.lstrip()
        if not head:
            return Parsed()
        if head.startswith("{") or head.startswith(PYTHON_TAG):
            self._mode = "call"
            return Parsed()
        if PYTHON_TAG.startswith(head):
            return Parsed()  # may still become the tag
        self._mode = "text"
        buf, self._buf = self._buf, ""
        return Parsed(buf)

    def finish(self) -> Parsed:
        buf, self._buf = self._buf, ""
        calls = parse_calls(buf) if self._mode == "call" else None
        return Parsed(calls=calls) if calls else Parsed(buf)


class Llama3JsonParser(ToolParser):
    name = "llama3_json"

    def call_grammar(self, call: dict[str, Any], parallel: bool) -> str:
        more = ' ("; " body)*' if parallel else ""
        return f"start: body{more}\nbody: {json_rule(call, 'parameters')}\n"

    def stream(self) -> StreamParser:
        return Llama3JsonStream()
