"""What every tool-call parser gives: the calls a model wrote in its own format, found in the
whole reply (``extract``) or while it streams (``stream``, which holds back text that may turn
out to be the start of a call)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ParsedCall:
    """One function call: the name and the arguments as JSON text (an object)."""

    name: str
    arguments: str


@dataclass
class Parsed:
    """Text to show as content, and the calls found (in order)."""

    content: str = ""
    calls: list[ParsedCall] | None = None

    def add(self, other: Parsed) -> None:
        self.content += other.content
        if other.calls:
            self.calls = [*(self.calls or []), *other.calls]


class StreamParser:
    """One reply's parser while it streams: ``feed`` each new piece of text, then ``finish``."""

    def feed(self, text: str) -> Parsed:  # pragma: no cover - interface
        raise NotImplementedError

    def finish(self) -> Parsed:  # pragma: no cover - interface
        raise NotImplementedError


class ToolParser:
    """A model family's tool-call format; subclasses register themselves by ``name``."""

    name = ""

    def stream(self) -> StreamParser:  # pragma: no cover - interface
        raise NotImplementedError

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
