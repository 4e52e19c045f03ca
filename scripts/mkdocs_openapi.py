"""mkdocs hook: fill docs/api.md's ``<!-- openapi -->`` marker with the server's OpenAPI
document rendered as Markdown (``aioengine.server.openapi.openapi_markdown``), so the page is
built from the same structs the server decodes with and cannot drift."""

from __future__ import annotations

from typing import Any

MARKER = "<!-- openapi -->"


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    if page.file.src_uri != "api.md":
        return markdown
    from aioengine.server.openapi import openapi_markdown

    return markdown.replace(MARKER, openapi_markdown())
