"""Cross-origin requests from browsers (off unless origins are given), with aiohttp-cors:
it answers the preflight OPTIONS of every route and adds the ``Access-Control-*`` headers to
the responses, errors included, for the allowed origins only."""

from __future__ import annotations

from collections.abc import Sequence

from aiohttp import web


def enable_cors(app: web.Application, origins: Sequence[str], methods: Sequence[str],
                headers: Sequence[str], credentials: bool) -> None:
    """Allow ``origins`` (``*``: any) to call every route of ``app`` (add routes first)."""
    import aiohttp_cors

    options = aiohttp_cors.ResourceOptions(  # type: ignore[no-untyped-call]  # not annotated
        allow_credentials=credentials, expose_headers="*",
        allow_headers=tuple(headers) if headers and "*" not in headers else "*",
        allow_methods=tuple(methods) if methods and "*" not in methods else "*")
    cors = aiohttp_cors.setup(app, defaults=dict.fromkeys(origins, options))
    for route in list(app.router.routes()):
        cors.add(route)
