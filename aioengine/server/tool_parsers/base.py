"""What every tool-call parser gives: the calls a model wrote in its own format, found in the
whole reply (``extract``) or while it streams (``stream``, which holds back text that may turn
out to be the start of a call)."""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ParsedCall:
    """One function call: the name and the arguments as JSON text (an object)."""

    name: str
    arguments: str


@dataclass(frozen=True)
class CallDelta:
    """A piece of a streamed call: its start (``name`` set) or more of its arguments' text."""

    index: int
    name: str | None
    arguments: str


@dataclass
class Parsed:
    """Text to show as content, and the calls found (in order). A stream parser that sends
    calls piece by piece also fills ``deltas``; otherwise each whole call is sent at once."""

    content: str = ""
    calls: list[ParsedCall] | None = None
    deltas: list[CallDelta] | None = None

    def add(self, other: Parsed) -> None:
        self.content += other.content
        if other.calls:
            self.calls = [*(self.calls or []), *other.calls]
        if other.deltas is not None:
            self.deltas = [*(self.deltas or []), *other.deltas]


class StreamParser(ABC):
    """One reply's parser while it streams: ``feed`` each new piece of text, then ``finish``."""

    @abstractmethod
    def feed(self, text: str) -> Parsed: ...

    @abstractmethod
    def finish(self) -> Parsed: ...


class ToolParser(ABC):
    """A model family's tool-call format; subclasses register themselves by ``name``."""

    name = ""

    @abstractmethod
    def stream(self) -> StreamParser: ...

    @abstractmethod
    def call_grammar(self, call: dict[str, Any], parallel: bool) -> str:
        """A Lark grammar (llguidance's dialect) whose sentences are calls in this format.
        ``call`` is the JSON schema of one whole call object, ``{"name", "arguments"}`` (the
        keys ``extract`` reads): one object schema, or ``anyOf`` them, with ``$defs`` at its
        root. One call, or several when ``parallel``; ``required`` and named ``tool_choice``
        are served with it."""

    def extract(self, text: str) -> Parsed:
        """The whole reply at once: the same answer as streaming it in one piece."""
        parser = self.stream()
        out = parser.feed(text)
        out.add(parser.finish())
        return out


def call_from_json(obj: Any, args_keys: tuple[str, ...] = ("arguments", "parameters")
                   ) -> ParsedCall | None:
    """``{"name": str, "arguments": {...}}`` (or ``parameters``) as a call; None when ``obj``
    has another shape. Arguments given as JSON text are accepted when they hold an object."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    args: Any = {}
    for key in args_keys:
        if key in obj:
            args = obj[key]
            break
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError:
            return None
    if not isinstance(args, dict):
        return None
    return ParsedCall(obj["name"], json.dumps(args, ensure_ascii=False))


def held_prefix(text: str, marker: str) -> int:
    """How many characters at the end of ``text`` could begin ``marker`` (and so must wait)."""
    for size in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-size:]):
            return size
    return 0


# Compact JSON inside a grammar: a weak model cannot wander off into whitespace.
JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def json_rule(call: dict[str, Any], args_key: str = "arguments") -> str:
    """A Lark ``%json`` rule body for ``call`` (see ``ToolParser.call_grammar``), with the
    arguments under ``args_key``."""
    if args_key != "arguments":
        if "anyOf" in call:
            call = {**call, "anyOf": [_rename(c, args_key) for c in call["anyOf"]]}
        else:
            call = _rename(call, args_key)
    return "%json " + json.dumps({**call, "x-guidance": JSON_LAYOUT}, ensure_ascii=False)


def _rename(call: dict[str, Any], args_key: str) -> dict[str, Any]:
    props = {(args_key if k == "arguments" else k): v for k, v in call["properties"].items()}
    return {**call, "properties": props,
            "required": [args_key if k == "arguments" else k for k in call["required"]]}
