"""Chat templates rendered with jinja2 in the host (transformers' own path imports torch).

Mirrors what Hugging Face templates expect: a sandboxed environment with ``trim_blocks`` and
``lstrip_blocks``, the ``loopcontrols`` extension, ``raise_exception``, ``strftime_now`` and a
``tojson`` filter that keeps non-ASCII text readable.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

# jinja2 is imported where a template is compiled or rendered: the server imports this module
# before it spawns the engine, and its templates are compiled with the tokenizer, after it.

ChatMessage = Mapping[str, Any]


class ChatTemplateError(ValueError):
    """The template is missing, malformed, or rejected the conversation."""


def _raise_exception(message: str) -> None:
    raise ChatTemplateError(f"chat template rejected the conversation: {message}")


def _tojson(value: Any, indent: int | None = None, separators: Any = None,
            sort_keys: bool = False, ensure_ascii: bool = False) -> str:
    return json.dumps(value, indent=indent, separators=separators, sort_keys=sort_keys,
                      ensure_ascii=ensure_ascii)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class ChatTemplate:
    """One compiled template; ``render`` turns a conversation into the prompt text."""

    def __init__(self, source: str, *, bos_token: str | None = None,
                 eos_token: str | None = None) -> None:
        import jinja2.ext
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=[jinja2.ext.loopcontrols])
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = _strftime_now
        try:
            self._template = env.from_string(source)
        except jinja2.TemplateSyntaxError as e:
            raise ChatTemplateError(f"chat template does not compile: {e}") from e
        self.source = source
        self._bos = bos_token or ""
        self._eos = eos_token or ""

    def render(self, messages: Sequence[ChatMessage], *, add_generation_prompt: bool = True,
               tools: Sequence[Mapping[str, Any]] | None = None,
               **extra: Any) -> str:
        import jinja2

        check_messages(messages)
        try:
            return self._template.render(
                messages=[dict(m) for m in messages], add_generation_prompt=add_generation_prompt,
                tools=list(tools) if tools else None, bos_token=self._bos, eos_token=self._eos,
                **extra)
        except ChatTemplateError:
            raise
        except jinja2.TemplateError as e:
            raise ChatTemplateError(f"chat template failed to render: {e}") from e


def check_messages(messages: Sequence[ChatMessage]) -> None:
    """A conversation is a non-empty list of {"role": str, "content": str | list} mappings."""
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence) or not messages:
        raise ValueError("messages must be a non-empty list of {'role', 'content'} dicts, "
                         f"got {messages!r:.80}")
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping):
            raise ValueError(f"messages[{i}] must be a dict with 'role' and 'content', "
                             f"got {type(m).__name__}")
        role = m.get("role")
        if not isinstance(role, str) or not role:
            raise ValueError(f"messages[{i}]['role'] must be a non-empty string, got {role!r}")
        content = m.get("content")
        if content is not None and not isinstance(content, (str, list)):
            raise ValueError(f"messages[{i}]['content'] must be a string or a list of parts, "
                             f"got {type(content).__name__}")


def pick_template(value: Any, name: str | None = None) -> str | None:
    """``chat_template`` in tokenizer_config.json is a string, or a list of named templates."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, list):
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
        return named.get(name or "default") or (next(iter(named.values())) if named else None)
    raise ChatTemplateError(f"chat_template must be a string or a list, got {type(value).__name__}")
