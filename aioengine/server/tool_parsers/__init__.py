"""Tool-call parsers: each reads one model family's own way of writing function calls, for
``tool_choice="auto"`` (``required`` and named choices are enforced by a grammar instead).

The server picks one with ``--tool-call-parser NAME``; add a format by subclassing
``ToolParser`` and ``StreamParser`` (see ``hermes.py``) and calling ``register``.
"""

from __future__ import annotations

from aioengine.server.tool_parsers.base import (
    CallDelta,
    Parsed,
    ParsedCall,
    StreamParser,
    ToolParser,
)
from aioengine.server.tool_parsers.hermes import HermesParser
from aioengine.server.tool_parsers.llama3_json import Llama3JsonParser

_REGISTRY: dict[str, type[ToolParser]] = {}


def register(cls: type[ToolParser]) -> type[ToolParser]:
    if not cls.name or cls.name in _REGISTRY:
        raise ValueError(f"a tool parser needs a new, non-empty name; got {cls.name!r}")
    _REGISTRY[cls.name] = cls
    return cls


def parser_names() -> list[str]:
    return sorted(_REGISTRY)


def get_parser(name: str) -> ToolParser:
    cls = _REGISTRY.get(name)
    if cls is None:
        raise ValueError(f"tool_call_parser {name!r} is not known; choose one of "
                         f"{', '.join(parser_names())}")
    return cls()


register(HermesParser)
register(Llama3JsonParser)
# Qwen's models write the Hermes format.
_REGISTRY["qwen"] = HermesParser

__all__ = ["CallDelta", "Parsed", "ParsedCall", "StreamParser", "ToolParser", "get_parser",
           "parser_names", "register"]
